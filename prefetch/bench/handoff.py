"""Workload ``handoff``: the cost of passing one tiny item between threads.

The source is ``range(n)`` and the loop body is empty, so all that is
measured is the hand-off: microseconds per item added over iterating
``range(n)`` directly, at several depths, for :class:`~prefetch.BackgroundLoader`,
``prefetch_generator.BackgroundGenerator`` and :mod:`prefetch.compat`'s
drop-in replacement (all with the same ``depth`` / ``max_prefetch``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator
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
)
from prefetch.compat import BackgroundGenerator as CompatGenerator

__all__ = ["DEPTHS", "run"]

DEPTHS = (1, 2, 8, 64)
PLAIN = "plain range()"
FAMILIES: dict[str, Callable[[Iterable[int], int], Iterator[Any]]] = {
    "BackgroundLoader": lambda source, depth: iter(BackgroundLoader(source, depth=depth)),
    "prefetch_generator.BackgroundGenerator": lambda source, depth: (
        prefetch_generator.BackgroundGenerator(iter(source), max_prefetch=depth)
    ),
    "prefetch.compat.BackgroundGenerator": lambda source, depth: CompatGenerator(
        iter(source), max_prefetch=depth
    ),
}
REFERENCE = "prefetch_generator.BackgroundGenerator"


def _epoch(make: Callable[[], Iterable[int]]) -> Measure:
    started = time.perf_counter()
    for _ in make():
        pass
    return {"seconds": time.perf_counter() - started}


def run(config: Config) -> WorkloadResult:
    """Measure the per-item hand-off overhead; see the module docstring."""
    items = config.size(10_000, 2_000)
    variants: dict[str, Callable[[], Measure]] = {PLAIN: lambda: _epoch(lambda: range(items))}
    for depth in DEPTHS:
        for family, make in FAMILIES.items():
            variants[f"{family} d={depth}"] = functools.partial(
                _epoch, functools.partial(make, range(items), depth)
            )
    samples = interleave(variants, config.repeats, "handoff ", warmup=config.warmup)
    plain = [run["seconds"] for run in samples[PLAIN]]

    def overheads(name: str) -> list[float]:
        return [
            (run["seconds"] - base) / items * 1e6
            for run, base in zip(samples[name], plain, strict=True)
        ]

    result = WorkloadResult(
        name="handoff",
        title="Hand-off overhead per item",
        status="ok",
        description=(
            f"{items} tiny items (ints from range()), empty loop body: microseconds per "
            "item added over iterating range() directly. Same depth / max_prefetch for "
            "every wrapper. Ratio: median over repeats of overhead / overhead of "
            "prefetch_generator at the same depth."
        ),
        baseline=REFERENCE,
        params={"items": items, "depths": list(DEPTHS), "repeats": config.repeats},
        columns=[
            Column("depth", "depth", "{:.0f}"),
            Column("us_per_item", "overhead µs/item", "{:.2f}"),
            Column("ratio", "vs prefetch_generator", "{:.2f}x"),
        ],
        plot="line",
        spread_key="us_per_item",
    )
    per_item = median(plain) / items * 1e6
    result.rows.append(
        Row(PLAIN, {"depth": 0.0, "us_per_item": 0.0, "ratio": float("nan")}, {"seconds": plain})
    )
    result.notes.append(
        "Each wrapper wakes the other thread about twice per depth items when the consumer is "
        "faster than the producer (as here), so small depths pay a thread switch per item or two."
    )
    result.notes.append(f"Plain iteration itself costs {per_item * 1000:.0f} ns per item.")
    for depth in DEPTHS:
        reference = overheads(f"{REFERENCE} d={depth}")
        for family in FAMILIES:
            name = f"{family} d={depth}"
            mine = overheads(name)
            ratios = [m / r for m, r in zip(mine, reference, strict=True) if r > 0]
            result.rows.append(
                Row(
                    name,
                    {"depth": float(depth), "us_per_item": median(mine), "ratio": median(ratios)},
                    {"us_per_item": mine, "seconds": [s["seconds"] for s in samples[name]]},
                )
            )
    ours = {int(r.values["depth"]): r for r in result.rows if r.variant.startswith("Background")}
    for depth in DEPTHS:
        ratio = float(ours[depth].values["ratio"])
        limit = 0.5 if depth >= 8 else 1.0
        result.targets.append(
            Target(
                f"hand-off d={depth}: BackgroundLoader <= {limit:g}x prefetch_generator",
                ratio <= limit,
                f"{ratio:.2f}x ({float(ours[depth].values['us_per_item']):.2f} µs/item)",
            )
        )
    return result
