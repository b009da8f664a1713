"""How long a training loop waited for data: the figures every wrapper reports."""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

ADVISE_WAIT = 0.1
"""Share of the time the loop waited above which a summary looks for a remedy."""
ADVISE_BUSY = 0.7
"""Share of the time the producer was busy above which it "cannot keep up"."""
ADVISE_ITEM_SECONDS = 0.001
"""Producer seconds per item below which loading in parallel would not pay its hand-offs."""


class Figures(Protocol):
    """What :func:`producer_advice` reads: one epoch's stats, or a wrapper's totals."""

    @property
    def items(self) -> int: ...

    @property
    def source_seconds(self) -> float: ...

    @property
    def parallel_fetch_available(self) -> bool: ...

    @property
    def elapsed_seconds(self) -> float: ...

    @property
    def wait_fraction(self) -> float: ...


def producer_advice(figures: Figures) -> str:
    """Return what to do when the producer cannot keep up and threads could read in parallel.

    ``parallel_fetch_available`` says whether ``fetch_threads`` can read the
    wrapped loader (a map-style ``DataLoader`` with ``num_workers=0``, read by
    one thread); the remedy is named only then, and only for a loop that
    waited at least :data:`ADVISE_WAIT` of the time on a producer busy at
    least :data:`ADVISE_BUSY` of it, at :data:`ADVISE_ITEM_SECONDS` or more
    per item.

    Example:
        >>> producer_advice(LoaderStats(items=10, wait_seconds=1.0, source_seconds=1.9,
        ...                             started=0.0, finished=2.0))
        ''
    """
    elapsed, items = figures.elapsed_seconds, figures.items
    if not figures.parallel_fetch_available or elapsed <= 0 or not items:
        return ""
    busy = figures.source_seconds / elapsed
    if figures.wait_fraction < ADVISE_WAIT or busy < ADVISE_BUSY:
        return ""
    if figures.source_seconds / items < ADVISE_ITEM_SECONDS:
        return ""
    return (
        f"the producer cannot keep up (busy {min(busy, 1.0):.0%} of the time): read the "
        "DataLoader's batches in parallel with BackgroundLoader(..., fetch_threads='auto') "
        "(threads, when loading releases the GIL) or DataLoader(num_workers=N) (processes)"
    )


SCALARS = ("items", "wait_seconds", "source_seconds", "elapsed_seconds", "wait_fraction")
"""What ``scalars()`` always gives, for one epoch or for a wrapper's totals."""
BUFFER_SCALARS = ("peak_items", "peak_bytes", "fetch_seconds", "collate_seconds")
"""What ``scalars()`` adds for a ``BackgroundLoader`` (with its depth and thread figures)."""


