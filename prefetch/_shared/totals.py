"""A wrapper's figures summed over the epochs it ran: :class:`TotalStats`.

Each ``iter()`` of a wrapper is an epoch with its own
:class:`~prefetch.LoaderStats`. :class:`EpochTotals` keeps what a wrapper
needs to add them up without holding its epochs: the sum of the epochs that
are over, and the stats of those still open (their figures still move).

Invariants:

* **An epoch counts once it handed an item over.** An ``iter()`` whose
  iterator was dropped before its first item (a framework checking that the
  loader is iterable, a loop over an empty loader) adds nothing, not even
  to ``epochs``.
* **An epoch is over when its iterator is.** At its end, ``close()``, or
  when the iterator is collected (a loop that breaks out, or Lightning's,
  which stops at ``len(loader)``): its stats then stop moving and join the
  running total, so a wrapper keeps one running total, not every epoch.
* **Snapshots.** :attr:`~prefetch.BackgroundLoader.total_stats` returns a new
  frozen :class:`TotalStats` each time, the open epochs counted up to now.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Any

from prefetch._shared.advice import advice
from prefetch._shared.facts import LoaderFacts
from prefetch._shared.stats import BUFFER_SCALARS, SCALARS, LoaderStats, flat_scalars


def _peak(old: int | None, new: int | None) -> int | None:
    if new is None:
        return old
    return new if old is None else max(old, new)


@dataclasses.dataclass(frozen=True)
class TotalStats:
    """A wrapper's :class:`~prefetch.LoaderStats` summed over the epochs it ran.

    Read it as ``loader.total_stats``: every epoch of this wrapper in which
    the loop received at least one item, the open one included (up to now).
    Times and counts are sums; ``peak_*`` are the highest any epoch reached
    (``None`` where no epoch had the figure: ``peak_depth`` and
    ``peak_fetch_threads`` of a ``CudaPrefetcher``, which has no buffer). ``elapsed_seconds`` sums
    each epoch's time from ``iter()`` to its last item, so time spent between
    epochs (validation, checkpoints) is not in it, and ``wait_fraction`` is
    the share of the epochs' own time the loop waited. ``fetch_seconds`` is
    summed over threads and epochs, and so are the waits after each epoch's
    last item (``end_wait_seconds``) and the loading threads' time on and
    waiting for a core (``loading_cpu_seconds``,
    ``loading_core_wait_seconds``) and the loop's (``loop_cpu_seconds``,
    ``loop_core_wait_seconds``). ``facts`` and
    ``parallel_fetch_available`` are the latest epoch's. The events
    (``depth_events``, ``thread_events``) stay with each epoch's ``stats``.
    In a stack, each wrapper has its own, as with ``stats``.

    Example:
        >>> from prefetch import BackgroundLoader
        >>> loader = BackgroundLoader(range(4), depth=2)
        >>> for epoch in range(3):
        ...     for item in loader:
        ...         pass
        >>> totals = loader.total_stats
        >>> totals.epochs, totals.items, totals.peak_depth
        (3, 12, 2)
        >>> print(totals.summary())  # doctest: +ELLIPSIS
        3 epochs: waited ...% of the time for data (... s of ... s, 12 items)...; peak depth 2...
    """

    epochs: int = 0
    items: int = 0
    wait_seconds: float = 0.0
    source_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    peak_depth: int | None = None
    peak_items: int = 0
    peak_bytes: int = 0
    peak_fetch_threads: int | None = None
    fetch_seconds: float = 0.0
    collate_seconds: float = 0.0
    parallel_fetch_available: bool = False
    end_wait_seconds: float = 0.0
    loading_cpu_seconds: float = 0.0
    loading_core_wait_seconds: float = 0.0
    loop_cpu_seconds: float = 0.0
    loop_core_wait_seconds: float = 0.0
    facts: LoaderFacts = dataclasses.field(default_factory=LoaderFacts)

    @property
    def wait_fraction(self) -> float:
        """Share of the epochs' elapsed time the consumer waited for data (at most 1)."""
        elapsed = self.elapsed_seconds
        return min(self.wait_seconds / elapsed, 1.0) if elapsed > 0 else 0.0

    def plus(self, stats: LoaderStats) -> TotalStats:
        """Return these totals with the epoch ``stats`` added (unchanged if it had no item).

        Example:
            >>> from prefetch import LoaderStats, TotalStats
            >>> one = LoaderStats(items=4, wait_seconds=1.0, started=0.0, finished=2.0, depth=2,
            ...                   peak_depth=3)
            >>> TotalStats().plus(one).plus(one).plus(LoaderStats()).wait_fraction
            0.5
        """
        if not stats.items:
            return self
        return TotalStats(
            epochs=self.epochs + 1,
            items=self.items + stats.items,
            wait_seconds=self.wait_seconds + stats.wait_seconds,
            source_seconds=self.source_seconds + stats.source_seconds,
            elapsed_seconds=self.elapsed_seconds + stats.elapsed_seconds,
            peak_depth=_peak(self.peak_depth, stats.peak_depth),
            peak_items=max(self.peak_items, stats.peak_items),
            peak_bytes=max(self.peak_bytes, stats.peak_bytes),
            peak_fetch_threads=_peak(self.peak_fetch_threads, stats.peak_fetch_threads),
            fetch_seconds=self.fetch_seconds + sum(stats.fetch_seconds),
            collate_seconds=self.collate_seconds + stats.collate_seconds,
            parallel_fetch_available=stats.parallel_fetch_available,
            end_wait_seconds=self.end_wait_seconds + stats.end_wait_seconds,
            loading_cpu_seconds=self.loading_cpu_seconds + stats.loading_cpu_seconds,
            loading_core_wait_seconds=(
                self.loading_core_wait_seconds + stats.loading_core_wait_seconds
            ),
            loop_cpu_seconds=self.loop_cpu_seconds + stats.loop_cpu_seconds,
            loop_core_wait_seconds=self.loop_core_wait_seconds + stats.loop_core_wait_seconds,
            facts=stats.facts,
        )

    def summary(self) -> str:
        """Return a one-line account of all epochs, as :meth:`LoaderStats.summary` does for one."""
        text = (
            f"{self.epochs} epoch{'' if self.epochs == 1 else 's'}: waited "
            f"{self.wait_fraction:.0%} of the time for data ({self.wait_seconds:.2f} s of "
            f"{self.elapsed_seconds:.2f} s, {self.items} items)"
        )
        if self.end_wait_seconds >= 0.005:
            text += f", then {self.end_wait_seconds:.2f} s after the epochs' last items"
        if self.peak_depth is not None:
            text += f"; peak depth {self.peak_depth}"
        if self.fetch_seconds > 0:  # parallel fetch ran
            text += f"; peak fetch threads {self.peak_fetch_threads}"
        said = advice(self)
        return f"{text}; {said}" if said else text

    def scalars(self, prefix: str = "") -> dict[str, float]:
        """Return the totals as flat ``{prefix + name: value}`` floats, for any logger.

        Always ``epochs`` and the names :meth:`LoaderStats.scalars
        <prefetch.LoaderStats.scalars>` always gives; for a
        ``BackgroundLoader`` also ``peak_depth``, ``peak_fetch_threads``,
        ``peak_items``, ``peak_bytes``, ``loading_cpu_seconds``,
        ``loading_core_wait_seconds``, ``fetch_seconds`` and
        ``collate_seconds``. ``prefix`` is prepended as given.

        Example:
            >>> from prefetch import TotalStats
            >>> TotalStats(epochs=2, items=8, wait_seconds=1.0, elapsed_seconds=4.0).scalars("all/")
            ... # doctest: +NORMALIZE_WHITESPACE
            {'all/epochs': 2.0, 'all/items': 8.0, 'all/wait_seconds': 1.0,
             'all/end_wait_seconds': 0.0, 'all/loop_cpu_seconds': 0.0,
             'all/loop_core_wait_seconds': 0.0, 'all/source_seconds': 0.0,
             'all/elapsed_seconds': 4.0, 'all/wait_fraction': 0.25}
        """
        names: tuple[str, ...] = ("epochs", *SCALARS)
        if self.peak_depth is not None:
            names += ("peak_depth", "peak_fetch_threads", *BUFFER_SCALARS)
        return flat_scalars(self, names, prefix)


