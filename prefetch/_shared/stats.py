"""How long a training loop waited for data: the figures every wrapper reports."""

from __future__ import annotations

import dataclasses
import threading
import time

from prefetch._shared.advice import advice, held_at_bound
from prefetch._shared.cpu_clock import LoopClock, ThreadClocks
from prefetch._shared.facts import LoaderFacts

SCALARS = (
    "items",
    "wait_seconds",
    "end_wait_seconds",
    "loop_cpu_seconds",
    "loop_core_wait_seconds",
    "source_seconds",
    "elapsed_seconds",
    "wait_fraction",
)
"""What ``scalars()`` always gives, for one epoch or for a wrapper's totals."""
BUFFER_SCALARS = (
    "peak_items",
    "peak_bytes",
    "loading_cpu_seconds",
    "loading_core_wait_seconds",
    "fetch_seconds",
    "collate_seconds",
)
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

    ``elapsed_seconds`` runs from the start of the epoch (its first
    ``next()``, after ``iter()`` of the wrapped loader) to the last item
    handed over (``last_handoff``); before the first item, to the epoch's end
    (``finished``) or now. So the time after an epoch's last item never
    counts, however the epoch ends: the loop asks for more (a ``for`` loop),
    stops at ``len(loader)`` (as Lightning does), breaks out, or a wrapper
    above releases it. ``wait_seconds`` is the time the consumer (your
    training loop) spent inside ``next()`` waiting for an item that was not
    ready yet, within that time: each wait counts once the item it waited for
    is handed over, so it is never longer than ``elapsed_seconds``, and
    ``wait_fraction`` is their ratio. A wait after the last item (for the end
    of the data, or an error that ended the epoch) is ``end_wait_seconds``.
    ``source_seconds`` is time spent inside the wrapped loader producing
    items (by every loading thread, summed).

    A :class:`~prefetch.BackgroundLoader` also reports its buffer: ``depth``
    (now) and ``peak_depth`` (highest this epoch), ``depth_events`` (each
    change of an adaptive depth and why), ``peak_items`` (most items the
    loading threads made and the loop had not yet been handed, at once,
    counted as the threads post them: not the slots ``depth`` reserves for
    items still being read; items quicker than 50 µs are posted in runs, so
    they count from their run's post) and ``peak_bytes`` (most tensor bytes
    of such items; counted only when a byte limit applies).

    With parallel fetch (``fetch_threads``) it also reports the threads:
    ``fetch_threads`` (now; 1 for a ``BackgroundLoader`` without parallel
    fetch, whose one thread loads) and ``peak_fetch_threads``, ``thread_events``
    (each change of ``fetch_threads="auto"`` and why), ``fetch_seconds``
    (seconds each thread spent reading samples, one entry per thread started),
    ``fetch_reads`` (reads each thread made: samples, or ``__getitems__``
    chunks), ``collate_seconds`` (all threads, in ``collate_fn``) and
    ``peak_samples`` (most samples drawn and not yet collated at once: the
    batches being read at the grain of samples).

    Where the loading threads' time went, for the summary's advice:
    ``loading_cpu_seconds`` is the part of it they ran on a core, and
    ``loading_core_wait_seconds`` the part they were ready to run but waited
    for a free core (Linux's run queue; 0 where the system does not say);
    the rest of ``source_seconds`` they were blocked (on I/O, a lock, the
    GIL). Both are read when a thread posts what it made, at most every
    20 ms per thread (:class:`~prefetch._shared.cpu_clock.ThreadClocks`).
    ``loop_cpu_seconds`` and ``loop_core_wait_seconds`` are the loop's own
    thread's, from its first item, read at hand-overs likewise: a step on
    the CPU runs on a core most of ``elapsed_seconds - wait_seconds``, one
    that waits for a GPU hardly; a step slowed by loading threads (or other
    processes) on the same cores waits for one.

    ``parallel_fetch_available`` is true when a ``BackgroundLoader`` read a
    map-style ``DataLoader`` with ``num_workers=0`` in one thread, so
    ``fetch_threads`` could read it in parallel. ``facts`` (a
    :class:`~prefetch.LoaderFacts`) says what kind of loader it is, the
    loading thread's ``num_threads``, the cores and whether the GIL is on.
    :meth:`summary` reads them to name the setting that helps (see
    :doc:`/diagnosing`).

    :meth:`scalars` gives the figures as a flat ``{name: float}`` dict for a
    logger; a wrapper's :attr:`~prefetch.BackgroundLoader.total_stats` sums
    its epochs (:class:`~prefetch.TotalStats`).

    Example:
        >>> stats = LoaderStats(items=10, wait_seconds=0.1, source_seconds=1.0,
        ...                     started=100.0, finished=102.0)
        >>> round(stats.wait_fraction, 2)
        0.05
        >>> stats.summary()  # doctest: +NORMALIZE_WHITESPACE
        'waited 5% of the time for data (0.10 s of 2.00 s, 10 items); loading is not the
         bottleneck: the loop waited 5% of the time'
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
    end_wait_seconds: float = 0.0
    loading_cpu_seconds: float = 0.0
    loading_core_wait_seconds: float = 0.0
    loop_cpu_seconds: float = 0.0
    loop_core_wait_seconds: float = 0.0
    facts: LoaderFacts = dataclasses.field(default_factory=LoaderFacts)
    _clocks: ThreadClocks = dataclasses.field(
        default_factory=ThreadClocks, init=False, repr=False, compare=False
    )
    _loop_clock: LoopClock = dataclasses.field(
        default_factory=LoopClock, init=False, repr=False, compare=False
    )

    def record_wait(self, seconds: float) -> None:
        """The loop waited ``seconds`` in ``next()`` (``wait_seconds`` once an item follows).

        Called by prefetch's iterators, as are the other ``record_`` methods.
        """
        self.end_wait_seconds += seconds

    def record_hand_over(self, now: float) -> None:
        """An item was handed to the loop at ``now`` (``time.perf_counter()``)."""
        self.last_handoff = now
        if self.end_wait_seconds:  # the waits since the last item end here
            self.wait_seconds += self.end_wait_seconds
            self.end_wait_seconds = 0.0
        running, waiting = self._loop_clock.read(now=now)
        self.loop_cpu_seconds += running
        self.loop_core_wait_seconds += waiting

    def record_loading_clocks(self) -> None:
        """A loading thread (the caller) posted: add its time on, and waiting for, a core."""
        running, waiting = self._clocks.read(threading.get_ident(), now=time.perf_counter())
        self.loading_cpu_seconds += running
        self.loading_core_wait_seconds += waiting

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
        """Return a one-line account, and the setting that would help (see :doc:`/diagnosing`).

        For example ``'waited 42% of the time for data (4.20 s of 10.00 s, 100
        items); ...'``: the wait is never longer than the time it is a share
        of (a wait after the last item is said apart, from 0.01 s).
        """
        text = (
            f"waited {self.wait_fraction:.0%} of the time for data "
            f"({self.wait_seconds:.2f} s of {self.elapsed_seconds:.2f} s, {self.items} items)"
        )
        if self.end_wait_seconds >= 0.005:
            text += f", then {self.end_wait_seconds:.2f} s after the last item"
        if self.depth is not None:
            text += f"; depth {self.depth} (peak {self.peak_depth})"
        stages = self.stage_summary()
        if stages:
            text += f"; {stages}"
        said = advice(self, held_at_bound([event.reason for event in self.depth_events]))
        return f"{text}; {said}" if said else text

    def scalars(self, prefix: str = "") -> dict[str, float]:
        """Return the figures as flat ``{prefix + name: value}`` floats, for any logger.

        Always ``items``, ``wait_seconds``, ``end_wait_seconds``,
        ``loop_cpu_seconds``, ``loop_core_wait_seconds``, ``source_seconds``,
        ``elapsed_seconds`` and ``wait_fraction``; for a
        ``BackgroundLoader`` (which has a ``depth``) also ``depth``,
        ``peak_depth``, ``fetch_threads``, ``peak_fetch_threads``,
        ``peak_items``, ``peak_bytes``, ``loading_cpu_seconds``,
        ``loading_core_wait_seconds``, ``fetch_seconds`` (summed
        over the threads; 0 without parallel fetch) and ``collate_seconds``.
        So one wrapper logs the same names every epoch, the figures
        :meth:`summary` reads. ``prefix`` is prepended as given (``"data/"``
        gives ``"data/items"``).

        Example:
            >>> stats = LoaderStats(items=10, wait_seconds=0.5, source_seconds=2.0,
            ...                     started=100.0, finished=102.0)
            >>> stats.scalars(prefix="data/")  # doctest: +NORMALIZE_WHITESPACE
            {'data/items': 10.0, 'data/wait_seconds': 0.5, 'data/end_wait_seconds': 0.0,
             'data/loop_cpu_seconds': 0.0, 'data/loop_core_wait_seconds': 0.0,
             'data/source_seconds': 2.0, 'data/elapsed_seconds': 2.0, 'data/wait_fraction': 0.25}
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
