"""Workload ``advice``: does the setting ``summary()`` names measure best on that loader?

One row per scenario of the diagnosing page's table. Each runs the loader a
new user would start from (``BackgroundLoader(loader)``) and the candidate
settings side by side, interleaved, and reports each candidate's epoch time
as a ratio to the starting point (medians of per-repeat ratios). The
starting point's ``stats.summary()`` names a setting, or says loading is not
the bottleneck (then the starting point itself is the named one): the row
is a PASS when the named candidate measured best, or within
:data:`NOISE` of the best.

Loaders are built once per candidate and run every repeat (worker processes
persist), as a training run reuses them epoch after epoch.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from benchmarks import advice_sources as src
from benchmarks.common import (
    Column,
    Config,
    Measure,
    Row,
    Target,
    WorkloadResult,
    interleave,
    median,
    paired_ratios,
    values_of,
)
from prefetch import BackgroundLoader

__all__ = ["SCENARIOS", "Candidate", "Scenario", "named_by", "run"]

NOISE = 0.1
"""A named candidate within this share of the best one's ratio is as good (the machine drifts)."""
NOT_THE_BOTTLENECK = "not the bottleneck"
"""What the summary says when loading is not what holds the loop up."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A setting to try: its label, the words by which the summary names it, and its loader."""

    label: str
    named: str
    make: Callable[[int], Any]  # batches per epoch -> the loader


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A row: what the user has, the step, and the candidates (the first: where they start)."""

    name: str
    step: src.Step
    candidates: tuple[Candidate, ...]
    needs: str = ""  # a module the row needs (skipped without it)


BATCH = 8


def _dataloader(dataset: Any, **options: Any) -> DataLoader[Any]:
    if options.get("num_workers"):
        options.setdefault("persistent_workers", True)
    return DataLoader(dataset, batch_size=BATCH, **options)


def _start(make: Callable[[int], Any], label: str = "BackgroundLoader(loader)") -> Candidate:
    """The starting point: what the summary names when it says loading is not the bottleneck."""
    return Candidate(f"{label} (start)", NOT_THE_BOTTLENECK, make)


def _io_map(batches: int) -> src.Reads:
    return src.Reads(batches * BATCH, 0.003)


def _map_candidates(dataset: Callable[[int], Any]) -> tuple[Candidate, ...]:
    """Where a user of a map-style DataLoader starts, and the three settings to try."""
    return (
        _start(lambda n: BackgroundLoader(_dataloader(dataset(n)))),
        Candidate(
            "fetch_threads='auto'",
            "fetch_threads='auto'",
            lambda n: BackgroundLoader(_dataloader(dataset(n)), fetch_threads="auto"),
        ),
        Candidate(
            "DataLoader(num_workers=2)",
            "num_workers",
            lambda n: BackgroundLoader(_dataloader(dataset(n), num_workers=2)),
        ),
        Candidate(
            "num_threads=1",
            "num_threads=1",
            lambda n: BackgroundLoader(_dataloader(dataset(n)), num_threads=1),
        ),
    )


@functools.cache
def _accelerator() -> Any:
    accelerate = importlib.import_module("accelerate")
    return accelerate.Accelerator(cpu=True)


def _prepared(dataset: Any, **options: Any) -> Any:
    return _accelerator().prepare(_dataloader(dataset, **options))


def _bursts(batches: int, nbytes: int = 256) -> src.Bursts:
    return src.Bursts(batches, 0.0005, 0.04, nbytes)


MIB = 1 << 20
SCENARIOS = (
    Scenario("I/O-bound map-style dataset", src.sleep_step(0.008), _map_candidates(_io_map)),
    Scenario(
        "I/O-bound IterableDataset",
        src.sleep_step(0.008),
        (
            _start(lambda n: BackgroundLoader(_dataloader(src.ReadStream(n * BATCH, 0.003)))),
            Candidate(
                "DataLoader(num_workers=2)",
                "num_workers",
                lambda n: BackgroundLoader(
                    _dataloader(src.ReadStream(n * BATCH, 0.003), num_workers=2)
                ),
            ),
            Candidate(
                "num_threads=1",
                "num_threads=1",
                lambda n: BackgroundLoader(
                    _dataloader(src.ReadStream(n * BATCH, 0.003)), num_threads=1
                ),
            ),
        ),
    ),
    Scenario(
        "Python-heavy loading (holds the GIL)",
        src.sleep_step(0.004),
        _map_candidates(lambda n: src.Parsed(n * BATCH, 12_000)),
    ),
    Scenario(
        "No free core (decoding in the loader, a step on the CPU)",
        src.cpu_step(),
        _map_candidates(lambda n: src.Decoded(n * BATCH)),
    ),
    Scenario(
        "The loop is the bottleneck",
        src.sleep_step(0.02),
        _map_candidates(lambda n: src.Reads(n * BATCH, 0.001)),
    ),
    Scenario(
        "An accelerate-prepared loader",
        src.sleep_step(0.008),
        (
            _start(lambda n: BackgroundLoader(_prepared(_io_map(n)))),
            Candidate(
                "own DataLoader, fetch_threads='auto'",
                "fetch_threads='auto'",
                lambda n: BackgroundLoader(_dataloader(_io_map(n)), fetch_threads="auto"),
            ),
            Candidate(
                "prepared DataLoader(num_workers=2)",
                "num_workers",
                lambda n: BackgroundLoader(_prepared(_io_map(n), num_workers=2)),
            ),
        ),
        needs="accelerate",
    ),
    Scenario(
        "Bursty stalls (a fixed depth)",
        src.sleep_step(0.005),
        (
            _start(lambda n: BackgroundLoader(_bursts(n * 4), depth=2), "depth=2"),
            Candidate("depth='auto'", "depth='auto'", lambda n: BackgroundLoader(_bursts(n * 4))),
        ),
    ),
    Scenario(
        "A memory cap (max_bytes)",
        src.sleep_step(0.005),
        (
            _start(
                lambda n: BackgroundLoader(_bursts(n * 4, MIB), max_bytes=2 * MIB),
                "max_bytes=2 MiB",
            ),
            Candidate(
                "max_bytes=32 MiB",
                "max_bytes",
                lambda n: BackgroundLoader(_bursts(n * 4, MIB), max_bytes=32 * MIB),
            ),
        ),
    ),
)
"""The diagnosing page's scenarios, in its order."""


