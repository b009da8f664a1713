"""Workload ``autostart``: ``fetch_threads="auto"`` in a new loader's first epoch.

Issue 34's setting: JPEGs read after 20 ms of storage latency, decoded with
PIL and resized to 128x128, in batches of 64; 512 of them (8 batches an
epoch) and 2048 (32 batches). One epoch of a new
``BackgroundLoader(DataLoader(...), fetch_threads=N)`` per fresh process,
for ``"auto"`` and for fixed counts 4, 8, 16 and 32, interleaved, with a
timing of the decoding in this process that gives each repeat its physical
limit (:class:`benchmarks.latency_runs.Limit`). ``"auto"`` is judged against
the best fixed count *of the same repeat* (the one with the most images/s),
on throughput and on its first batch. Every ``"auto"`` run records its
``thread_events``; the report shows the ramp of the median run and plots
each size's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Column,
    Config,
    Measure,
    Row,
    Samples,
    Target,
    WorkloadResult,
    interleave,
    median,
    paired_ratios,
    values_of,
)
from benchmarks.jpeg_files import write_jpegs
from benchmarks.jpeg_variants import available
from benchmarks.latency_runs import (
    LATENCY,
    Events,
    decode_runner,
    epoch_columns,
    fresh_runner,
    jpeg_spec,
    limits,
    median_limit,
)

__all__ = ["AUTO", "FIXED", "SIZES", "ramp_text", "run"]

SIDE, BATCH, QUICK_BATCH = 128, 64, 8
SIZES, QUICK_SIZES = (512, 2048), (32,)
FIXED, QUICK_FIXED = (4, 8, 16, 32), (16,)
AUTO = "auto"
SPEED_TARGET, FIRST_TARGET = 0.9, 1.2
"""'auto' at least 0.9x the best fixed count's images/s, its first batch at most 1.2x that
count's (issue 34)."""
DECODE = "decode in this process"


def _name(images: int, level: int | str) -> str:
    shown = f"'{level}'" if level == AUTO else str(level)
    return f"{images} images: fetch_threads={shown}"


def _best(samples: Samples, images: int, fixed: tuple[int, ...]) -> list[str]:
    """Per repeat, the fixed count's variant with the most images/s in that repeat."""
    names = [_name(images, count) for count in fixed]
    repeats = len(samples[names[0]])
    return [
        max(names, key=lambda name: samples[name][repeat]["items_per_second"])
        for repeat in range(repeats)
    ]


def _vs_best(samples: Samples, name: str, best: list[str], key: str) -> list[float]:
    """Per repeat, ``name``'s ``key`` over the best fixed count's of that repeat."""
    theirs = [samples[winner][repeat][key] for repeat, winner in enumerate(best)]
    return paired_ratios(values_of(samples, name, key), theirs)


def ramp_text(events: Events) -> str:
    """The ramp of one epoch in words: each change of the count, when and why.

    Example:
        >>> ramp_text([{"item": 0, "seconds": 0.021, "old": 2, "new": 32,
        ...             "reason": "start: reads 20 ms"}])
        '0.021 s (item 0): 2 -> 32 (start: reads 20 ms)'
        >>> ramp_text([])
        'no thread_events recorded'
    """
    if not events:
        return "no thread_events recorded"
    return "; ".join(
        f"{event['seconds']:.3f} s (item {event['item']}): {event['old']} -> {event['new']} "
        f"({event['reason']})"
        for event in events
    )


