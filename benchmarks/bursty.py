"""Workload ``bursty``: a source that stalls for 8 steps every 10th batch.

Item ``i`` takes ``8 x step`` to read when ``i % 10 == 9`` and ``0.1 x step``
otherwise (``time.sleep``, which releases the GIL like I/O); the training
step sleeps one step. On average the source keeps up (0.89 steps per item),
so a buffer deep enough to ride out a burst (about 9 items) reaches the
ideal, ``max(total read, total step)``, measured in the plain run of the same
repeat; at depth 2 the loop waits about 6 steps per burst. This is the case
``depth="auto"`` is for; its first epoch is traced (depth and waits per item,
drawn as ``depth_trace.png``).

Two checks of the policy's bounds run with it:

* **Throughput-bound source**: seeded jittery reads with a mean of 1.25 steps.
  No buffer makes up a deficit, so ``depth="auto"`` should hold no more items
  than depth 2 does, plus a margin of :data:`MARGIN_ITEMS`.
* **Byte budget**: the bursty pattern with 1 MiB tensors and
  ``max_bytes=4 MiB``: the bytes buffered must never exceed ``max_bytes``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks.common import (
    IDEAL_COLUMNS,
    Column,
    Config,
    Measure,
    Row,
    Target,
    WorkloadResult,
    ideal_reference,
    ideal_row,
    interleave,
    timed_epoch,
)
from benchmarks.jittery import (
    AUTO,
    AUTO_NOTE,
    DEPTH_2,
    LEARNED,
    PLAIN,
    SIGMA,
    JitterySource,
    Trace,
    comparison_variants,
    ideals_of,
    loader_epoch,
)
from prefetch import BackgroundLoader
from prefetch._threads.depth_policy import START_DEPTH

__all__ = ["BurstySource", "run"]

STEP_SECONDS = 0.005
SLOW_STEPS = 8.0
FAST_STEPS = 0.1
PERIOD = 10
THROUGHPUT_STEPS = 1.25
"""Mean read of the throughput-bound source, in steps."""
MARGIN_ITEMS = 2
"""The 'small margin': items ``depth="auto"`` may hold beyond depth 2's peak there."""
PAYLOAD_FLOATS = 262144
"""float32 elements per item of the byte-budget check: 1 MiB."""
MAX_BYTES = 4 * 2**20
MIB = 2**20
TB_PLAIN = "throughput-bound: plain loop"
TB_AUTO = "throughput-bound: depth=auto (default)"
TB_LEARNED = "throughput-bound: depth=auto, learned"
TB_DEPTH_2 = "throughput-bound: depth=2"
BYTES_AUTO = "1 MiB items: depth=auto, max_bytes=4 MiB"


class BurstySource:
    """``n`` items; item ``i`` sleeps ``8 x step`` if ``i % 10 == 9``, else ``0.1 x step``.

    Re-iterable. With ``payload``, each item is ``(i, torch.zeros(262144))``
    (1 MiB of float32) instead of ``i``.
    """

    def __init__(self, n: int, step: float = STEP_SECONDS, payload: bool = False) -> None:
        self.latencies = [
            (SLOW_STEPS if i % PERIOD == PERIOD - 1 else FAST_STEPS) * step for i in range(n)
        ]
        self.payload = payload

    def __len__(self) -> int:
        return len(self.latencies)

    def __iter__(self) -> Iterator[Any]:
        for index, latency in enumerate(self.latencies):
            time.sleep(latency)
            yield (index, torch.zeros(PAYLOAD_FLOATS)) if self.payload else index


def _step(_: object) -> None:
    time.sleep(STEP_SECONDS)


def _bytes_epoch(source: BurstySource) -> Measure:
    measure = loader_epoch(BackgroundLoader(source, max_bytes=MAX_BYTES), _step)
    measure["peak_mib"] = measure["peak_bytes"] / MIB
    return measure