def named_by(summary: str, candidates: tuple[Candidate, ...]) -> Candidate | None:
    """Return the candidate the summary's advice names first (``None``: none of them)."""
    places = {
        candidate.label: summary.find(candidate.named)
        for candidate in candidates
        if candidate.named and candidate.named in summary
    }
    if not places:
        return None
    first = min(places, key=places.__getitem__)
    return next(candidate for candidate in candidates if candidate.label == first)


def _epoch(loader: Any, step: src.Step, summaries: list[str] | None) -> Measure:
    started = time.perf_counter()
    for batch in loader:
        step(batch)
    seconds = time.perf_counter() - started
    if summaries is not None:
        summaries.append(loader.stats.summary())
    return {"seconds": seconds, "wait_fraction": loader.stats.wait_fraction}


def _available(module: str) -> bool:
    if not module:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _run_scenario(scenario: Scenario, config: Config) -> tuple[list[Row], Target, str]:
    batches = config.size(32, 6)
    loaders = {c.label: c.make(batches) for c in scenario.candidates}
    summaries: list[str] = []
    start = scenario.candidates[0].label
    variants: dict[str, Callable[[], Measure]] = {
        label: functools.partial(
            _epoch, loader, scenario.step, summaries if label == start else None
        )
        for label, loader in loaders.items()
    }
    try:
        samples = interleave(variants, config.repeats, "advice ", warmup=config.warmup)
    finally:
        for loader in loaders.values():
            loader.close()
    said = collections.Counter(summaries[-config.repeats :]).most_common(1)[0][0]
    named = named_by(said, scenario.candidates)
    base = values_of(samples, start, "seconds")
    ratios = {
        label: median(paired_ratios(values_of(samples, label, "seconds"), base))
        for label in loaders
    }
    best = min(ratios, key=ratios.__getitem__)
    rows = []
    for label in loaders:
        seconds = values_of(samples, label, "seconds")
        mark = ("named" if named is not None and named.label == label else "") + (
            " best" if label == best else ""
        )
        rows.append(
            Row(
                f"{scenario.name}: {label}",
                {
                    "seconds": median(seconds),
                    "ratio": ratios[label],
                    "wait_fraction": median(values_of(samples, label, "wait_fraction")),
                    "mark": mark.strip(),
                },
                {"seconds": seconds, "ratio": paired_ratios(seconds, base)},
            )
        )
    if named is None:
        target = Target(scenario.name, False, f"summary named none of the candidates: {said}")
    else:
        passed = ratios[named.label] <= ratios[best] * (1 + NOISE)
        detail = (
            f"named {named.label} ({ratios[named.label]:.2f}x the start's time); "
            f"best {best} ({ratios[best]:.2f}x)"
        )
        target = Target(scenario.name, passed, detail)
    return rows, target, said


