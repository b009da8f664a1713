"""How long a loading thread ran on a core and waited for one; how long the loop ran on one.

Linux keeps both per thread in ``/proc/thread-self/schedstat``: nanoseconds
on a CPU, and nanoseconds ready to run but waiting in the run queue for a
free core. A thread blocked on I/O, a lock or the GIL is in neither. Where
that file does not exist (another system, or a kernel without scheduler
statistics) the CPU time comes from :func:`time.thread_time` and the wait
for a core is unknown (0). Loading threads are read when they post
(:class:`ThreadClocks`), the loop's thread at hand-overs (:class:`LoopClock`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SCHEDSTAT = "/proc/thread-self/schedstat"
"""The calling thread's scheduler statistics (Linux)."""
READ_EVERY = 0.02
"""Seconds between two reads of a thread's clocks (an open and a read of a file each)."""


def thread_clocks(path: str = SCHEDSTAT) -> tuple[float, float]:
    """Return the calling thread's seconds on a core and seconds waiting for one, so far.

    Example:
        >>> running, waiting = thread_clocks()
        >>> running >= 0.0 and waiting >= 0.0
        True
        >>> thread_clocks("/nonexistent")[1]
        0.0
    """
    try:
        with open(path, "rb") as schedstat:
            fields = schedstat.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return time.thread_time(), 0.0


class ThreadClocks:
    """The latest clocks of each loading thread of an epoch, read when it posts.

    Each thread's clocks are read at most every :data:`READ_EVERY` seconds
    (the first post of a thread always reads them), and the epoch's sums move
    by the difference, so a thread's last few milliseconds before its last
    post may be missing from them. Threads are told apart by
    :func:`threading.get_ident`; a thread that starts with the number of one
    that left starts from zero.

    Example:
        >>> clocks = ThreadClocks()
        >>> clocks.read(1, now=0.0, reader=lambda: (0.5, 0.25))
        (0.5, 0.25)
        >>> clocks.read(1, now=0.001, reader=lambda: (0.9, 0.5))  # too soon: unchanged
        (0.0, 0.0)
        >>> clocks.read(1, now=0.03, reader=lambda: (0.9, 0.5))
        (0.4, 0.25)
    """

    __slots__ = ("_latest",)

    def __init__(self) -> None:
        self._latest: dict[int, tuple[float, float, float]] = {}  # thread: (at, running, waiting)

    def read(
        self,
        thread: int,
        *,
        now: float,
        reader: Callable[[], tuple[float, float]] | None = None,
    ) -> tuple[float, float]:
        """Return how much ``thread`` ran and waited for a core since its last read (on it).

        Called on the thread itself, ``now`` its ``time.perf_counter()``.
        """
        latest = self._latest.get(thread)
        if latest is not None and now - latest[0] < READ_EVERY:
            return 0.0, 0.0
        _, running, waiting = latest if latest is not None else (0.0, 0.0, 0.0)
        new_running, new_waiting = (reader or thread_clocks)()
        if new_running < running:  # a new thread with the number of one that left
            running = waiting = 0.0
        self._latest[thread] = (now, new_running, new_waiting)
        return new_running - running, new_waiting - waiting


class LoopClock:
    """The loop's thread's time on a core and waiting for one, read at hand-overs.

    Read at most every :data:`READ_EVERY` seconds. The first read (the
    epoch's first hand-over) only starts the clocks, and so does a read from
    another thread than the last: the loop's times count from its first
    item, on the thread that takes the items.

    Example:
        >>> clock = LoopClock()
        >>> clock.read(now=0.0, reader=lambda: (5.0, 1.0))  # the first item: the clocks start
        (0.0, 0.0)
        >>> clock.read(now=0.001, reader=lambda: (5.5, 1.0))  # too soon
        (0.0, 0.0)
        >>> clock.read(now=0.05, reader=lambda: (5.75, 1.5))
        (0.75, 0.5)
    """

    __slots__ = ("_at", "_running", "_thread", "_waiting")

    def __init__(self) -> None:
        self._at = self._running = self._waiting = 0.0
        self._thread: int | None = None

    def read(
        self, *, now: float, reader: Callable[[], tuple[float, float]] | None = None
    ) -> tuple[float, float]:
        """Return the calling thread's seconds on and waiting for a core since the last read."""
        thread = threading.get_ident()
        if thread == self._thread and now - self._at < READ_EVERY:
            return 0.0, 0.0
        running, waiting = (reader or thread_clocks)()
        used = (running - self._running, waiting - self._waiting)
        if thread != self._thread:
            used = (0.0, 0.0)
        self._at, self._running, self._waiting, self._thread = now, running, waiting, thread
        return used