def flat_scalars(figures: object, names: tuple[str, ...], prefix: str) -> dict[str, float]:
    """Return the figures ``names`` of ``figures`` as floats under ``prefix + name``.

    A list (seconds per thread) is summed; a ``None`` is left out.

    Example:
        >>> flat_scalars(LoaderStats(items=3), ("items", "depth", "fetch_seconds"), "data/")
        {'data/items': 3.0, 'data/fetch_seconds': 0.0}
    """
    if not isinstance(prefix, str):
        msg = f"scalars(prefix=...) expects a str, got {prefix!r} of type {type(prefix).__name__}"
        raise TypeError(msg)
    values = {name: getattr(figures, name) for name in names}
    return {
        f"{prefix}{name}": float(sum(value) if isinstance(value, list) else value)
        for name, value in values.items()
        if value is not None
    }


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
    runs from the start of the epoch (``iter()``) to the last item handed
    over (``last_handoff``); before the first item, to the epoch's end
    (``finished``) or now. So the time after an epoch's last item never
    counts, however the epoch ends: the loop asks for more (a ``for`` loop),
    stops at ``len(loader)`` (as Lightning does), breaks out, or a wrapper
    above releases it. ``wait_fraction`` is their ratio, at most 1 (the wait
    for the end of the data, after the last item, is in ``wait_seconds``).

    A :class:`~prefetch.BackgroundLoader` also reports its buffer: ``depth``
    (now) and ``peak_depth`` (highest this epoch), ``depth_events`` (each
    change of an adaptive depth and why), ``peak_items`` and ``peak_bytes``
    (most items, and most tensor bytes, produced and not yet consumed at
    once; bytes are counted only when a byte limit applies).

    With parallel fetch (``fetch_threads``) it also reports the threads:
    ``fetch_threads`` (now) and ``peak_fetch_threads``, ``thread_events``
    (each change of ``fetch_threads="auto"`` and why), ``fetch_seconds``
    (seconds each thread spent reading samples, one entry per thread started),
    ``fetch_reads`` (reads each thread made: samples, or ``__getitems__``
    chunks), ``collate_seconds`` (all threads, in ``collate_fn``) and
    ``peak_samples`` (most samples drawn and not yet collated at once: the
    batches being read at the grain of samples).

    ``parallel_fetch_available`` is true when a ``BackgroundLoader`` read a
    map-style ``DataLoader`` with ``num_workers=0`` in one thread, so
    ``fetch_threads`` could read it in parallel: :meth:`summary` then says so
    when the producer could not keep up with the loop.

    :meth:`scalars` gives the figures as a flat ``{name: float}`` dict for a
    logger; a wrapper's :attr:`~prefetch.BackgroundLoader.total_stats` sums
    its epochs (:class:`~prefetch.TotalStats`).

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
    fetch_reads: list[int] = dataclasses.field(default_factory=list)
    peak_samples: int = 0
    parallel_fetch_available: bool = False
    last_handoff: float | None = None  # perf_counter() at the latest hand-off (see elapsed)

    @property
    def elapsed_seconds(self) -> float:
        """Seconds from the start of the epoch to its latest hand-off (or its end, or now)."""
        if self.started is None:
            return 0.0
        end = self.last_handoff if self.last_handoff is not None else self.finished
        return max((end if end is not None else time.perf_counter()) - self.started, 0.0)

    @property
    def wait_fraction(self) -> float:
        """Share of the epoch's elapsed time the consumer waited for data (at most 1)."""
        elapsed = self.elapsed_seconds
        return min(self.wait_seconds / elapsed, 1.0) if elapsed > 0 else 0.0

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
        advice = producer_advice(self)
        return f"{text}; {advice}" if advice else text

    def scalars(self, prefix: str = "") -> dict[str, float]:
        """Return the figures as flat ``{prefix + name: value}`` floats, for any logger.

        Always ``items``, ``wait_seconds``, ``source_seconds``,
        ``elapsed_seconds`` and ``wait_fraction``; for a ``BackgroundLoader``
        (which has a ``depth``) also ``depth``, ``peak_depth``, ``peak_items``,
        ``peak_bytes``, ``fetch_threads``, ``peak_fetch_threads``,
        ``fetch_seconds`` (summed over the threads; 0 without parallel fetch)
        and ``collate_seconds``. So one wrapper logs the same names every
        epoch. ``prefix`` is prepended as given (``"data/"`` gives
        ``"data/items"``).

        Example:
            >>> stats = LoaderStats(items=10, wait_seconds=0.5, source_seconds=2.0,
            ...                     started=100.0, finished=102.0)
            >>> stats.scalars(prefix="data/")  # doctest: +NORMALIZE_WHITESPACE
            {'data/items': 10.0, 'data/wait_seconds': 0.5, 'data/source_seconds': 2.0,
             'data/elapsed_seconds': 2.0, 'data/wait_fraction': 0.25}
        """
        names: tuple[str, ...] = SCALARS
        if self.depth is not None:
            names += ("depth", "peak_depth", "fetch_threads", "peak_fetch_threads", *BUFFER_SCALARS)
        return flat_scalars(self, names, prefix)

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
