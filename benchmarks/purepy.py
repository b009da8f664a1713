"""Workload ``purepy``: pure-Python loading, threads against worker processes, GIL or not.

Every item is parsed from a text record in Python alone, about 2 ms of CPU
on CPython 3.11 and no I/O (:mod:`benchmarks.records`): the case where threads
cannot help on an interpreter with a GIL and worker processes are the usual
answer. The same epoch runs as ``DataLoader(num_workers=0)`` (plain), as
``DataLoader(num_workers=2)``, as ``BackgroundLoader(DataLoader(...),
fetch_threads=N)`` for N 1, 2 and ``"auto"``, and, as a reference for how
far the work scales in threads at all, as torchdata's
``ParallelMapper(method="thread")`` with 2 threads, on this interpreter and, when
there is one, on a free-threaded CPython with ``PYTHON_GIL=0``: ``PYTHON_FT``
(an interpreter with torch installed) or else the ``.venv-ft`` that
``make test-ft`` makes. Each run is a fresh process whose summed PSS, with its
worker processes, is sampled from outside (:mod:`benchmarks.memory`); runs
of both interpreters are interleaved and ratios are medians of per-repeat
ratios. Targets (issue 23) hold on the free-threaded interpreter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Column,
    Config,
    Measure,
    Row,
    Target,
    WorkloadResult,
    interleave,
    median,
    median_ratio,
    values_of,
)
from benchmarks.jpeg_variants import available
from benchmarks.memory import INTERVAL, ROOT, run_child
from benchmarks.records import WORDS

__all__ = ["BATCH", "QUICK_BATCH", "Interpreter", "free_threaded", "run"]

BATCH = 64
"""Records per batch: what people train with (a quick run uses :data:`QUICK_BATCH`)."""
QUICK_BATCH = 16
FULL = (
    ("dataloader", 0),
    ("dataloader", 2),
    ("threads", 1),
    ("threads", 2),
    ("threads", "auto"),
    ("parallel_mapper", 2),
)
"""Every variant of a full run; torchdata's ParallelMapper (threads, not prefetch's) shows how
far the work itself scales in threads on each interpreter."""
QUICK = (("dataloader", 0), ("dataloader", 2), ("threads", 2))
PROBE = (
    "import json, platform, sys, sysconfig, torch; print(json.dumps({'version': "
    "platform.python_version(), 'ft': sysconfig.get_config_var('Py_GIL_DISABLED') == 1, "
    "'torch': torch.__version__}))"
)


@dataclasses.dataclass(frozen=True)
class Interpreter:
    """A Python to run children with: its label (``3.11``, ``3.13t``), path, extra variables."""

    label: str
    python: str
    version: str
    torch: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)


def _probe(python: str) -> Interpreter:
    """Describe ``python``: run it once (it must import torch); free-threaded ones get GIL=0."""
    done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        msg = f"{python} cannot import torch: {done.stderr.strip().splitlines()[-1:]}"
        raise RuntimeError(msg)
    info = json.loads(done.stdout.strip().splitlines()[-1])
    label = ".".join(str(info["version"]).split(".")[:2]) + ("t" if info["ft"] else "")
    env = {"PYTHON_GIL": "0"} if info["ft"] else {}  # a GIL build refuses PYTHON_GIL=0
    return Interpreter(label, python, str(info["version"]), str(info["torch"]), env)


def free_threaded(root: Path = ROOT) -> tuple[Interpreter | None, str]:
    """Return the free-threaded interpreter to compare with, or None and why there is none."""
    python = os.environ.get("PYTHON_FT") or str(root / ".venv-ft" / "bin" / "python")
    if not os.environ.get("PYTHON_FT") and not Path(python).exists():
        return None, "no free-threaded Python (PYTHON_FT unset, no .venv-ft: make test-ft makes it)"
    try:
        found = _probe(python)
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as error:
        return None, f"the free-threaded Python cannot run the benchmark: {error}"
    if not found.env:
        return None, f"{python} is not a free-threaded Python"
    return found, ""


def _interpreters() -> tuple[list[Interpreter], str]:
    """This interpreter, then the free-threaded one (when this one has a GIL and one exists)."""
    this = _probe(sys.executable)
    if this.env:
        return [this], "this interpreter is free-threaded (run make bench on 3.11 for both)"
    other, reason = free_threaded()
    return ([this, other] if other else [this]), reason


def _name(interpreter: Interpreter, method: str, level: int | str) -> str:
    if method == "dataloader":
        return f"{interpreter.label} DataLoader num_workers={level}"
    if method == "parallel_mapper":
        return f"{interpreter.label} ParallelMapper(thread) x{level}"
    return f"{interpreter.label} fetch_threads={level}"


def _runner(spec: dict[str, Any], interpreter: Interpreter) -> Callable[[], Measure]:
    def run_once() -> Measure:
        report = run_child(spec, python=interpreter.python, env=interpreter.env)
        measure = {key: float(value) for key, value in report.items() if value is not None}
        measure["growth_mib"] = measure["peak_pss_mib"] - measure["start_pss_mib"]
        return measure

    return run_once


def _row(samples: dict[str, list[Measure]], interpreter: Interpreter, name: str) -> Row:
    keys = (
        "items_per_second",
        "seconds",
        "peak_pss_mib",
        "growth_mib",
        "items",
        "checksum",
        "gil_enabled",
    )
    raw = {key: values_of(samples, name, key) for key in keys}
    values: dict[str, float | str] = {key: median(raw[key]) for key in keys}
    plain = _name(interpreter, "dataloader", 0)
    workers = _name(interpreter, "dataloader", 2)
    values["interpreter"] = interpreter.label
    values["vs_plain"] = median_ratio(samples, name, plain, "items_per_second")
    values["vs_w2"] = median_ratio(samples, name, workers, "items_per_second")
    values["pss_vs_w2"] = median_ratio(samples, name, workers, "peak_pss_mib")
    values["growth_vs_w2"] = median_ratio(samples, name, workers, "growth_mib")
    notes = ["the GIL came on"] if interpreter.env and any(raw["gil_enabled"]) else []
    threads = [run.get("peak_fetch_threads", float("nan")) for run in samples[name]]
    if name.endswith("=auto"):
        notes.append(f"peak threads {median(threads):.0f}")
    values["note"] = ", ".join(notes)
    return Row(name, values, raw)


def _targets(
    samples: dict[str, list[Measure]], interpreters: list[Interpreter], why: str
) -> list[Target]:
    """The issue's three targets, each a MISS that says why when it could not be measured."""
    gil = next((i for i in interpreters if not i.env), None)
    ft = next((i for i in interpreters if i.env), None)
    names = [
        ("free-threaded: fetch_threads=2 >= 0.9x DataLoader(num_workers=2) throughput", 0.9),
        ("free-threaded: fetch_threads=2 summed PSS <= 0.5x DataLoader(num_workers=2)'s", 0.5),
        ("fetch_threads=2 free-threaded >= 1.6x fetch_threads=2 with the GIL", 1.6),
    ]
    if ft is None or gil is None:
        why = why or "no interpreter with a GIL ran"
        return [Target(name, False, f"not measured: {why}") for name, _ in names]
    threads, workers = _name(ft, "threads", 2), _name(ft, "dataloader", 2)
    ratios = [
        median_ratio(samples, threads, workers, "items_per_second"),
        median_ratio(samples, threads, workers, "peak_pss_mib"),
        median_ratio(samples, threads, _name(gil, "threads", 2), "items_per_second"),
    ]
    details = [
        f"{ratios[0]:.2f}x throughput on {ft.label}",
        f"{ratios[1]:.2f}x summed PSS on {ft.label}",
        f"{ratios[2]:.2f}x throughput, {ft.label} over {gil.label}",
    ]
    if all("growth_mib" in run for run in samples[threads] + samples[workers]):
        growth = median_ratio(samples, threads, workers, "growth_mib")
        details[1] += f" (growth over the process's start: {growth:.2f}x)"
    passed = [ratios[0] >= names[0][1], ratios[1] <= names[1][1], ratios[2] >= names[2][1]]
    return [
        Target(name, ok, detail)
        for (name, _), ok, detail in zip(names, passed, details, strict=True)
    ]


