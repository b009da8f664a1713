"""Workload ``control``: a negative control where a thread cannot help.

Both the producer and the training step are pure-Python CPU work, which
holds the GIL: only one of the two threads can run at a time, so a
background thread can at best break even. Expect about 1.0x; anything
better here would mean the measurement is wrong.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import prefetch_generator

from benchmarks.common import (
    Column,
    Config,
    Measure,
    Target,
    WorkloadResult,
    interleave,
    speedup_row,
    timed_epoch,
)
from prefetch import BackgroundLoader

__all__ = ["run"]

WORK_ITERATIONS = 20_000
PLAIN = "plain loop"
BL_DEFAULT = "BackgroundLoader depth=auto (default)"


def busy(iterations: int = WORK_ITERATIONS) -> int:
    """Burn CPU in pure Python (holding the GIL) and return a checksum."""
    total = 0
    for value in range(iterations):
        total += value * value % 7
    return total


class BusySource:
    """``n`` items, each computed by :func:`busy` (GIL held)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.n):
            yield busy()


def run(config: Config) -> WorkloadResult:
    """Compare a plain loop with threaded ones on GIL-bound work."""
    items = config.size(60, 20)
    source = BusySource(items)
    makers: dict[str, Callable[[], Any]] = {
        PLAIN: lambda: source,
        "BackgroundGenerator max_prefetch=1 (default)": lambda: (
            prefetch_generator.BackgroundGenerator(iter(source))
        ),
        BL_DEFAULT: lambda: BackgroundLoader(source),
        "BackgroundLoader depth=8": lambda: BackgroundLoader(source, depth=8),
    }
    variants: dict[str, Callable[[], Measure]] = {
        name: functools.partial(timed_epoch, make, busy) for name, make in makers.items()
    }
    started = time.perf_counter()
    busy()
    item_ms = (time.perf_counter() - started) * 1e3
    repeats = config.scaled_repeats(2)
    samples = interleave(variants, repeats, "control ", warmup=config.warmup)
    result = WorkloadResult(
        name="control",
        title="Negative control: GIL-bound producer and step",
        status="ok",
        description=(
            f"{items} items; producing one and the training step are each ~{item_ms:.1f} ms "
            "of pure-Python arithmetic, which holds the GIL. Threads take turns instead of "
            "overlapping: expect about 1.0x."
        ),
        baseline=PLAIN,
        params={"items": items, "work_iterations": WORK_ITERATIONS, "repeats": repeats},
        columns=[
            Column("seconds", "epoch s", "{:.3f}"),
            Column("speedup", "speed-up", "{:.2f}x"),
            Column("wait_fraction", "waited for data", "{:.0%}"),
        ],
        plot="bar",
    )
    result.rows += [
        speedup_row(samples, name, PLAIN, ("seconds", "wait_fraction")) for name in makers
    ]
    speedup = float(next(r for r in result.rows if r.variant == BL_DEFAULT).values["speedup"])
    result.targets.append(
        Target(
            "control: no gain where the GIL serialises the work (0.9x-1.1x expected)",
            0.9 <= speedup <= 1.1,
            f"{speedup:.2f}x",
        )
    )
    return result
