"""Workload ``jpeg``: parallel loading of real JPEG files, threads against worker processes.

A few hundred 500x375 JPEGs are written to a temporary folder at bench
time; each item is read, decoded with PIL, resized to 224x224 and turned
into a uint8 tensor, and batches are collated (:mod:`benchmarks.jpeg_files`).
Two settings: ``local`` (files in the page cache: decoding is the work) and
``latency`` (each read first sleeps 20 ms, as object storage answers).

The same batches, at the same concurrency, come from ``DataLoader``
(``num_workers`` 0, 2, 16), ``BackgroundLoader(DataLoader(num_workers=0),
fetch_threads=N)`` (2, 16, ``"auto"``), torchdata.nodes
``ParallelMapper(method="thread")`` and an SPDL pipeline (2, 16). Every
method fetches and collates whole batches (one task per batch), as the
DataLoader does. Each run is a fresh process (:mod:`benchmarks.parallel_child`)
whose summed PSS, with its worker processes, is sampled from outside
(:mod:`benchmarks.memory`). Runs are interleaved across variants and
settings; ratios are medians of per-repeat ratios.
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
    WorkloadResult,
    interleave,
    median,
    median_ratio,
    values_of,
)
from benchmarks.jpeg_files import HEIGHT, SIDE, WIDTH, write_jpegs
from benchmarks.jpeg_targets import targets
from benchmarks.jpeg_variants import (
    AUTOS,
    BATCH,
    LABELS,
    LATENCY,
    QUICK_BATCH,
    SETTINGS,
    Variant,
    available,
    plan,
)
from benchmarks.memory import INTERVAL, run_child

__all__ = ["run"]


def _runner(spec: dict[str, Any]) -> Callable[[], Measure]:
    """A callable that runs ``spec`` in a fresh process and returns its figures."""

    def run_once() -> Measure:
        report = run_child(spec)
        measure = {key: float(value) for key, value in report.items() if value is not None}
        measure["growth_mib"] = measure["peak_pss_mib"] - measure["start_pss_mib"]
        return measure

    return run_once


def _row(samples: dict[str, list[Measure]], variant: Variant, reason: str) -> Row:
    """The row of ``variant``: medians, ratios to the DataLoader's, or blanks and the reason.

    ``items`` and ``checksum`` (labels weighted by delivery position) are the
    same in every run of every variant that delivered the same batches in
    the same order.
    """
    values: dict[str, float | str] = {
        "setting": variant.setting,
        "loader": variant.label,
        "method": variant.method,
        "concurrency": str(variant.concurrency),
        "note": "not available" if reason else "",
    }
    keys = (
        "items_per_second",
        "first_batch_seconds",
        "peak_pss_mib",
        "growth_mib",
        "seconds",
        "items",
        "checksum",
        "pss_processes",
    )
    if reason:
        values.update(dict.fromkeys(keys, float("nan")))
        values.update({"vs_2": float("nan"), "vs_16": float("nan")})
        return Row(variant.name, values)
    raw = {key: values_of(samples, variant.name, key) for key in keys}
    values.update({key: median(raw[key]) for key in keys})
    for column, workers in (("vs_2", 2), ("vs_16", 16)):
        base = Variant(variant.setting, "dataloader", workers).name
        values[column] = (
            median_ratio(samples, variant.name, base, "items_per_second")
            if base in samples
            else float("nan")
        )
    if variant.concurrency in AUTOS:
        threads = [run.get("peak_fetch_threads", float("nan")) for run in samples[variant.name]]
        values["note"] = f"peak threads {median(threads):.0f}"
        raw["peak_fetch_threads"] = threads
    return Row(variant.name, values, raw)


def run(config: Config) -> WorkloadResult:
    """Write the JPEGs, run every variant interleaved, and report; see the module docstring."""
    count = config.size(512, 24)
    batch = config.size(BATCH, QUICK_BATCH)
    variants = plan(config)
    reasons = {variant.name: available(variant.method) for variant in variants}
    repeats = min(config.repeats, 3)
    with tempfile.TemporaryDirectory(prefix="prefetch-bench-jpeg-") as folder:
        write_jpegs(Path(folder), count)
        specs = {
            variant.name: {
                "workload": "jpeg",
                "method": variant.method,
                "concurrency": variant.concurrency,
                "batch_size": batch,
                "folder": folder,
                "count": count,
                "latency": SETTINGS[variant.setting],
            }
            for variant in variants
            if not reasons[variant.name]
        }
        samples = interleave(
            {name: _runner(spec) for name, spec in specs.items()}, repeats, "jpeg    ", warmup=False
        )
    result = WorkloadResult(
        name="jpeg",
        title="Parallel loading of JPEG files: threads and worker processes",
        status="ok",
        description=(
            f"{count} JPEG files ({WIDTH}x{HEIGHT}, quality 90, written at bench time), each "
            f"read, decoded with PIL, resized to {SIDE}x{SIDE} and made a uint8 tensor; batches "
            f"of {batch} collated with default_collate; no training step (pure loading). "
            f"'local': files in the page cache; 'latency': each read first sleeps "
            f"{LATENCY * 1e3:.0f} ms. One epoch per run, in a fresh process, timed from building "
            "the loader (worker, thread and pipeline start-up included) to the last batch. "
            "Every method fetches and collates whole batches, in sampler order. 'vs w=2' and "
            "'vs w=16': median over repeats of this throughput / DataLoader(num_workers=2 or 16)'s "
            "in the same setting. Peak PSS: most memory (proportional set size, "
            f"/proc/<pid>/smaps_rollup) summed over the process and its workers, sampled every "
            f"{INTERVAL * 1e3:.0f} ms; growth: peak minus the process's PSS before the loader "
            "was built."
        ),
        baseline=Variant("local", "dataloader", 2).name,
        params={
            "images": count,
            "batch_size": batch,
            "latency_ms": LATENCY * 1e3,
            "repeats": repeats,
        },
        columns=[
            Column("items_per_second", "images/s", "{:.0f}"),
            Column("vs_2", "vs w=2", "{:.2f}x"),
            Column("vs_16", "vs w=16", "{:.2f}x"),
            Column("first_batch_seconds", "first batch s", "{:.3f}"),
            Column("peak_pss_mib", "peak PSS MiB", "{:.0f}"),
            Column("growth_mib", "growth MiB", "{:.0f}"),
            Column("note", "note", "{}"),
        ],
        plot="scaling",
    )
    result.rows = [_row(samples, variant, reasons[variant.name]) for variant in variants]
    result.targets = targets(config, samples, reasons)
    cpu = [run["sampler_cpu_share"] for runs in samples.values() for run in runs]
    if cpu:
        result.notes.append(
            f"The memory sampler shares the cores with what it measures: it took {median(cpu):.0%} "
            f"of one core (median over runs; at most {max(cpu):.0%}, more with more worker "
            "processes: one /proc read per process per sample)."
        )
    for method in dict.fromkeys(variant.method for variant in variants):
        reason = available(method)
        if reason:
            result.notes.append(f"{LABELS[method].format('N')}: {reason}.")
    return result