def _end_epoch(stats: LoaderStats) -> None:
    """Mark the epoch of a collected iterator over (its elapsed time ends at its last item)."""
    if stats.finished is None:
        stats.finished = time.perf_counter()


class EpochTotals:
    """What a wrapper keeps to sum its epochs: the finished ones' total, the open ones' stats.

    Example:
        >>> totals = EpochTotals()
        >>> totals.snapshot().epochs
        0
    """

    def __init__(self) -> None:
        self._done = TotalStats()
        self._open: list[LoaderStats] = []

    def add(self, iterator: Any) -> None:
        """Count the epoch of ``iterator`` (an ``EpochIterator``) from now on."""
        stats: LoaderStats = iterator.stats
        finalizer = weakref.finalize(iterator, _end_epoch, stats)
        finalizer.atexit = False
        self._fold()
        self._open.append(stats)

    def snapshot(self) -> TotalStats:
        """Return the totals now: the finished epochs, and the open ones up to now."""
        self._fold()
        total = self._done
        for stats in self._open:
            total = total.plus(stats)
        return total

    def _fold(self) -> None:
        """Add the epochs that finished to the running total and forget their stats."""
        still_open = []
        for stats in self._open:
            if stats.finished is None:
                still_open.append(stats)
            else:
                self._done = self._done.plus(stats)
        self._open = still_open
