"""What ``summary()`` advises: the setting that helps on this loader, or that none is needed.

:func:`advice` reads one epoch's figures (or a wrapper's totals) and the
:class:`~prefetch.LoaderFacts` recorded where the loader was wrapped, and
names one remedy, the one measured to help on such a loader (the ``advice``
benchmark runs each scenario's candidates side by side), never a setting the
loader refuses (``fetch_threads`` only for a map-style ``DataLoader``). In
order:

1. **No free core.** The loop (a step on the CPU) and the loading threads
   took the cores from each other (:class:`Cores`): more loading threads or
   processes would only add to it; ``num_threads=1`` keeps the loading
   thread's torch ops on one core.
2. **Not the bottleneck.** The loop waited under :data:`ADVISE_WAIT` of the
   time: the summary says so. Items quicker than :data:`ADVISE_ITEM_SECONDS`
   get no advice: the hand-off is their cost.
3. **Bursts.** The loader was busy under :data:`ADVISE_BUSY` of the time: it
   keeps up on average and stalls; a deeper buffer absorbs that
   (``depth="auto"``), unless ``max_bytes`` or ``max_depth`` capped it.
4. **It cannot keep up.** Loading on a core :data:`ADVISE_CPU` of its busy
   time is CPU-bound: in Python it holds the GIL, so worker processes help
   (``num_workers``, or threads on a free-threaded Python). Loading that
   waits (I/O) is read in parallel by ``fetch_threads`` for a map-style
   ``DataLoader``, by ``num_workers`` (a shard each) for an
   ``IterableDataset``; an accelerate-prepared loader needs your own
   ``DataLoader`` for ``fetch_threads``, or ``num_workers``. A side that
   waited for a core while this process did not compete for it is a busy
   machine: the summary says so first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from prefetch._shared.facts import LoaderFacts

ADVISE_WAIT = 0.1
"""Share of the time the loop waited below which loading is not the bottleneck."""
ADVISE_BUSY = 0.7
"""Share of the time the loader was busy above which it "cannot keep up" (below: bursts)."""
ADVISE_ITEM_SECONDS = 0.001
"""Loader seconds per item below which loading in parallel would not pay its hand-offs."""
ADVISE_CPU = 0.5
"""Share of a side's time on (or waiting for) a core above which it is CPU-bound."""
ADVISE_CORE_SHARE = 0.25
"""Share of the epoch a side ran on a core above which it takes cores from the other side."""
ADVISE_CORE_WAIT = 0.05
"""Share of the epoch a side must have waited for a core to count as starved of cores."""
ADVISE_STARVED = 0.3
"""Share of a side's time with work for a core spent waiting for one: it was starved of cores."""

PROCESSES = "DataLoader(num_workers=N)"
"""How the advice names worker processes."""


class Figures(Protocol):
    """What :func:`advice` reads: one epoch's stats, or a wrapper's totals."""

    @property
    def items(self) -> int: ...

    @property
    def source_seconds(self) -> float: ...

    @property
    def loading_cpu_seconds(self) -> float: ...

    @property
    def loading_core_wait_seconds(self) -> float: ...

    @property
    def loop_cpu_seconds(self) -> float: ...

    @property
    def loop_core_wait_seconds(self) -> float: ...

    @property
    def wait_seconds(self) -> float: ...

    @property
    def parallel_fetch_available(self) -> bool: ...

    @property
    def facts(self) -> LoaderFacts: ...

    @property
    def elapsed_seconds(self) -> float: ...

    @property
    def wait_fraction(self) -> float: ...


def held_at_bound(reasons: Sequence[str]) -> str:
    """Return the bound (``"max_bytes"``, ``"max_depth"``) an adaptive depth held at, or ``""``.

    Example:
        >>> held_at_bound(["grow: waited 2.0 steps", "hold: at max_bytes (2 items of 8 bytes)"])
        'max_bytes'
    """
    for bound in ("max_bytes", "max_depth"):
        if any(reason.startswith(f"hold: at {bound} ") for reason in reasons):
            return bound
    return ""