def run(config: Config) -> WorkloadResult:
    """Run every variant on each interpreter, interleaved, and report; see the module docstring."""
    records = config.size(2048, 64)
    batch = config.size(BATCH, QUICK_BATCH)
    interpreters, why = _interpreters()
    plan = [v for v in (QUICK if config.quick else FULL) if not available(v[0])]
    runners: dict[str, Callable[[], Measure]] = {}
    for interpreter in interpreters:
        for method, level in plan:
            spec = {"workload": "purepy", "method": method, "concurrency": level}
            spec.update({"batch_size": batch, "records": records, "words": WORDS})
            runners[_name(interpreter, method, level)] = _runner(spec, interpreter)
    repeats = min(config.repeats, 3)
    samples = interleave(runners, repeats, "purepy  ", warmup=False)
    result = WorkloadResult(
        name="purepy",
        title="Pure-Python loading: threads and worker processes, with and without the GIL",
        status="ok",
        description=(
            f"{records} synthetic text records held in a Python list; each item parses one "
            f"({WORDS} words: fields split, text tokenised character by character, tokens and "
            "character trigrams hashed in Python into 256 counts; about 2 ms of CPU on 3.11, no "
            f"I/O); batches of {batch}; no training step. One epoch per run, in a fresh process "
            "(free-threaded ones with PYTHON_GIL=0), timed from building the loader to the last "
            "batch. ParallelMapper(thread): torchdata's thread pool over the same batches, "
            "a reference for how far the work itself scales in threads. 'vs plain' and "
            "'vs w=2': median over repeats of this throughput / "
            "DataLoader(num_workers=0 or 2)'s on the same interpreter; 'PSS vs w=2' the same for "
            "peak PSS, summed over the process and its workers, sampled every "
            f"{INTERVAL * 1e3:.0f} ms; growth: that peak minus the process's PSS before the "
            "loader is built (the records included), the memory the loading itself costs."
        ),
        baseline=_name(interpreters[0], "dataloader", 0),
        params={
            "records": records,
            "words": WORDS,
            "batch_size": batch,
            "repeats": repeats,
            "interpreters": {i.label: f"Python {i.version}, torch {i.torch}" for i in interpreters},
        },
        columns=[
            Column("items_per_second", "samples/s", "{:.0f}"),
            Column("vs_plain", "vs plain", "{:.2f}x"),
            Column("vs_w2", "vs w=2", "{:.2f}x"),
            Column("seconds", "epoch s", "{:.2f}"),
            Column("peak_pss_mib", "peak PSS MiB", "{:.0f}"),
            Column("pss_vs_w2", "PSS vs w=2", "{:.2f}x"),
            Column("growth_mib", "growth MiB", "{:.0f}"),
            Column("growth_vs_w2", "growth vs w=2", "{:.2f}x"),
            Column("note", "note", "{}"),
        ],
        plot="bar",
        plot_key="items_per_second",
    )
    result.rows = [
        _row(samples, interpreter, _name(interpreter, method, level))
        for interpreter in interpreters
        for method, level in plan
    ]
    result.targets = _targets(samples, interpreters, why)
    for interpreter in interpreters:
        result.notes.append(
            f"{interpreter.label}: Python {interpreter.version}, torch {interpreter.torch}."
        )
    if why:
        result.notes.append(f"Only one interpreter: {why}.")
    return result
