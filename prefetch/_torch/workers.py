"""A multi-process DataLoader iterator's workers: shut down on time, and after one died.

Two workarounds (see :mod:`prefetch._torch`):

**worker shutdown** (:func:`shut_down_workers`). torch stops an iterator's
worker processes only when the iterator is dropped (``__del__`` calls
``_shutdown_workers``). A wrapper whose epoch ends, breaks or fails stops
them at once instead, unless they are persistent (the DataLoader reuses them
next epoch): an error handed to the loop must not keep them alive through its
traceback (pytorch #149837, "can only test a child process"). Off: the
workers end when the iterator is garbage-collected, as without prefetch.

**dead workers** (:func:`lost_a_worker`, and :func:`shut_down_workers` once
one died). A worker killed by a signal (``SIGKILL``, the OOM killer, a
segfault) can die holding a lock it shares with the other processes, and two
of torch's locks then hang for good:

* the results queue's write lock: the surviving workers can never send
  again. torch reports the death once (``RuntimeError: DataLoader worker
  ... exited unexpectedly``), marks the worker unavailable and, asked for
  the next batch, waits only for the survivors: forever. Even without the
  lock it drops the dead worker's batches and goes on. A plain loop never
  asks again (the error ends it); a prefetch thread that reads ahead would.
* the done event's lock (``_workers_done_event``, a
  ``multiprocessing.Event`` each worker reads in its loop): torch's
  ``_shutdown_workers`` sets it first, and ``set()`` blocks. torch counts on
  its ``SIGCHLD`` handler to break that hang by raising in the main thread;
  a prefetch thread that shuts the iterator down is never interrupted.
  torch's own report of the death (``_mark_worker_as_unavailable``) reads
  the event too, so a prefetch thread drawing at that moment waits for good
  (the loop still gets the error from torch's handler, but the thread stays
  behind). Not worked around: a worker is inside that read for microseconds
  of each batch, so a kill seldom lands there.

Off: the death is still reported to the loop, but the thread may read on
and wait for ever, and shutting the workers down may hang (a ``prefetch-N``
thread left behind).

Invariants:

* :func:`lost_a_worker` is true once a worker of an iterator not shut down
  has ended other than by exiting with status 0 (a worker that ran out of
  its ``IterableDataset`` shard exits 0: the iterator goes on without it).
  Callers make the error that came with the loss final: nothing draws from
  that iterator again.
* :func:`shut_down_workers` leaves the workers alone while every one lives
  (torch's own shutdown); once one has ended it terminates the others, waits
  for them, and replaces the done event with :class:`_AlreadySet`, so that
  torch's shutdown (queues, pids, pin-memory thread) runs to its end without
  the lock.
* Neither misses a worker that another thread is reaping at the same
  moment (``multiprocessing.active_children()``, torch's own check), as
  ``is_alive()`` can (its ``waitpid`` then fails, and it answers "alive"):
  whether a worker has ended is read from its sentinel. Only the exit code
  of an ended worker comes from ``multiprocessing``, which reaps it.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from typing import Any

from prefetch._torch.workaround import Workaround, callable_at, set_by_init

JOIN_SECONDS = 5.0
"""Seconds to wait for a terminated worker before killing it."""
EXIT_CODE_SECONDS = 1.0
"""Longest wait for the exit code of a worker another thread has just reaped."""
UNKNOWN_EXIT = -256
"""The exit code of a worker that ended without one known (not a status 0)."""
_MISSING = object()

_ITER = "torch.utils.data.dataloader"
WORKER_SHUTDOWN = Workaround(
    "worker shutdown",
    "torch stops a DataLoader iterator's worker processes only when the iterator is "
    "dropped, and an error's traceback can keep it alive (pytorch #149837)",
    ("2.6.0", "2.12.0", "2.13.0", "2.15.0"),
    "a DataLoader's worker processes stay alive after an epoch ends, breaks or fails "
    "until its iterator is garbage-collected",
    [
        callable_at(_ITER, "_MultiProcessingDataLoaderIter._shutdown_workers"),
        set_by_init(_ITER, "_BaseDataLoaderIter", ["_persistent_workers"]),
    ],
)
DEAD_WORKERS = Workaround(
    "dead workers",
    "a DataLoader worker killed while holding a lock shared with the other processes hangs "
    "the next batch and the workers' shutdown for good",
    ("2.6.0", "2.12.0", "2.13.0", "2.15.0"),
    "after a worker process dies the loop still gets the error, but a prefetch thread may "
    "wait for ever for the next batch or for the workers' shutdown",
    [
        set_by_init(
            _ITER,
            "_MultiProcessingDataLoaderIter",
            ["_workers", "_shutdown", "_workers_done_event"],
        )
    ],
)


class _AlreadySet:
    """Stands in for the workers' done event once every worker is gone."""

    def set(self) -> None:
        """Nothing is left to tell."""

    def is_set(self) -> bool:
        """Always: the workers are done."""
        return True