def advice(figures: Figures, held_at: str = "") -> str:
    """Return the setting that helps this loader, or that loading is not the bottleneck.

    ``held_at`` names the bound an adaptive depth held at (:func:`held_at_bound`).
    The order of the checks is the module's. ``""`` when there is nothing to
    judge (no item), or nothing to name: items quicker than
    :data:`ADVISE_ITEM_SECONDS`, a loader already read by ``fetch_threads``.

    Example:
        >>> from prefetch import LoaderStats
        >>> advice(LoaderStats(items=10, wait_seconds=0.1, source_seconds=1.0,
        ...                    started=0.0, finished=2.0))
        'loading is not the bottleneck: the loop waited 5% of the time'
    """
    if figures.elapsed_seconds <= 0 or not figures.items:
        return ""
    cores = Cores.of(figures)
    if cores.compete:
        return _no_free_core(cores, figures.facts)
    parts = (cores.busy_machine(), _loading(figures, held_at))
    return "; ".join(part for part in parts if part)


def _loading(figures: Figures, held_at: str) -> str:
    """What would help loading keep up, or that it is not the bottleneck (cores aside)."""
    facts, wait, source = figures.facts, figures.wait_fraction, figures.source_seconds
    if wait < ADVISE_WAIT:
        return f"loading is not the bottleneck: the loop waited {wait:.0%} of the time"
    if source / figures.items < ADVISE_ITEM_SECONDS:
        return ""  # the hand-off, not loading, is what such items cost
    busy = source / figures.elapsed_seconds
    if busy < ADVISE_BUSY:
        return _bursts(busy, wait, facts, held_at)
    if facts.fetch_threads:
        return ""  # threads read it already: their figures are in the summary
    text = f"the loader cannot keep up (busy {min(busy, 1.0):.0%} of the time"
    running = figures.loading_cpu_seconds
    if not running:  # not measured: no loading thread of this wrapper
        return f"{text}): {_parallel(figures, facts, cpu_bound=None)}"
    text += f", on a core {min(running / source, 1.0):.0%} of it"
    return f"{text}): {_parallel(figures, facts, cpu_bound=running >= ADVISE_CPU * source)}"


@dataclasses.dataclass(frozen=True)
class Cores:
    """Who waited for a core, and whether the loop and loading competed for them.

    Attributes:
        loop_starved: Share of the loop's time with work for a core that it
            waited for one; 0 unless it had work for one :data:`ADVISE_CPU`
            of its own time (its steps) and waited :data:`ADVISE_CORE_WAIT`
            of the epoch.
        loading_starved: The same for the loading threads (of their busy time).
        compete: One side waited for a core :data:`ADVISE_STARVED` of its
            time while the other ran on one :data:`ADVISE_CORE_SHARE` of the
            epoch: the loop (a step on the CPU) and loading took the cores
            from each other.
    """

    loop_starved: float
    loading_starved: float
    compete: bool

    @classmethod
    def of(cls, figures: Figures) -> Cores:
        """Read the loop's and the loading threads' times on, and waiting for, a core."""
        elapsed = figures.elapsed_seconds
        stepping = max(elapsed - figures.wait_seconds, 0.0)  # the loop's own time
        loop_cpu, loading_cpu = figures.loop_cpu_seconds, figures.loading_cpu_seconds
        loop = _starved(loop_cpu, figures.loop_core_wait_seconds, stepping, elapsed)
        loading = _starved(
            loading_cpu, figures.loading_core_wait_seconds, figures.source_seconds, elapsed
        )
        share = ADVISE_CORE_SHARE * elapsed
        compete = (loop >= ADVISE_STARVED and loading_cpu >= share) or (
            loading >= ADVISE_STARVED and loop_cpu >= share
        )
        return cls(loop, loading, compete)

    def busy_machine(self) -> str:
        """Say that other processes took the cores, if a side waited for one; else ``""``."""
        if self.loading_starved >= ADVISE_STARVED:
            who = f"the loading threads waited for a core {self.loading_starved:.0%} of their"
        elif self.loop_starved >= ADVISE_STARVED:
            who = f"the loop waited for a core {self.loop_starved:.0%} of its"
        else:
            return ""
        return f"the machine is busy ({who} time with work for one; other processes took them)"


