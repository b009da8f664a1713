"""What every workload shares: interleaved repeats, medians, result records.

A workload builds a few *variants* (callables that run one epoch and return
their measurements), hands them to :func:`interleave`, which runs them
``A B C A B C ...`` so that drift of a shared machine hits every variant
alike, and turns the samples into a :class:`WorkloadResult` that
:mod:`benchmarks.report` writes as JSON, reST and PNG.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from prefetch._shared.progress import ProgressBar

__all__ = [
    "IDEAL_COLUMNS",
    "Column",
    "Config",
    "Row",
    "Target",
    "WorkloadResult",
    "ideal_reference",
    "ideal_row",
    "interleave",
    "median",
    "median_ratio",
    "paired_ratios",
    "row_from",
    "speedup_row",
    "timed_epoch",
    "values_of",
]

Measure = dict[str, float]
"""The figures one run of a variant returns, e.g. ``{"seconds": 1.2}``."""
Samples = dict[str, list[Measure]]
"""Every run of every variant, in the order they ran."""


@dataclasses.dataclass(frozen=True)
class Config:
    """How big and how often: set from the command line.

    Attributes:
        repeats: Interleaved runs of each variant.
        quick: Smaller sizes for a smoke run in CI.
    """

    repeats: int = 5
    quick: bool = False

    @property
    def warmup(self) -> bool:
        """Whether each variant runs once, unmeasured, before the repeats (not in quick mode)."""
        return not self.quick

    def scaled_repeats(self, factor: int) -> int:
        """Return ``factor`` times the repeats (not in quick mode).

        CPU-bound workloads run shorter epochs more often: a burst of load
        from another process then spoils fewer interleaved pairs.
        """
        return self.repeats if self.quick else self.repeats * factor

    def size(self, full: int, quick: int) -> int:
        """Return ``quick`` in quick mode, else ``full``."""
        return quick if self.quick else full


@dataclasses.dataclass
class Column:
    """One column of a workload's table: a key of :attr:`Row.values`."""

    key: str
    header: str
    fmt: str = "{:.3f}"


