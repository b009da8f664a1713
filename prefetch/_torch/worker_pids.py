"""A lock around torch's record of DataLoader worker pids, when the GIL is off.

torch keeps the pids of every multi-worker DataLoader iterator's processes in
one process-wide C++ ``std::map`` with no lock of its own
(``torch/csrc/DataLoader.cpp``, torch 2.12 and 2.13). Three functions of
``torch.utils.data._utils.signal_handling`` use it:

* ``_set_worker_pids``: an iterator's workers started, on the thread that
  called ``iter()`` (the training loop's, for a :class:`BackgroundLoader`);
* ``_remove_worker_pids``: its workers shut down, on the thread that drew
  its last batch (a ``prefetch-N`` thread) or that closed it;
* ``_error_if_any_worker_fails``: torch's ``SIGCHLD`` handler, on the main
  thread, each time a child process ends.

With the GIL these never run at once. On a free-threaded CPython with the GIL
off they do: a prefetch thread removing an epoch's pids while the main thread's
handler walks the map (a worker just exited), or while the next epoch adds its
own, corrupts the map and the process dies of SIGSEGV. Two threads calling
them in a loop crash torch 2.12 on 3.13t within seconds.

Invariant: once :func:`guard_worker_pids` has run with the GIL off, every call
of the three that goes through ``signal_handling`` (torch's DataLoader,
torchdata's StatefulDataLoader and torch's ``SIGCHLD`` handler all look them
up there at each call), or through a module that imported one of them by name
before, holds :data:`_LOCK`: one lock for the whole process, taken around
nothing else, so it cannot deadlock. It is re-entrant because the handler runs
on the main thread between two bytecodes, possibly inside a guarded call of
that thread (before or after its C part, never during it): the handler's call
nests there instead of waiting for itself. A forked child gets a new lock (no
other thread exists there to release the copied one).

With the GIL on, nothing is changed: the functions stay torch's own. Installing
is idempotent; each :class:`BackgroundLoader` does it when it is made, before
any of its epochs starts workers or threads. Off (:mod:`prefetch._torch`),
torch's functions are left as they are, with the GIL off too.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from prefetch._torch.workaround import Workaround, callable_at, resolve

SIGNAL_HANDLING = "torch.utils.data._utils.signal_handling"
"""The module whose functions use torch's worker-pid map."""
GUARDED = ("_set_worker_pids", "_remove_worker_pids", "_error_if_any_worker_fails")
"""The functions of ``signal_handling`` that use torch's worker-pid map."""
WORKER_PID_GUARD = Workaround(
    "worker-pid guard",
    "torch's map of DataLoader worker pids has no lock: with the GIL off, a prefetch thread "
    "and the main thread using it at once crash the process (SIGSEGV)",
    ("2.12.0",),
    "with the GIL off, a BackgroundLoader over a DataLoader with worker processes can crash "
    "the process (SIGSEGV) when a worker ends while another thread starts or stops workers",
    [callable_at(SIGNAL_HANDLING, name) for name in GUARDED],
)

_LOCK = threading.RLock()
"""Held around every guarded call (re-created in a forked child)."""
_install_lock = threading.Lock()
_installed = False


def gil_enabled() -> bool:
    """Return whether the GIL is on now (always True on an interpreter without the choice)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def guard_worker_pids() -> bool:
    """Put the three functions under one lock if the GIL is off; idempotent.

    Returns:
        Whether the guard is installed (False with the GIL on, or the
        workaround off: nothing changed).
    """
    global _installed
    if _installed:
        return True
    if gil_enabled() or not WORKER_PID_GUARD.active():
        return False
    with _install_lock:
        if not _installed:
            _install()
            _installed = True
    return True


def _install() -> None:
    """Replace each function, in ``signal_handling`` and wherever it was imported by name."""
    originals = {name: resolve(SIGNAL_HANDLING, name) for name in GUARDED}
    wrappers = {name: _guarded(function) for name, function in originals.items()}
    definition = sys.modules.get("torch._C")  # left as it is: torch's own name for them
    for module in list(sys.modules.values()):
        if module is definition or not isinstance(module, types.ModuleType):
            continue
        namespace = object.__getattribute__(module, "__dict__")  # loads no lazy module
        for name, original in originals.items():
            if namespace.get(name) is original:
                setattr(module, name, wrappers[name])
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_new_lock)


def _guarded(function: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``function`` called under :data:`_LOCK` (``__wrapped__`` is ``function``)."""

    @functools.wraps(function)
    def call_locked(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return function(*args, **kwargs)

    return call_locked


def _new_lock() -> None:
    """In a forked child: a fresh lock (a thread of the parent may have held the old one)."""
    global _LOCK
    _LOCK = threading.RLock()
