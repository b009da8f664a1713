"""One workaround for torch: what it needs of torch's internals, checked once, off with one warning.

A :class:`Workaround` names the torch behaviour it works around, the torch
versions it was checked on and what the user loses without it. The first time
it is asked (:meth:`Workaround.active`) it checks that every private name it
needs is present and of the expected kind (:func:`callable_at`,
:func:`set_by_init`, :func:`bool_at`); if one is not (torch changed
underneath), it turns itself off, emits one :class:`TorchWorkaroundWarning`,
and its caller falls back to torch's public behaviour. A use that finds an
object without what the check promised calls :meth:`Workaround.turn_off`
(the same warning, once).

``PREFETCH_TORCH_WORKAROUNDS=0`` in the environment, read once when this
module is imported, turns every workaround off, without warnings. A
*required* workaround is what a feature cannot work without (parallel
fetch): it never warns; the feature refuses with :meth:`Workaround.problem`.

Invariants: a workaround decides once (under its lock, so two threads cannot
both warn) and stays off once off; :meth:`Workaround.recheck` (for tests
that patch torch) forgets the decision.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

ENV = "PREFETCH_TORCH_WORKAROUNDS"
"""The environment variable whose value ``0`` turns every workaround off."""
SWITCHED_OFF = os.environ.get(ENV, "").strip().lower() in ("0", "false", "off", "no")
"""Whether ``PREFETCH_TORCH_WORKAROUNDS`` turned every workaround off (read once, at import)."""

Need = Callable[[], "str | None"]
"""A check of one private name: ``None`` if it is as expected, else what changed."""


class TorchWorkaroundWarning(UserWarning):
    """A workaround for torch turned itself off: torch changed what it relies on.

    The message names the workaround, the torch version, the versions the
    workaround was checked on and what is lost without it. Set
    ``PREFETCH_TORCH_WORKAROUNDS=0`` to turn every workaround off without it.
    """


def torch_version() -> str:
    """The version of the torch imported (``"unknown"`` if it does not say)."""
    import torch

    return str(getattr(torch, "__version__", "unknown"))


def resolve(module: str, attribute: str) -> Any:
    """Return ``module.attribute`` (a dotted attribute path); raise AttributeError if missing."""
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


def _missing(module: str, attribute: str) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, problem)`` when ``module.attribute`` cannot be read."""
    try:
        return resolve(module, attribute), None
    except (ImportError, AttributeError) as error:
        return None, f"{module}.{attribute} is missing ({type(error).__name__}: {error})"


def callable_at(module: str, attribute: str) -> Need:
    """A need: ``module.attribute`` exists and is callable (a function, method or class)."""

    def check() -> str | None:
        value, problem = _missing(module, attribute)
        if problem is None and not callable(value):
            problem = f"{module}.{attribute} is a {type(value).__name__}, not callable"
        return problem

    return check


def bool_at(module: str, attribute: str) -> Need:
    """A need: ``module.attribute`` exists and is a ``bool``."""

    def check() -> str | None:
        value, problem = _missing(module, attribute)
        if problem is None and not isinstance(value, bool):
            problem = f"{module}.{attribute} is a {type(value).__name__}, not a bool"
        return problem

    return check


def set_by_init(module: str, cls: str, names: Sequence[str]) -> Need:
    """A need: class ``module.cls``'s own ``__init__`` sets (or reads) each of ``names``.

    Instance attributes cannot be read from the class; the names its
    ``__init__``'s code uses (``co_names``) show whether it still sets them.
    """

    def check() -> str | None:
        value, problem = _missing(module, cls)
        if problem is not None:
            return problem
        code = getattr(vars(value).get("__init__"), "__code__", None)
        if code is None:
            return f"{module}.{cls} has no __init__ of its own written in Python"
        missing = [name for name in names if name not in code.co_names]
        if missing:
            return f"{module}.{cls}.__init__ no longer sets {', '.join(missing)}"
        return None

    return check


class Workaround:
    """One workaround for torch (see the module): checked once, off with one warning.

    Args:
        name: Short name, used in the warning ("dead workers").
        works_around: The torch behaviour it works around.
        checked_on: The torch versions its tests passed on.
        when_off: What the user loses while it is off (the warning says it).
        needs: The checks of the private names it uses.
        required: A feature needs it: no warning, the feature refuses instead.

    Example:
        >>> demo = Workaround("demo", "nothing", ("2.13.0",), "nothing", [lambda: None])
        >>> demo.active() is not SWITCHED_OFF, demo.problem() is None or SWITCHED_OFF
        (True, True)
    """

    def __init__(
        self,
        name: str,
        works_around: str,
        checked_on: Sequence[str],
        when_off: str,
        needs: Sequence[Need],
        *,
        required: bool = False,
    ) -> None:
        self.name = name
        self.works_around = works_around
        self.checked_on = tuple(checked_on)
        self.when_off = when_off
        self.required = required
        self._needs = tuple(needs)
        self._lock = threading.Lock()
        self._on: bool | None = None  # None: not decided yet
        self._problem: str | None = None

    def active(self) -> bool:
        """Whether the workaround is on; the first call checks torch (and may warn once)."""
        on = self._on
        return self._decide() if on is None else on

    def problem(self) -> str | None:
        """Why the workaround is off (``None`` while it is on); checks torch first if needed."""
        self.active()
        return self._problem

    def turn_off(self, problem: str) -> None:
        """Turn off because a use found torch changed (``problem``); warns once."""
        with self._lock:
            if self._on is False:
                return
            self._on, self._problem = False, problem
        self._warn(problem)

    def recheck(self) -> None:
        """Forget the decision: the next :meth:`active` checks torch again (tests patch torch)."""
        with self._lock:
            self._on, self._problem = None, None

    def _decide(self) -> bool:
        with self._lock:
            if self._on is not None:
                return self._on
            if SWITCHED_OFF:
                self._on, self._problem = False, f"{ENV}=0 turned it off"
                return False
            problem = None
            for need in self._needs:
                try:
                    problem = need()
                except Exception as error:  # a check that cannot even run: torch changed
                    problem = f"checking it raised {type(error).__name__}: {error}"
                if problem is not None:
                    break
            self._on, self._problem = problem is None, problem
        if problem is not None:
            self._warn(problem)
        return problem is None

    def _warn(self, problem: str) -> None:
        if self.required:
            return  # the feature that needs it refuses, saying why
        message = (
            f"prefetch: the {self.name} workaround is off: torch {torch_version()} changed what "
            f"it relies on ({problem}); it was checked on torch {', '.join(self.checked_on)}. "
            f"Without it, {self.when_off}. {ENV}=0 turns every workaround for torch off, "
            "without this warning"
        )
        warnings.warn(message, TorchWorkaroundWarning, stacklevel=4)