def _trace(traces: list[Trace], source: BurstySource, ideals: list[float]) -> dict[str, Any]:
    """The JSON record of the fresh auto run of median epoch time (one trace per repeat)."""
    index = sorted(range(len(traces)), key=lambda i: traces[i]["seconds"])[len(traces) // 2]
    chosen, ideal = traces[index], ideals[index]
    events = [dataclasses.asdict(event) for event in chosen["events"]]
    return {
        "variant": AUTO,
        "repeat": index + 1,
        "items": len(source),
        "step_ms": STEP_SECONDS * 1e3,
        "seconds": chosen["seconds"],
        "vs_ideal": ideal / chosen["seconds"],
        "start_depth": events[0]["old"] if events else START_DEPTH,
        "reference_depths": [2, 8],
        "slow_steps": SLOW_STEPS,
        "slow_items": [i + 1 for i in range(len(source)) if i % PERIOD == PERIOD - 1],
        "events": events,
        "waits_ms": [round(wait * 1e3, 3) for wait in chosen["waits"]],
    }


def run(config: Config) -> WorkloadResult:
    """Compare the four configurations against the ideal; check the bounds."""
    batches = config.size(300, 40)
    source = BurstySource(batches)
    bound = JitterySource(batches, mean=THROUGHPUT_STEPS * STEP_SECONDS)
    heavy = BurstySource(batches, payload=True)
    torch.zeros(PAYLOAD_FLOATS)  # the allocator's first large block: not in any epoch
    traces: list[Trace] = []
    variants = comparison_variants(source, _step, traces)
    variants[TB_PLAIN] = functools.partial(timed_epoch, lambda: bound, _step)
    variants[TB_AUTO] = lambda: loader_epoch(BackgroundLoader(bound), _step)
    taught = BackgroundLoader(bound)
    for item in taught:  # the lesson: one epoch, not measured
        _step(item)
    variants[TB_LEARNED] = functools.partial(loader_epoch, taught, _step)
    variants[TB_DEPTH_2] = lambda: loader_epoch(BackgroundLoader(bound, depth=2), _step)
    variants[BYTES_AUTO] = functools.partial(_bytes_epoch, heavy)
    samples = interleave(variants, config.repeats, "bursty  ", warmup=config.warmup)
    ideals = ideals_of(samples)
    plain = [run["seconds"] for run in samples[PLAIN]]
    bound_ideals = ideals_of(samples, TB_PLAIN)
    bound_plain = [run["seconds"] for run in samples[TB_PLAIN]]
    result = WorkloadResult(
        name="bursty",
        title="Bursty source: 8 steps every 10th batch",
        status="ok",
        description=(
            f"{batches} batches; batch i reads for {SLOW_STEPS:g} steps if i % {PERIOD} == "
            f"{PERIOD - 1}, else {FAST_STEPS:g} step; training step {STEP_SECONDS * 1e3:.1f} ms. "
            "Both sides sleep (release the GIL). Ideal = max(total read, total step) measured "
            "in the plain run of each repeat; 'vs ideal' is the median over repeats of ideal / "
            "epoch time (1.00 = ideal). Peak items: most items produced and not yet consumed "
            "at once (BackgroundLoader.stats.peak_items; the item being read is not one). "
            f"Throughput-bound rows: {batches} batches with seeded log-normal reads "
            f"(sigma={SIGMA}) of mean {THROUGHPUT_STEPS:g} steps, ideal from their own plain "
            "run. 1 MiB items: the bursty pattern, each item carrying torch.zeros(262144), "
            "ideal from the bursty plain run."
        ),
        baseline=PLAIN,
        params={
            "batches": batches,
            "step_ms": STEP_SECONDS * 1e3,
            "slow_steps": SLOW_STEPS,
            "fast_steps": FAST_STEPS,
            "period": PERIOD,
            "throughput_bound_mean_steps": THROUGHPUT_STEPS,
            "margin_items": MARGIN_ITEMS,
            "max_bytes": MAX_BYTES,
            "repeats": config.repeats,
        },
        columns=[*IDEAL_COLUMNS, Column("peak_mib", "peak MiB", "{:.1f}")],
        plot="bar",
        plot_key="vs_ideal",
        trace=_trace(traces[-config.repeats :], source, ideals),
        trace_plot="depth_trace.png",
    )
    result.notes.append(AUTO_NOTE)
    result.notes.append(
        "depth_trace.png: the depth of the fresh depth=auto loader item by item, in the run of "
        "median epoch time, with the waits of the loop."
    )
    result.rows.append(ideal_reference(ideals))
    for name in variants:
        if name.startswith("throughput-bound"):
            result.rows.append(ideal_row(samples, name, bound_ideals, bound_plain))
        else:
            result.rows.append(ideal_row(samples, name, ideals, plain))
    result.targets += _targets(samples, {row.variant: row for row in result.rows})
    return result


def _targets(samples: dict[str, list[Measure]], rows: dict[str, Row]) -> list[Target]:
    def of_ideal(name: str) -> float:
        return float(rows[name].values["vs_ideal"])

    def most(name: str, key: str) -> float:
        return max(run[key] for run in samples[name])

    depth_2_peak = most(TB_DEPTH_2, "peak_items")
    peak_bytes = most(BYTES_AUTO, "peak_bytes")

    def holds(name: str, label: str) -> Target:
        peak = most(name, "peak_items")
        return Target(
            f"throughput-bound: {label} holds at most depth=2's peak + {MARGIN_ITEMS} items",
            peak <= depth_2_peak + MARGIN_ITEMS,
            f"peak {peak:.0f} items vs {depth_2_peak:.0f} (most over repeats); "
            f"final depth {float(rows[name].values['depth']):.0f}",
        )

    return [
        Target(
            "bursty: depth=auto (default, fresh loader) >= 0.9 of ideal",
            of_ideal(AUTO) >= 0.9,
            f"{of_ideal(AUTO):.3f} of ideal (depth=2: {of_ideal(DEPTH_2):.3f})",
        ),
        Target(
            "bursty: depth=auto, learned >= 0.9 of ideal",
            of_ideal(LEARNED) >= 0.9,
            f"{of_ideal(LEARNED):.3f} of ideal",
        ),
        holds(TB_AUTO, "depth=auto (fresh loader)"),
        holds(TB_LEARNED, "depth=auto, learned"),
        Target(
            "byte budget: buffered bytes never above max_bytes",
            peak_bytes <= MAX_BYTES,
            f"peak {peak_bytes / MIB:.2f} MiB of {MAX_BYTES / MIB:g} MiB (most over repeats); "
            f"{of_ideal(BYTES_AUTO):.3f} of ideal",
        ),
    ]