def run(config: Config) -> WorkloadResult:
    """Run every scenario's candidates, interleaved, and check the summary's advice."""
    result = WorkloadResult(
        name="advice",
        title="Advice: the setting summary() names, against the other candidates",
        status="ok",
        description=(
            "One scenario per row of the diagnosing page's table. Each candidate's epoch "
            "time is a ratio to the starting point's (BackgroundLoader(loader), first in each "
            "scenario), the median of per-repeat ratios; 'named' marks what the starting "
            "point's stats.summary() named ('not the bottleneck': the start itself), 'best' "
            f"the lowest ratio. A row passes when the named candidate is within {NOISE:.0%} of "
            "the best. Reads sleep (I/O, no GIL; 3 ms a sample, 8 a batch); parsing is pure "
            "Python; decoding converts a 224x224 uint8 image to normalised floats with torch "
            "ops on their default threads, and the CPU step is a small CNN's, likewise; the "
            "GPU step is a sleep. Bursts: 40 ms every tenth item, 0.5 ms otherwise."
        ),
        params={"repeats": config.repeats, "noise": NOISE, "batch_size": BATCH},
        columns=[
            Column("seconds", "epoch s", "{:.3f}"),
            Column("ratio", "vs start", "{:.2f}x"),
            Column("wait_fraction", "waited for data", "{:.0%}"),
            Column("mark", "summary / measured", "{}"),
        ],
        plot="bar",
        plot_key="ratio",
        spread_key="ratio",
    )
    for scenario in SCENARIOS:
        if not _available(scenario.needs):
            result.notes.append(f"{scenario.name}: skipped, {scenario.needs} is not installed")
            continue
        rows, target, said = _run_scenario(scenario, config)
        result.rows += rows
        result.targets.append(target)
        result.notes.append(f"{scenario.name}: summary() said: {said}")
        print(f"{scenario.name}: {target.detail}", file=sys.stderr)
    _reset_accelerate()
    return result


def _reset_accelerate() -> None:
    """Leave no accelerate state behind (later workloads wrap plain DataLoaders)."""
    if _accelerator.cache_info().currsize:
        state = importlib.import_module("accelerate.state")
        _accelerator().free_memory()
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
        _accelerator.cache_clear()


def scenario_names() -> Iterator[str]:
    """The scenarios' names, in order (the diagnosing page's rows)."""
    return (scenario.name for scenario in SCENARIOS)
