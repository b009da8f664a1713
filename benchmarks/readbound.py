"""Workload ``readbound``: 20 ms reads at 16 threads, against the fastest thread pipelines.

Issue 34's two settings, each JPEG read after 20 ms of storage latency and
decoded with PIL (:mod:`benchmarks.jpeg_files`), with 16 threads:

* 256 JPEGs resized to 224x224 (150 KB a sample), batches of 8:
  ``BackgroundLoader(DataLoader(...), fetch_threads=16)`` against torchdata's
  ``ParallelMapper(method="thread")`` over batches (each task reads and
  collates a batch, as the ``jpeg`` workload runs it);
* 512 JPEGs resized to 128x128, batches of 64: the same against the
  sample-level pipeline, torchdata.nodes ``ParallelMapper`` over single
  samples, then ``Batcher(64)``, then a collating ``Mapper``.

Every epoch is a new loader in a fresh process, the variants interleaved
with each other and with a timing of the decoding in this process, which
gives each repeat its physical limit (:class:`benchmarks.latency_runs.Limit`:
the later of reads x latency / threads and decoding CPU / cores); ratios
are medians of per-repeat ratios.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

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
    median_ratio,
    paired_ratios,
    values_of,
)
from benchmarks.jpeg_files import write_jpegs
from benchmarks.jpeg_variants import LABELS as JPEG_LABELS
from benchmarks.jpeg_variants import available
from benchmarks.latency_runs import (
    LATENCY,
    Events,
    Limit,
    decode_runner,
    epoch_columns,
    fresh_runner,
    jpeg_spec,
    limits,
    median_limit,
)

__all__ = ["CASES", "LABELS", "QUICK_CASES", "THREADS", "Case", "run"]

THREADS = 16
OURS = "threads"
LABELS = {**JPEG_LABELS, "sample_mapper": "ParallelMapper(thread) over samples + Batcher x{}"}
"""The jpeg workload's loaders, and the sample-level pipeline (only here)."""
SPEED_TARGET = 1.05
"""fetch_threads=16 at least this times the other pipeline's throughput (issue 34)."""
LIMIT_TARGET = 0.9
"""fetch_threads=16 at least this share of the physical limit's speed (limit / epoch time)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One setting: how many JPEGs, resized to what, in batches of what, against whom."""

    images: int
    side: int
    batch: int
    rival: str
    first_batch_target: bool = False

    @property
    def name(self) -> str:
        """The setting, as rows and targets name it."""
        return f"{self.images} JPEGs to {self.side}x{self.side}, batch {self.batch}"

    def variant(self, method: str) -> str:
        """The row's name of ``method`` in this setting."""
        return f"{self.name}: {LABELS[method].format(THREADS)}"

    @property
    def decode_name(self) -> str:
        """The name of this setting's decode timing among the interleaved runs."""
        return f"{self.name}: decode in this process"


CASES = (
    Case(256, 224, 8, "parallel_mapper"),
    Case(512, 128, 64, "sample_mapper", first_batch_target=True),
)
QUICK_CASES = (
    Case(16, 224, 8, "parallel_mapper"),
    Case(32, 128, 16, "sample_mapper", first_batch_target=True),
)


def _runs(config: Config, cases: tuple[Case, ...], folder: Path) -> Samples:
    """Run every variant of ``cases`` interleaved, with each case's decode timing."""
    variants: dict[str, Callable[[], Measure]] = {}
    traces: list[Events] = []  # no ramp to show at a fixed count
    for case in cases:
        variants[case.decode_name] = decode_runner(folder, case.side)
        for method in (OURS, case.rival):
            if not available(method):
                spec = jpeg_spec(str(folder), case.images, case.side, case.batch, method, THREADS)
                variants[case.variant(method)] = fresh_runner(spec, traces)
    return interleave(variants, config.repeats, "readbound", warmup=False)


def _row(samples: Samples, case: Case, method: str, repeats: list[Limit]) -> Row:
    """The row of ``method`` in ``case``: medians, ratios to the other pipeline, the limit."""
    name, rival = case.variant(method), case.variant(case.rival)
    values: dict[str, float | str] = {"loader": LABELS[method].format(THREADS)}
    keys = ("seconds", "items_per_second", "first_batch_seconds", "items", "checksum")
    if name not in samples:
        ratios = ("of_limit", "speed_ratio", "first_ratio", "read_limit", "cpu_limit")
        values.update(dict.fromkeys((*keys, *ratios), float("nan")))
        values["note"] = available(method)
        return Row(name, values)
    raw = {key: values_of(samples, name, key) for key in keys}
    values.update({key: median(raw[key]) for key in keys})
    shares = paired_ratios([limit.seconds for limit in repeats], raw["seconds"])
    raw["of_limit"] = shares
    values["of_limit"] = median(shares)
    values["read_limit"] = repeats[0].reads
    values["cpu_limit"] = median([limit.cpu for limit in repeats])
    both = rival in samples
    values["speed_ratio"] = (
        median_ratio(samples, name, rival, "items_per_second") if both else float("nan")
    )
    values["first_ratio"] = (
        median_ratio(samples, name, rival, "first_batch_seconds") if both else float("nan")
    )
    values["note"] = ""
    return Row(name, values, raw)