def _median_run(seconds: list[float]) -> int:
    """The index of the run whose epoch time is the median (the lower one of an even count)."""
    order = sorted(range(len(seconds)), key=lambda index: seconds[index])
    return order[(len(order) - 1) // 2]


def run(config: Config) -> WorkloadResult:
    """Write the JPEGs, run every count interleaved, and report; see the module docstring."""
    sizes = QUICK_SIZES if config.quick else SIZES
    fixed = QUICK_FIXED if config.quick else FIXED
    batch = config.size(BATCH, QUICK_BATCH)
    reason = available("threads")
    if reason:
        return WorkloadResult(name="autostart", title="autostart", status="skipped", reason=reason)
    variants: dict[str, Callable[[], Measure]] = {}
    traces: dict[int, list[Events]] = {images: [] for images in sizes}
    with tempfile.TemporaryDirectory(prefix="prefetch-bench-autostart-") as folder:
        write_jpegs(Path(folder), max(sizes))
        variants[DECODE] = decode_runner(Path(folder), SIDE)
        levels: tuple[int | str, ...] = (AUTO, *fixed)
        for images in sizes:
            for level in levels:
                spec = jpeg_spec(folder, images, SIDE, batch, "threads", level)
                ignored: list[Events] = []
                keep = traces[images] if level == AUTO else ignored
                variants[_name(images, level)] = fresh_runner(spec, keep)
        samples = interleave(variants, config.repeats, "autostart", warmup=False)
    result = WorkloadResult(
        name="autostart",
        title="fetch_threads='auto' in a new loader's first epoch",
        status="ok",
        description=(
            f"JPEG files (500x375) each read after {LATENCY * 1e3:.0f} ms of storage latency, "
            f"decoded with PIL and resized to {SIDE}x{SIDE}, in batches of {batch}, by "
            "BackgroundLoader(DataLoader(num_workers=0), fetch_threads=N); no training step. "
            "One epoch of a new loader per run, each in a fresh process, timed from building "
            "the loader to the last batch. 'vs best fixed' and 'first batch vs best fixed': median "
            f"over repeats of this / the best fixed count of that repeat (of {fixed}, the one "
            "with the most images/s). 'limit s': the physical limit at the thread count (for "
            "'auto' at its peak), the later of reads x latency / threads and decoding x CPU "
            "per image (timed in the benchmark's process in the same repeat) / cores."
        ),
        baseline=_name(sizes[0], fixed[-1]),
        params={
            "sizes": list(sizes),
            "fixed": list(fixed),
            "batch_size": batch,
            "side": SIDE,
            "latency_ms": LATENCY * 1e3,
            "repeats": config.repeats,
        },
        columns=[
            *epoch_columns("best fixed"),
            Column("peak_fetch_threads", "peak threads", "{:.0f}"),
            Column("limit", "limit s", "{:.3f}"),
        ],
        plot="ramp",
        trace={"kind": "threads", "runs": []},
    )
    for images in sizes:
        result.rows += _size_rows(samples, images, fixed)
        result.targets += _size_targets(samples, images, fixed, batch, traces[images])
        result.notes += _size_notes(samples, images, fixed, traces[images])
        result.trace["runs"].append(_trace(samples, images, traces[images]))
    return result


def _size_rows(samples: Samples, images: int, fixed: tuple[int, ...]) -> list[Row]:
    best = _best(samples, images, fixed)
    rows = []
    levels: tuple[int | str, ...] = (AUTO, *fixed)
    for level in levels:
        name = _name(images, level)
        keys = ("seconds", "items_per_second", "first_batch_seconds", "peak_fetch_threads")
        raw = {key: values_of(samples, name, key) for key in keys}
        raw["speed_ratio"] = _vs_best(samples, name, best, "items_per_second")
        raw["first_ratio"] = _vs_best(samples, name, best, "first_batch_seconds")
        values: dict[str, float | str] = {key: median(series) for key, series in raw.items()}
        peak = float(values["peak_fetch_threads"])
        threads = level if isinstance(level, int) else int(peak) if peak == peak else 1
        values["limit"] = median(
            [limit.seconds for limit in limits(samples, DECODE, images, threads)]
        )
        rows.append(Row(name, values, raw))
    return rows


def _size_targets(
    samples: Samples, images: int, fixed: tuple[int, ...], batch: int, traces: list[Events]
) -> list[Target]:
    best = _best(samples, images, fixed)
    auto = _name(images, AUTO)
    speed = median(_vs_best(samples, auto, best, "items_per_second"))
    first = median(_vs_best(samples, auto, best, "first_batch_seconds"))
    setting = (
        f"autostart {images} images ({-(-images // batch)} batches of {batch}), "
        f"{LATENCY * 1e3:.0f} ms reads"
    )
    ramped = sum(any(e["new"] != e["old"] for e in events) for events in traces)
    epochs = values_of(samples, auto, "seconds")
    outside = sum(
        any(not 0.0 <= e["seconds"] <= epoch for e in events)
        for events, epoch in zip(traces, epochs, strict=True)
    )
    return [
        Target(
            f"{setting}: fetch_threads='auto' first epoch >= {SPEED_TARGET:g}x the best fixed "
            f"count (of {', '.join(map(str, fixed))}; per repeat)",
            speed >= SPEED_TARGET,
            f"{speed:.2f}x",
        ),
        Target(
            f"{setting}: fetch_threads='auto' first batch <= {FIRST_TARGET:g}x the best fixed "
            "count's",
            first <= FIRST_TARGET,
            f"{first:.2f}x",
        ),
        Target(
            f"{setting}: fetch_threads='auto' shows its ramp in thread_events (every run: a "
            "change of count, every event within the epoch)",
            ramped == len(traces) > 0 and not outside,
            f"a change of count in {ramped} of {len(traces)} runs; an event outside the "
            f"epoch's seconds in {outside}",
        ),
    ]


def _size_notes(
    samples: Samples, images: int, fixed: tuple[int, ...], traces: list[Events]
) -> list[str]:
    best = _best(samples, images, fixed)
    winners = ", ".join(name.rsplit("=", 1)[1] for name in best)
    limit = median_limit(limits(samples, DECODE, images, max(fixed)))
    seconds = values_of(samples, _name(images, AUTO), "seconds")
    index = _median_run(seconds)
    return [
        f"{images} images: the best fixed count per repeat: {winners}. Physical limit at "
        f"{max(fixed)} threads: {limit.describe()} (medians).",
        f"{images} images, fetch_threads='auto', the median run's ramp (epoch "
        f"{seconds[index]:.3f} s): {ramp_text(traces[index])}.",
    ]


def _trace(samples: Samples, images: int, traces: list[Events]) -> dict[str, Any]:
    """The median 'auto' run of ``images``: its epoch, first batch, peak and thread_events."""
    auto = _name(images, AUTO)
    seconds = values_of(samples, auto, "seconds")
    index = _median_run(seconds)
    run = samples[auto][index]
    return {
        "images": images,
        "seconds": seconds[index],
        "first_batch_seconds": run["first_batch_seconds"],
        "peak_fetch_threads": run.get("peak_fetch_threads", float("nan")),
        "events": traces[index],
    }