@dataclasses.dataclass
class Row:
    """One variant's medians (and its raw samples for the JSON file)."""

    variant: str
    values: dict[str, float | str]
    samples: dict[str, list[float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Target:
    """A goal printed as PASS or MISS; never tuned to pass."""

    name: str
    passed: bool
    detail: str


@dataclasses.dataclass
class WorkloadResult:
    """Everything one workload reports."""

    name: str
    title: str
    status: str  # "ok" or "skipped"
    description: str = ""
    baseline: str = ""
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    columns: list[Column] = dataclasses.field(default_factory=list)
    rows: list[Row] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    reason: str = ""
    plot: str = ""
    plot_key: str = "seconds"
    spread_key: str = "seconds"
    trace: dict[str, Any] = dataclasses.field(default_factory=dict)
    trace_plot: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the plot path is filled in by the report)."""
        data = dataclasses.asdict(self)
        data["columns"] = [{"key": c.key, "header": c.header} for c in self.columns]
        return data


def median(values: Sequence[float]) -> float:
    """Return the median of ``values`` (``nan`` when empty)."""
    return float(statistics.median(values)) if values else float("nan")


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Return ``numerator / denominator`` repeat by repeat (skipping a zero denominator).

    The two sequences hold one figure per repeat, in repeat order: runs that
    were interleaved together are divided, so a slow spell of the machine
    cancels out. Every ratio, speed-up and "vs ideal" of the reports is the
    :func:`median` of such a list.
    """
    return [n / d for n, d in zip(numerators, denominators, strict=True) if d > 0]


def values_of(samples: Samples, variant: str, key: str) -> list[float]:
    """Return the ``key`` figure of every run of ``variant``."""
    return [run[key] for run in samples[variant]]


def median_ratio(samples: Samples, variant: str, baseline: str, key: str = "seconds") -> float:
    """Return the median over repeats of ``variant[key] / baseline[key]`` (paired by repeat)."""
    return median(
        paired_ratios(values_of(samples, variant, key), values_of(samples, baseline, key))
    )


def speedup_row(
    samples: Samples,
    variant: str,
    baseline: str,
    keys: Sequence[str],
    key: str = "seconds",
    **extra: float | str,
) -> Row:
    """Build a :class:`Row` with the median of each of ``keys`` and a ``speedup``.

    ``speedup`` is the median over repeats of ``baseline[key] / variant[key]``
    (time of the baseline over this variant's, repeat by repeat); ``extra``
    values are added as they are. The raw samples of ``keys`` and ``key`` go
    to the JSON file.
    """
    row = row_from(samples, variant, keys, **extra)
    row.values["speedup"] = median_ratio(samples, baseline, variant, key)
    row.samples.setdefault(key, values_of(samples, variant, key))
    return row


def interleave(
    variants: dict[str, Callable[[], Measure]],
    repeats: int,
    label: str,
    warmup: bool = True,
) -> Samples:
    """Run every variant ``repeats`` times, interleaved, with a progress bar.

    Args:
        variants: Name to a callable that runs one epoch and returns its figures.
        repeats: Runs of each variant.
        label: Text in front of the progress bar.
        warmup: Run each variant once first and discard the result.

    Returns:
        Each variant's measurements, one per repeat, in repeat order.
    """
    samples: Samples = {name: [] for name in variants}
    total = repeats * len(variants) + (len(variants) if warmup else 0)
    with ProgressBar(total, label) as bar:
        if warmup:
            for name, run in variants.items():
                bar.set_note(f"warm-up {name}")
                run()
                bar.update()
        for repeat in range(repeats):
            for name, run in variants.items():
                bar.set_note(f"repeat {repeat + 1}/{repeats} {name}")
                gc.collect()
                samples[name].append(run())
                bar.update()
        bar.set_note("done")
    return samples


def row_from(samples: Samples, variant: str, keys: Sequence[str], **extra: float | str) -> Row:
    """Build a :class:`Row` with the median of each of ``keys``."""
    values: dict[str, float | str] = {key: median(values_of(samples, variant, key)) for key in keys}
    values.update(extra)
    raw = {key: values_of(samples, variant, key) for key in keys}
    return Row(variant=variant, values=values, samples=raw)


def timed_epoch(
    make: Callable[[], Any], step: Callable[[Any], object], waits: list[float] | None = None
) -> Measure:
    """Run one epoch: ``for item in make(): step(item)``, timing every part.

    The epoch starts before ``make()`` (so thread and worker start-up count)
    and ends after the last step. Time spent inside ``next()`` is the time
    the loop waited for data; with ``waits``, each item's wait (seconds) is
    appended to it, in order.

    Returns:
        ``seconds`` (epoch), ``wait_seconds``, ``wait_fraction``,
        ``step_seconds`` and ``items``.
    """
    clock = time.perf_counter
    started = clock()
    iterator = iter(make())
    waited = stepped = 0.0
    items = 0
    while True:
        before = clock()
        try:
            item = next(iterator)
        except StopIteration:
            waited += clock() - before
            break
        got = clock()
        waited += got - before
        if waits is not None:
            waits.append(got - before)
        step(item)
        stepped += clock() - got
        items += 1
        del item
    seconds = clock() - started
    return {
        "seconds": seconds,
        "wait_seconds": waited,
        "wait_fraction": waited / seconds if seconds > 0 else 0.0,
        "step_seconds": stepped,
        "items": float(items),
    }


IDEAL_COLUMNS = (
    Column("seconds", "epoch s", "{:.3f}"),
    Column("vs_ideal", "vs ideal", "{:.2f}"),
    Column("speedup", "speed-up", "{:.2f}x"),
    Column("wait_fraction", "waited for data", "{:.0%}"),
    Column("peak_items", "peak items", "{:.0f}"),
    Column("depth", "final depth", "{:.0f}"),
)
"""Columns of a workload measured against an ideal epoch time (see :func:`ideal_row`)."""
BUFFER_KEYS = ("peak_items", "depth", "peak_mib")
"""Figures a ``BackgroundLoader`` variant adds to its measurements (blank for the others)."""


def ideal_row(
    samples: Samples, variant: str, ideals: Sequence[float], plain: Sequence[float]
) -> Row:
    """Build a row against an ideal epoch time, one ideal and one plain run per repeat.

    ``vs_ideal`` is the median over repeats of ideal / epoch time (1.0 is the
    ideal; 0.5 took twice as long), ``speedup`` of plain / epoch time. Buffer
    figures (:data:`BUFFER_KEYS`) are medians where the variant reports them
    and blank where it does not.
    """
    seconds = values_of(samples, variant, "seconds")
    waits = values_of(samples, variant, "wait_fraction")
    ratios = paired_ratios(ideals, seconds)
    values: dict[str, float | str] = {
        "seconds": median(seconds),
        "vs_ideal": median(ratios),
        "speedup": median(paired_ratios(plain, seconds)),
        "wait_fraction": median(waits),
    }
    raw = {"seconds": seconds, "wait_fraction": waits, "vs_ideal": ratios}
    for key in BUFFER_KEYS:
        if all(key in run for run in samples[variant]):
            raw[key] = values_of(samples, variant, key)
            values[key] = median(raw[key])
        else:
            values[key] = ""
    return Row(variant, values, raw)


def ideal_reference(ideals: Sequence[float]) -> Row:
    """The ``ideal`` row that :func:`ideal_row` rows are measured against."""
    values: dict[str, float | str] = {"seconds": median(ideals), "vs_ideal": 1.0}
    values.update(dict.fromkeys(BUFFER_KEYS, ""))
    return Row("ideal", values, {"seconds": list(ideals)})
