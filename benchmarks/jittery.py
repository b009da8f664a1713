"""Workload ``jittery``: storage-like latency with a heavy tail.

Each batch takes a seeded, log-normally distributed time to "read"
(``time.sleep``, which releases the GIL like file or network I/O); its mean
is below the training step (also a sleep, like a GPU step the host waits
for). A plain loop pays both; a background thread can hide the reads
entirely, *if* it runs far enough ahead to ride out the slow ones. The ideal
is ``max(total read time, total step time)``, measured in the plain run of
the same repeat.

This module also holds what the ``bursty`` workload shares with it: the
variants compared (:func:`comparison_variants`) and their labels.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import prefetch_generator

from benchmarks.common import (
    IDEAL_COLUMNS,
    Config,
    Measure,
    Target,
    WorkloadResult,
    ideal_reference,
    ideal_row,
    interleave,
    median_ratio,
    timed_epoch,
)
from prefetch import BackgroundLoader

__all__ = ["JitterySource", "comparison_variants", "loader_epoch", "run"]

STEP_SECONDS = 0.004
MEAN_LATENCY = 0.003
SIGMA = 1.0
SEED = 1234
PLAIN = "plain loop"
AUTO = "BackgroundLoader depth=auto (default)"
LEARNED = "BackgroundLoader depth=auto, learned"
DEPTH_2 = "BackgroundLoader depth=2"
DEPTH_8 = "BackgroundLoader depth=8"
BG_DEFAULT = "BackgroundGenerator max_prefetch=1 (default)"
BG_8 = "BackgroundGenerator max_prefetch=8"
AUTO_NOTE = (
    "depth=auto (default) is a fresh BackgroundLoader every run: its first epoch, learning "
    "included. depth=auto, learned is one loader reused across runs (taught by one unmeasured "
    "epoch first), so the depth it learned carries over, as from one training epoch to the next."
)

Trace = dict[str, Any]
"""One fresh ``depth="auto"`` epoch: ``seconds``, per-item ``waits``, ``events``, ``depth``."""


class JitterySource:
    """``n`` batches, each after a seeded log-normal wait (mean ``mean`` seconds).

    Re-iterable: every epoch sees the same latencies.
    """

    def __init__(self, n: int, mean: float = MEAN_LATENCY, sigma: float = SIGMA) -> None:
        rng = random.Random(SEED)
        raw = [rng.lognormvariate(0.0, sigma) for _ in range(n)]
        scale = mean * n / sum(raw)
        self.latencies = [value * scale for value in raw]

    def __len__(self) -> int:
        return len(self.latencies)

    def __iter__(self) -> Iterator[int]:
        for index, latency in enumerate(self.latencies):
            time.sleep(latency)
            yield index


def loader_epoch(
    loader: BackgroundLoader[Any], step: Callable[[Any], object], waits: list[float] | None = None
) -> Measure:
    """Time one epoch of ``loader``; add its buffer figures (peak items, final depth)."""
    measure = timed_epoch(lambda: loader, step, waits)
    stats = loader.stats
    measure["peak_items"] = float(stats.peak_items)
    measure["peak_bytes"] = float(stats.peak_bytes)
    measure["depth"] = float(stats.depth if stats.depth is not None else loader.depth)
    return measure


def comparison_variants(
    source: Iterable[Any], step: Callable[[Any], object], traces: list[Trace] | None = None
) -> dict[str, Callable[[], Measure]]:
    """The variants both ``jittery`` and ``bursty`` compare, in the order they run.

    A plain loop (for the ideal), ``depth="auto"`` fresh every run (each run
    appended to ``traces``, if given) and learned (one loader, taught here by
    one unmeasured epoch), fixed depths 2 and 8, and prefetch_generator's
    default.
    """

    def fresh() -> Measure:
        loader = BackgroundLoader(source)
        waits: list[float] = []
        measure = loader_epoch(loader, step, waits)
        if traces is not None:
            events = list(loader.stats.depth_events)
            traces.append({"seconds": measure["seconds"], "waits": waits, "events": events})
        return measure

    learned = BackgroundLoader(source)
    for item in learned:  # the lesson: one epoch, not measured
        step(item)
    return {
        PLAIN: functools.partial(timed_epoch, lambda: source, step),
        AUTO: fresh,
        LEARNED: functools.partial(loader_epoch, learned, step),
        DEPTH_2: lambda: loader_epoch(BackgroundLoader(source, depth=2), step),
        DEPTH_8: lambda: loader_epoch(BackgroundLoader(source, depth=8), step),
        BG_DEFAULT: functools.partial(
            timed_epoch, lambda: prefetch_generator.BackgroundGenerator(iter(source)), step
        ),
    }


def ideals_of(samples: dict[str, list[Measure]], plain: str = PLAIN) -> list[float]:
    """Per repeat, ``max(total read, total step)`` as the plain run of ``plain`` measured it."""
    return [max(run["wait_seconds"], run["step_seconds"]) for run in samples[plain]]


def _step(_: object) -> None:
    time.sleep(STEP_SECONDS)


def run(config: Config) -> WorkloadResult:
    """Compare epoch times against the ideal; see the module docstring."""
    batches = config.size(150, 25)
    source = JitterySource(batches)
    variants = comparison_variants(source, _step)
    variants[BG_8] = functools.partial(
        timed_epoch,
        lambda: prefetch_generator.BackgroundGenerator(iter(source), max_prefetch=8),
        _step,
    )
    samples = interleave(variants, config.repeats, "jittery ", warmup=config.warmup)
    ideals = ideals_of(samples)
    plain = [run["seconds"] for run in samples[PLAIN]]
    result = WorkloadResult(
        name="jittery",
        title="Jittery storage latency",
        status="ok",
        description=(
            f"{batches} batches; read latency log-normal (sigma={SIGMA}, seed {SEED}), "
            f"mean {MEAN_LATENCY * 1e3:.1f} ms, longest {max(source.latencies) * 1e3:.1f} ms; "
            f"training step {STEP_SECONDS * 1e3:.1f} ms. Both sides sleep (release the GIL). "
            "Ideal = max(total read, total step) measured in the plain run of each repeat; "
            "'vs ideal' is the median over repeats of ideal / epoch time (1.00 = ideal). "
            "Peak items: most items produced and not yet consumed at once "
            "(BackgroundLoader.stats.peak_items). prefetch_generator's max_prefetch=N holds "
            "N+1 items; BackgroundLoader's depth counts the item being read."
        ),
        baseline=PLAIN,
        params={
            "batches": batches,
            "step_ms": STEP_SECONDS * 1e3,
            "mean_latency_ms": MEAN_LATENCY * 1e3,
            "sigma": SIGMA,
            "seed": SEED,
            "repeats": config.repeats,
        },
        columns=list(IDEAL_COLUMNS),
        plot="bar",
        plot_key="vs_ideal",
    )
    result.notes.append(AUTO_NOTE)
    result.notes.append(
        "A read slower than about depth x step time stalls the loop however fast reads are on "
        "average. depth=auto grows the buffer after such a stall when the source keeps up on "
        "average, so a fresh loader pays for the first stalls and a learned one starts deep."
    )
    result.rows.append(ideal_reference(ideals))
    result.rows += [ideal_row(samples, name, ideals, plain) for name in variants]
    rows = {row.variant: row for row in result.rows}
    vs_ideal = float(rows[AUTO].values["vs_ideal"])
    result.targets.append(
        Target(
            "jittery: depth=auto (default, fresh loader) >= 0.95 of ideal",
            vs_ideal >= 0.95,
            f"{vs_ideal:.3f} of ideal (learned: {float(rows[LEARNED].values['vs_ideal']):.3f})",
        )
    )
    ahead = median_ratio(samples, AUTO, BG_DEFAULT)
    result.targets.append(
        Target(
            "jittery: depth=auto (default) ahead of BackgroundGenerator default",
            ahead < 1.0,
            f"epoch time ratio {ahead:.3f}",
        )
    )
    return result
