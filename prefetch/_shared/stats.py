"""How long a training loop waited for data: the figures every wrapper reports."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class PolicyEvent:
    """A decision of a self-tuning policy: a change of its setting, or why it held.

    ``old == new`` marks a wait the policy chose not to act on (recorded once
    per epoch and reason).

    Attributes:
        item: Items handed over in the epoch when it happened.
        seconds: Seconds since the start of the epoch.
        old: The setting before.
        new: The setting after.
        reason: Why, in words.
    """

    item: int
    seconds: float
    old: int
    new: int
    reason: str


@dataclasses.dataclass(frozen=True)
class DepthEvent(PolicyEvent):
    """A decision of ``BackgroundLoader(depth="auto")``: a change of depth, or why not.

    ``old`` and ``new`` are depths; ``old == new`` marks a wait the policy did
    not absorb (recorded once per epoch and reason), for example because the
    producer is slower than the loop on average.
    """


@dataclasses.dataclass(frozen=True)
class ThreadEvent(PolicyEvent):
    """A decision of ``fetch_threads="auto"``: a change of thread count, or why not.

    ``old`` and ``new`` are fetch thread counts; ``old == new`` marks a decision
    to hold (recorded once per epoch and reason), for example because the
    threads already use every core.
    """


@dataclasses.dataclass
class LoaderStats:
    """Counters for one epoch of a prefetching wrapper.

    ``wait_seconds`` is time the consumer (your training loop) spent inside
    ``next()`` waiting for an item that was not ready yet; ``source_seconds``
    is time spent inside the wrapped loader producing items. ``elapsed_seconds``
    runs from the start of the epoch (``iter()``) to the last item handed over,
    or to now while the epoch is still open.

    A :class:`~prefetch.BackgroundLoader` also reports its buffer: ``depth``
    (now) and ``peak_depth`` (highest this epoch), ``depth_events`` (each
    change of an adaptive depth and why), ``peak_items`` and ``peak_bytes``
    (most items, and most tensor bytes, produced and not yet consumed at
    once; bytes are counted only when a byte limit applies).

    With parallel fetch (``fetch_threads``) it also reports the threads:
    ``fetch_threads`` (now) and ``peak_fetch_threads``, ``thread_events``
    (each change of ``fetch_threads="auto"`` and why), ``fetch_seconds``
    (seconds each thread spent reading samples, one entry per thread started)
    and ``collate_seconds`` (all threads, in ``collate_fn``).

    Example:
        >>> stats = LoaderStats(items=10, wait_seconds=0.5, source_seconds=2.0,
        ...                     started=100.0, finished=102.0)
        >>> round(stats.wait_fraction, 2)
        0.25
        >>> stats.summary()
        'waited 25% of the time for data (0.50 s of 2.00 s, 10 items)'
    """

    items: int = 0
    wait_seconds: float = 0.0
    source_seconds: float = 0.0
    started: float | None = None
    finished: float | None = None
    depth: int | None = None
    peak_depth: int | None = None
    depth_events: list[DepthEvent] = dataclasses.field(default_factory=list)
    peak_items: int = 0
    peak_bytes: int = 0
    fetch_threads: int | None = None
    peak_fetch_threads: int | None = None
    thread_events: list[ThreadEvent] = dataclasses.field(default_factory=list)
    fetch_seconds: list[float] = dataclasses.field(default_factory=list)
    collate_seconds: float = 0.0

    @property
    def elapsed_seconds(self) -> float:
        """Seconds from the start of the epoch to the last hand-off (or now)."""
        if self.started is None:
            return 0.0
        end = self.finished if self.finished is not None else time.perf_counter()
        return max(end - self.started, 0.0)

    @property
    def wait_fraction(self) -> float:
        """Share of the epoch's elapsed time the consumer waited for data."""
        elapsed = self.elapsed_seconds
        return self.wait_seconds / elapsed if elapsed > 0 else 0.0

    def summary(self) -> str:
        """Return a one-line account such as ``'waited 42% of the time for data'``."""
        text = (
            f"waited {self.wait_fraction:.0%} of the time for data "
            f"({self.wait_seconds:.2f} s of {self.elapsed_seconds:.2f} s, {self.items} items)"
        )
        if self.depth is not None:
            text += f"; depth {self.depth} (peak {self.peak_depth})"
        stages = self.stage_summary()
        if stages:
            text += f"; {stages}"
        return text

    def stage_summary(self) -> str:
        """Say how busy parallel fetch's threads were, reading and collating ('' without it).

        The shares are of the threads' time (elapsed seconds times threads
        started): threads busy most of the epoch while the loop still waits
        means loading is the limit, and which of the two stages dominates.

        Example:
            >>> stats = LoaderStats(items=8, wait_seconds=1.0, started=0.0, finished=2.0,
            ...                     fetch_threads=2, fetch_seconds=[1.5, 1.5],
            ...                     collate_seconds=0.5)
            >>> stats.stage_summary()
            '2 fetch threads busy 88% of the time (reading 75%, collate_fn 12%)'
        """
        threads = len(self.fetch_seconds)
        available = self.elapsed_seconds * threads
        if self.fetch_threads is None or not threads or available <= 0:
            return ""
        reading = sum(self.fetch_seconds) / available
        collate = self.collate_seconds / available
        return (
            f"{self.fetch_threads} fetch thread{'' if self.fetch_threads == 1 else 's'} busy "
            f"{reading + collate:.0%} of the time (reading {reading:.0%}, collate_fn {collate:.0%})"
        )
