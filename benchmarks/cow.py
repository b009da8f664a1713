"""Workload ``cow``: the copy-on-write growth of worker processes over a large Python list.

A dataset holds a million file names in a Python list
(:class:`benchmarks.jpeg_files.NameList`); one epoch reads every name once,
in a seeded random order, in batches of 1000. Forked DataLoader workers
share the parent's pages until they touch them, and reading a name touches
it: Python writes its reference count, so the page holding it is copied
into the worker (pytorch/pytorch#13246). Threads read the same names in one
process and copy nothing. Each run is a fresh process; its summed PSS, with
its workers, is sampled from outside (:mod:`benchmarks.memory`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.common import Column, Config, Measure, Row, WorkloadResult, interleave, median
from benchmarks.jpeg_variants import available
from benchmarks.memory import run_child

__all__ = ["BATCH", "run"]

BATCH = 1000


def _variants(config: Config) -> list[tuple[str, str, int]]:
    """(label, method, concurrency) of every run, the one-process reference first."""
    levels = (2,) if config.quick else (2, 8)
    variants = [("DataLoader num_workers=0", "dataloader", 0)]
    for level in levels:
        variants.append((f"DataLoader num_workers={level}", "dataloader", level))
        variants.append((f"BackgroundLoader fetch_threads={level}", "threads", level))
    return variants


def _runner(spec: dict[str, Any]) -> Callable[[], Measure]:
    def run_once() -> Measure:
        report = run_child(spec)
        measure = {key: float(value) for key, value in report.items() if value is not None}
        measure["growth_mib"] = measure["peak_pss_mib"] - measure["start_pss_mib"]
        return measure

    return run_once


def run(config: Config) -> WorkloadResult:
    """Run every variant (interleaved) and report summed PSS; see the module docstring."""
    names = config.size(1_000_000, 100_000)
    variants = _variants(config)
    reasons = {label: available(method) for label, method, _ in variants}
    runners = {
        label: _runner(
            {
                "workload": "cow",
                "method": method,
                "concurrency": level,
                "batch_size": BATCH,
                "names": names,
                "items": names,
            }
        )
        for label, method, level in variants
        if not reasons[label]
    }
    repeats = min(config.repeats, 2)
    samples = interleave(runners, repeats, "cow     ", warmup=False)
    result = WorkloadResult(
        name="cow",
        title="Copy-on-write growth over a large Python list",
        status="ok",
        description=(
            f"A dataset holding {names:,} file names in a Python list; one epoch reads every "
            f"name once, shuffled, in batches of {BATCH} (an item is the name's length). Start "
            "PSS: the process before the loader is built (the list included); peak PSS: most "
            "memory summed over the process and its workers during the epoch; growth: peak "
            "minus start, what loading added; per worker: growth / concurrency."
        ),
        baseline="DataLoader num_workers=0",
        params={"names": names, "batch_size": BATCH, "repeats": repeats},
        columns=[
            Column("start_pss_mib", "start PSS MiB", "{:.0f}"),
            Column("peak_pss_mib", "peak PSS MiB", "{:.0f}"),
            Column("growth_mib", "growth MiB", "{:.0f}"),
            Column("per_worker_mib", "growth per worker/thread MiB", "{:.1f}"),
            Column("seconds", "epoch s", "{:.2f}"),
            Column("note", "note", "{}"),
        ],
        plot="bar",
        plot_key="growth_mib",
    )
    keys = ("start_pss_mib", "peak_pss_mib", "growth_mib", "seconds", "items")
    for label, _, level in variants:
        if reasons[label]:
            blank: dict[str, float | str] = dict.fromkeys(keys, float("nan"))
            blank.update({"per_worker_mib": float("nan"), "note": reasons[label]})
            result.rows.append(Row(label, blank))
            continue
        raw = {key: [run[key] for run in samples[label]] for key in keys}
        values: dict[str, float | str] = {key: median(raw[key]) for key in keys}
        growth = float(values["growth_mib"])
        values["per_worker_mib"] = growth / level if level else float("nan")
        values["note"] = ""
        result.rows.append(Row(label, values, raw))
    result.notes.append(
        "A forked worker starts sharing every page of its parent; the pages it writes (the "
        "names it reads, and whatever else the worker's interpreter touches) become its own. "
        "Threads share one heap: reading the names copies nothing, so their growth is the "
        "batches in flight."
    )
    return result