def _targets(case: Case, rows: dict[str, Row], limit: Limit) -> list[Target]:
    """Issue 34's targets in ``case``: throughput and first batch against the rival, the limit."""
    ours, rival = rows[case.variant(OURS)].values, rows[case.variant(case.rival)].values
    setting = f"readbound {case.name}, {THREADS} threads, {LATENCY * 1e3:.0f} ms reads"
    against = LABELS[case.rival].format(THREADS)
    missing = str(ours["note"] or rival["note"])
    speed, share = float(ours["speed_ratio"]), float(ours["of_limit"])
    checks = [
        (
            f"{setting}: fetch_threads={THREADS} >= {SPEED_TARGET:g}x {against} (images/s)",
            speed >= SPEED_TARGET,
            f"{speed:.2f}x",
        ),
        (
            f"{setting}: fetch_threads={THREADS} >= {LIMIT_TARGET:g} of the physical limit "
            "(limit / epoch time)",
            share >= LIMIT_TARGET,
            f"{share:.2f} (limit {limit.describe()})",
        ),
    ]
    if case.first_batch_target:
        first = float(ours["first_ratio"])
        checks.append(
            (
                f"{setting}: fetch_threads={THREADS}'s first batch no later than {against}'s",
                first <= 1.0,
                f"{first:.2f}x its time",
            )
        )
    if missing:
        return [Target(name, False, f"not measured: {missing}") for name, _, _ in checks]
    return [Target(name, passed, detail) for name, passed, detail in checks]


def run(config: Config) -> WorkloadResult:
    """Write the JPEGs, run both settings interleaved, and report; see the module docstring."""
    cases = QUICK_CASES if config.quick else CASES
    with tempfile.TemporaryDirectory(prefix="prefetch-bench-readbound-") as folder:
        write_jpegs(Path(folder), max(case.images for case in cases))
        samples = _runs(config, cases, Path(folder))
    result = WorkloadResult(
        name="readbound",
        title=f"{LATENCY * 1e3:.0f} ms reads at {THREADS} threads, against the physical limit",
        status="ok",
        description=(
            f"JPEG files (500x375) each read after {LATENCY * 1e3:.0f} ms of storage latency, "
            f"decoded with PIL and resized, by {THREADS} threads; no training step. "
            "BackgroundLoader(DataLoader(num_workers=0), fetch_threads=16) against "
            "torchdata.nodes ParallelMapper(method='thread') over batches (each task reads and "
            "collates a batch) at batch 8, and against ParallelMapper over single samples, then "
            "Batcher, then a collating Mapper (the sample-level pipeline) at batch 64. One "
            "epoch of a new loader per run, each in a fresh process, timed from building the "
            "loader to the last batch. 'vs other' and 'first batch vs other': median over "
            "repeats of this / the other pipeline's, in the same setting. The physical limit "
            "of a repeat is the later of reads x latency / threads and decoding x CPU per "
            "image (timed in the benchmark's process in the same repeat) / cores; 'of limit' "
            "is the median of limit / epoch time (1.0 is the limit)."
        ),
        baseline=cases[0].variant(cases[0].rival),
        params={
            "cases": [dataclasses.asdict(case) for case in cases],
            "threads": THREADS,
            "latency_ms": LATENCY * 1e3,
            "repeats": config.repeats,
        },
        columns=[
            *epoch_columns("other"),
            Column("read_limit", "read limit s", "{:.3f}"),
            Column("cpu_limit", "CPU limit s", "{:.3f}"),
            Column("of_limit", "of limit", "{:.2f}"),
            Column("note", "note", "{}"),
        ],
        plot="bar",
        plot_key="seconds",
    )
    for case in cases:
        repeats = limits(samples, case.decode_name, case.images, THREADS)
        rows = {
            case.variant(method): _row(samples, case, method, repeats)
            for method in (case.rival, OURS)
        }
        result.rows += rows.values()
        sums = {row.values["checksum"] for row in rows.values() if not row.values["note"]}
        if len(sums) > 1:  # every pipeline must deliver the same labels in the same order
            result.notes.append(f"{case.name}: the pipelines delivered different batches!")
        limit = median_limit(repeats)
        result.notes.append(f"{case.name}: physical limit {limit.describe()} (medians).")
        result.targets += _targets(case, rows, limit)
    return result
