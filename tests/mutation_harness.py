"""A pytest plugin for ``make mutation`` only: mutmut's trampolines keep no argument.

mutmut (3.8.1) replaces every function of a mutated module by a trampoline
that picks the original or a mutant at each call. Its two frames,
``_trampoline_wrapper(*args)`` and ``trampoline(*args)``, keep the call's
arguments (``args``, ``call_args``) as locals, and a frame object outlives
its call when something refers to it: an error's traceback keeps the frames
it passed through *and their callers* (``f_back``). So an error held by a
test kept ``self`` alive through mutmut's frames: the
:class:`~prefetch.BackgroundIterator` whose ``__next__`` raised it, or the
``DeviceIterator`` whose ``_load_one`` caught a source error to raise it
later. The package makes sure its own frames do not (``del self`` on every
way out; see the invariants of ``prefetch/_threads/iterator.py`` and
``prefetch/_device/iterator.py``), so that dropping the iterator stops its
thread and releases its source while the error lives on; mutmut's frames
undid that. ``tests/test_background.py::TestErrors`` showed it first: its
error objects are ``parametrize`` values that live for the whole session, a
``Boom`` from the source does not end the epoch, so the first test's thread
(``prefetch-1``) waited for a ticket for ever and every later test failed the
check that no ``prefetch-`` thread outlives its test; ``mutmut run`` stopped
at "failed to collect stats. runner returned 1".

This plugin replaces mutmut's decorator factory, before the tests import
the mutated package, by one whose trampoline is a single frame that does
what mutmut's does (the ``fail`` check, the stats hit and its call context,
kept per thread in a ``threading.local`` where mutmut uses a ``ContextVar``,
the choice of the active mutant, else the original) and deletes its
arguments on every way out, as the package's own frames do, and whose code
names the mutated module's file, so that the package's search for the
user's frame (warnings point at the user's line) passes over it as over its
own frames; mutmut's trampoline, in ``site-packages``, stopped that search
(``tests/test_iteration.py::TestOneShotSources`` saw the warning point at
it). The package's frames, and every check of the suite (the thread check
included), are unchanged. Generators, coroutines and class methods keep
mutmut's own trampoline (the mutated modules have none today).

It also runs each mutant's tests fastest first (their call times in
mutmut's ``mutmut-stats.json``): mutmut stops a mutant's run at its first
failure (``-x``), so a killed mutant costs the tests before the first that
fails, and the few tests of a second or more each no longer run before the
hundreds of milliseconds ones. The suite's tests do not depend on their
order (it normally runs them shuffled, by pytest-randomly), so no verdict
changes, only when it comes.

mutmut loads it with ``-p tests.mutation_harness`` (``pytest_add_cli_args``
in ``[tool.mutmut]``); the normal suite never loads it as a plugin. To run
the tests by hand in the ``mutants/`` tree, pass the same option. It copies
mutmut 3.8.1's dispatch (``mutmut/mutation/trampoline.py``), so it refuses
another version: read that file again before moving the pin.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import threading
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import pytest

MUTMUT_VERSION = "3.8.1"
"""The mutmut whose trampoline this copies (the version ``setup.cfg`` pins)."""

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def forgetful_trampolines(original: Callable[..., Decorator]) -> Callable[..., Decorator]:
    """mutmut's decorator factory ``original``, with trampolines that hold no argument."""
    from mutmut.core import MutmutProgrammaticFailException
    from mutmut.mutation.trampoline import get_mutant_under_test
    from mutmut.stats import record_trampoline_hit
    from mutmut.utils.format_utils import mangled_name_from_mutant_name

    # The stats run's call context (the caller and the depth), per thread. mutmut keeps it
    # in a ContextVar (MutmutCallStack); its stats run died twice of a segmentation fault
    # inside ContextVar.set on a loading thread (docs/development.rst, "Mutation check").
    # A new thread starts with no caller under either (threads do not inherit a context).
    calls = threading.local()

    def choose(
        mutants: dict[str, Callable[..., Any]], module: str
    ) -> tuple[Callable[..., Any], tuple[str | None, int] | None]:
        """The function this call runs, and the stats call context to restore after it."""
        orig = mutants["_mutmut_orig"]
        active = get_mutant_under_test()
        if active == "fail":
            raise MutmutProgrammaticFailException(
                "Verifying setup. At least one test should fail if mutations cause errors."
            )
        if active == "stats":
            name = f"{orig.__module__}.{mangled_name_from_mutant_name(orig.__name__)}"
            caller, depth = getattr(calls, "context", (None, 0))
            most = int(os.environ.get("MUTMUT_DEPENDENCY_DEPTH", "-1"))
            if most != -1 and depth >= most:
                return orig, None
            record_trampoline_hit(name, caller=caller)
            calls.context = (name, depth + 1)
            return orig, (caller, depth)
        active_module, _, mutant = active.rpartition(".")
        if active_module != module:
            return orig, None
        return mutants.get(mutant, orig), None

    def wrap_in_trampoline(
        mutants_dict: dict[str, Callable[..., Any]], is_classmethod: bool = False
    ) -> Decorator:
        def decorator(function: Callable[..., Any]) -> Callable[..., Any]:
            if (
                is_classmethod
                or inspect.isgeneratorfunction(function)
                or inspect.iscoroutinefunction(function)
                or inspect.isasyncgenfunction(function)
            ):
                return original(mutants_dict, is_classmethod)(function)
            module = function.__module__

            @functools.wraps(function)
            def trampoline(*args: Any, **kwargs: Any) -> Any:
                context = None
                try:
                    target, context = choose(mutants_dict, module)
                    return target(*args, **kwargs)
                finally:
                    if context is not None:
                        calls.context = context
                    del args, kwargs  # a traceback may keep this frame (module docstring)

            # The frame counts as one of the module it stands in: the package's walk to the
            # user's frame (prefetch/_shared/user_frame.py) skips it as it skips its own.
            trampoline.__code__ = trampoline.__code__.replace(
                co_filename=function.__code__.co_filename
            )
            return trampoline

        return decorator

    wrap_in_trampoline.keeps_no_arguments = True  # type: ignore[attr-defined]
    return wrap_in_trampoline


