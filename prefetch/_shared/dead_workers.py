"""Shutting down a DataLoader iterator one of whose workers died: never hang.

torch's ``_MultiProcessingDataLoaderIter._shutdown_workers`` tells its
workers to leave by setting ``_workers_done_event``, a
``multiprocessing.Event``. Each worker reads that event in its loop, under
the event's lock, a semaphore shared by the processes. A worker killed by a
signal while it held that lock (``SIGKILL``, the OOM killer, a segfault)
leaves it held for good, and ``set()`` then blocks forever. torch counts on
its ``SIGCHLD`` handler to break such a hang: the handler raises in the main
thread, which is where torch's own shutdown runs. A prefetch thread that
shuts the iterator down (at the end of an epoch, or before it hands over the
worker's error) is never interrupted by that handler: it would wait forever,
with the surviving workers alive beside it.

Invariant: :func:`end_workers_after_a_death`, called before
``_shutdown_workers`` on an iterator not yet shut down, leaves it unchanged
while every worker lives; once one is dead it terminates the others, waits
for them, and replaces the done event with :class:`_AlreadySet`, so that
torch's shutdown (queues, pids, pin-memory thread) runs to its end without
touching the lock.
"""

from __future__ import annotations

from typing import Any

JOIN_SECONDS = 5.0
"""Seconds to wait for a terminated worker before killing it."""


class _AlreadySet:
    """Stands in for the workers' done event once every worker is gone."""

    def set(self) -> None:
        """Nothing is left to tell."""

    def is_set(self) -> bool:
        """Always: the workers are done."""
        return True


def end_workers_after_a_death(source: Any) -> bool:
    """If a worker of DataLoader iterator ``source`` died, end the rest without its lock.

    Returns:
        Whether a dead worker was found (and the others ended).
    """
    workers = getattr(source, "_workers", None)
    if not workers or getattr(source, "_shutdown", True):
        return False
    if all(worker.is_alive() for worker in workers):
        return False  # the usual case: torch's own shutdown
    for worker in workers:
        if worker.is_alive():
            worker.terminate()  # torch's worker handler exits at once, with status 0
    for worker in workers:
        worker.join(timeout=JOIN_SECONDS)
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=JOIN_SECONDS)
    source._workers_done_event = _AlreadySet()
    return True