def _ended(worker: Any) -> bool:
    """Whether ``worker`` has ended: its sentinel is readable once it exits, reaped or not."""
    return bool(wait([worker.sentinel], timeout=0))


def _exit_code(worker: Any) -> int | None:
    """The exit code of ``worker`` (negative: its signal), or ``None`` while it runs.

    A worker another thread reaps at this moment has ended, and its code is
    stored on it a moment later (``exitcode`` reads ``None`` meanwhile).
    """
    if not _ended(worker):
        return None
    deadline = time.monotonic() + EXIT_CODE_SECONDS
    while (code := worker.exitcode) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    return UNKNOWN_EXIT if code is None else int(code)


def _workers_of(source: Any) -> list[Any]:
    """The worker processes of DataLoader iterator ``source`` not yet shut down, else ``[]``."""
    workers = getattr(source, "_workers", None)
    if not workers or getattr(source, "_shutdown", True) or not DEAD_WORKERS.active():
        return []
    return list(workers)


def lost_a_worker(source: Any) -> bool:
    """Whether DataLoader iterator ``source`` lost a worker, so it cannot go on (see the module).

    Always false while the dead-workers workaround is off.

    Example:
        >>> lost_a_worker(iter([1, 2]))  # not a multi-process DataLoader iterator
        False
    """
    return any(_exit_code(worker) not in (None, 0) for worker in _workers_of(source))


def _end_workers_after_a_death(source: Any) -> None:
    """If a worker of DataLoader iterator ``source`` ended, end the rest without its lock."""
    workers = _workers_of(source)
    if not any(_ended(worker) for worker in workers):
        return  # the usual case (or not a multi-process iterator): torch's own shutdown
    for worker in workers:
        if not _ended(worker):
            worker.terminate()  # torch's worker handler exits at once, with status 0
    for worker in workers:
        worker.join(timeout=JOIN_SECONDS)
        if not _ended(worker):
            worker.kill()
            worker.join(timeout=JOIN_SECONDS)
    source._workers_done_event = _AlreadySet()


def shut_down_workers(source: Any) -> bool:
    """Stop the worker processes of ``source`` if it is a multi-process DataLoader iterator.

    Persistent workers are left to the DataLoader, which reuses them; a
    worker that died no longer hangs the shutdown (see the module).

    Returns:
        Whether ``source`` is such an iterator (false for any other iterator,
        and while the worker-shutdown workaround is off: the iterator's
        ``__del__`` stops them).

    Example:
        >>> shut_down_workers(iter([1, 2]))
        False
    """
    shutdown = getattr(source, "_shutdown_workers", None)
    if not callable(shutdown) or not WORKER_SHUTDOWN.active():
        return False
    persistent = getattr(source, "_persistent_workers", _MISSING)
    if persistent is _MISSING:
        WORKER_SHUTDOWN.turn_off(f"a {type(source).__name__} has no _persistent_workers")
        return False
    if not persistent:
        _end_workers_after_a_death(source)  # a dead worker may hold the lock shutdown needs
        shutdown()
    return True