def pytest_configure(config: pytest.Config) -> None:
    """Install the trampolines before the tests import the mutated package (once a process)."""
    installed = version("mutmut")
    if installed != MUTMUT_VERSION:
        raise pytest.UsageError(
            f"tests/mutation_harness.py copies mutmut {MUTMUT_VERSION}'s trampoline; "
            f"mutmut {installed} is installed"
        )
    from mutmut.mutation import trampoline

    if not getattr(trampoline.wrap_in_trampoline, "keeps_no_arguments", False):
        trampoline.wrap_in_trampoline = forgetful_trampolines(  # type: ignore[assignment]
            trampoline.wrap_in_trampoline
        )
    early = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.split(".")[0] == "prefetch"
        and hasattr(module, "_mutmut_mutated")
        and not getattr(module._mutmut_mutated, "keeps_no_arguments", False)
    )
    if early:
        raise pytest.UsageError(
            f"{early} imported before tests.mutation_harness: load it with "
            "-p tests.mutation_harness, as [tool.mutmut] pytest_add_cli_args does"
        )


STATS_FILE = "mutmut-stats.json"
"""mutmut's stats, in the ``mutants/`` tree it runs the tests in: each test's call time."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run a mutant's tests fastest first (module docstring); any other run keeps its order."""
    from mutmut.mutation.trampoline import get_mutant_under_test

    if get_mutant_under_test() in ("", "stats", "fail") or not os.path.exists(STATS_FILE):
        return
    with open(STATS_FILE) as stats:
        seconds = json.load(stats).get("duration_by_test", {})
    unknown = float("inf")  # a test the stats run did not time: after those it did
    items.sort(key=lambda item: seconds.get(item.nodeid, unknown))
