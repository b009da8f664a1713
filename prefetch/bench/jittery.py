"""Workload ``jittery``: storage-like latency with a heavy tail.

Each batch takes a seeded, log-normally distributed time to "read"
(``time.sleep``, which releases the GIL like file or network I/O); its mean
is below the training step (also a sleep, like a GPU step the host waits
for). A plain loop pays both; a background thread can hide the reads
entirely, *if* it runs far enough ahead to ride out the slow ones. The ideal
is ``max(total read time, total step time)``, measured in the plain run of
the same repeat.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import prefetch_generator

from prefetch import BackgroundLoader
from prefetch.bench.common import (
    Column,
    Config,
    Measure,
    Row,
    Target,
    WorkloadResult,
    interleave,
    median,
    timed_epoch,
)

__all__ = ["JitterySource", "run"]

STEP_SECONDS = 0.004
MEAN_LATENCY = 0.003
SIGMA = 1.0
SEED = 1234
PLAIN = "plain loop"
BG_DEFAULT = "BackgroundGenerator max_prefetch=1 (default)"
BL_DEFAULT = "BackgroundLoader depth=2 (default)"


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


def _step(_: object) -> None:
    time.sleep(STEP_SECONDS)


def run(config: Config) -> WorkloadResult:
    """Compare epoch times against the ideal; see the module docstring."""
    batches = config.size(150, 25)
    source = JitterySource(batches)
    makers: dict[str, Callable[[], Any]] = {
        PLAIN: lambda: source,
        BG_DEFAULT: lambda: prefetch_generator.BackgroundGenerator(iter(source)),
        "BackgroundGenerator max_prefetch=8": lambda: prefetch_generator.BackgroundGenerator(
            iter(source), max_prefetch=8
        ),
        BL_DEFAULT: lambda: BackgroundLoader(source),
        "BackgroundLoader depth=8": lambda: BackgroundLoader(source, depth=8),
    }
    variants: dict[str, Callable[[], Measure]] = {
        name: functools.partial(timed_epoch, make, _step) for name, make in makers.items()
    }
    samples = interleave(variants, config.repeats, "jittery ", warmup=config.warmup)
    ideals = [max(run["wait_seconds"], run["step_seconds"]) for run in samples[PLAIN]]
    plain = [run["seconds"] for run in samples[PLAIN]]
    result = WorkloadResult(
        name="jittery",
        title="Jittery storage latency",
        status="ok",
        description=(
            f"{batches} batches; read latency log-normal (sigma={SIGMA}, seed {SEED}), "
            f"mean {MEAN_LATENCY * 1e3:.1f} ms, longest {max(source.latencies) * 1e3:.1f} ms; "
            f"training step {STEP_SECONDS * 1e3:.1f} ms. Both sides sleep (release the GIL). "
            "Ideal = max(total read, total step) measured in the plain run of each repeat. "
            "prefetch_generator's max_prefetch=N holds N+1 items; BackgroundLoader's "
            "depth counts the item being read."
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
        columns=[
            Column("seconds", "epoch s", "{:.3f}"),
            Column("vs_ideal", "vs ideal", "{:.3f}x"),
            Column("speedup", "speed-up", "{:.2f}x"),
            Column("wait_fraction", "waited for data", "{:.0%}"),
        ],
        plot="bar",
    )
    result.notes.append(
        "A read slower than about depth x step time stalls the loop however fast reads are "
        "on average: heavy-tailed latency needs a deeper queue than the default."
    )
    result.rows.append(
        Row("ideal", {"seconds": median(ideals), "vs_ideal": 1.0}, {"seconds": ideals})
    )
    for name in makers:
        seconds = [run["seconds"] for run in samples[name]]
        waits = [run["wait_fraction"] for run in samples[name]]
        ratios = [s / i for s, i in zip(seconds, ideals, strict=True)]
        speedup = [p / s for p, s in zip(plain, seconds, strict=True)]
        result.rows.append(
            Row(
                name,
                {
                    "seconds": median(seconds),
                    "vs_ideal": median(ratios),
                    "speedup": median(speedup),
                    "wait_fraction": median(waits),
                },
                {"seconds": seconds, "wait_fraction": waits},
            )
        )
    rows = {row.variant: row for row in result.rows}
    vs_ideal = float(rows[BL_DEFAULT].values["vs_ideal"])
    result.targets.append(
        Target(
            "jittery: BackgroundLoader default within 5% of ideal",
            vs_ideal <= 1.05,
            f"{vs_ideal:.3f}x ideal",
        )
    )
    ahead = median(
        [
            mine["seconds"] / theirs["seconds"]
            for mine, theirs in zip(samples[BL_DEFAULT], samples[BG_DEFAULT], strict=True)
        ]
    )
    result.targets.append(
        Target(
            "jittery: BackgroundLoader default ahead of BackgroundGenerator default",
            ahead < 1.0,
            f"epoch time ratio {ahead:.3f}",
        )
    )
    return result