def _starved(running: float, waiting: float, busy: float, elapsed: float) -> float:
    """Share of a side's time with work for a core spent waiting for one (see :class:`Cores`)."""
    wanted = running + waiting
    if wanted <= 0 or wanted < ADVISE_CPU * busy or waiting < ADVISE_CORE_WAIT * elapsed:
        return 0.0
    return waiting / wanted


def _no_free_core(cores: Cores, facts: LoaderFacts) -> str:
    text = (
        f"no free core: loading competes with the step for the {facts.cores} cores (the loop "
        f"waited for one {cores.loop_starved:.0%} of its time on the CPU, the loading "
        f"threads {cores.loading_starved:.0%} of theirs)"
    )
    if facts.depth and facts.num_threads != 1:
        return (
            f"{text}; more loading threads or processes would only add to it: "
            "BackgroundLoader(..., num_threads=1) keeps the loading thread's torch ops on one core"
        )
    return f"{text}; the CPU is the limit (torch.set_num_threads for the step, or the GPU)"


def _bursts(busy: float, wait: float, facts: LoaderFacts, held_at: str) -> str:
    text = (
        f"loading keeps up on average (busy {busy:.0%} of the time) but stalls in bursts "
        f"(the loop waited {wait:.0%})"
    )
    if held_at:
        return (
            f"{text}: the adaptive depth held at {held_at} (depth_events); raise "
            f"BackgroundLoader(..., {held_at}=...) if the memory is there"
        )
    if facts.depth == "fixed":
        return f"{text}: BackgroundLoader(..., depth='auto') grows the buffer to absorb them"
    return ""


def _parallel(figures: Figures, facts: LoaderFacts, *, cpu_bound: bool | None) -> str:
    """Name what loads in parallel on this loader (``cpu_bound`` ``None``: not measured)."""
    kind = "map" if figures.parallel_fetch_available else facts.kind
    if kind == "workers":
        return f"raise the DataLoader's num_workers ({facts.workers} now) if cores are free"
    gil = ""
    if cpu_bound and facts.gil_enabled:
        gil = "Python-heavy loading holds the GIL, so threads take turns: "
    threads = "BackgroundLoader(..., fetch_threads='auto')"
    if kind == "map":
        if gil:
            return f"{gil}load in worker processes with {PROCESSES} (or on free-threaded Python)"
        if not figures.parallel_fetch_available:
            return f"load in worker processes with {PROCESSES}"
        text = f"read the DataLoader's batches in parallel with {threads}"
        if cpu_bound is None:
            text += f" (threads, when loading releases the GIL) or {PROCESSES} (processes)"
        return text
    if kind == "iterable":
        return (
            f"{gil}fetch_threads cannot split an IterableDataset: give the DataLoader "
            "num_workers=N, each worker reading its own shard (get_worker_info())"
        )
    prepare = "num_workers=N before accelerator.prepare() (Trainer: dataloader_num_workers)"
    if kind == "prepared":
        if gil:
            return f"{gil}give the DataLoader {prepare}"
        return (
            "fetch_threads cannot read accelerate's prepared loader: wrap your own DataLoader "
            f"in {threads}, or give it {prepare}"
        )
    if gil:
        return f"{gil}load it in a DataLoader with num_workers=N (worker processes)"
    return (
        "one thread reads a plain iterable, in order: make it a map-style DataLoader, which "
        f"{threads} reads in parallel"
    )
