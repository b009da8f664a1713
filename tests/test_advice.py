"""What ``summary()`` advises, scenario by scenario (issue 35): the diagnosing page's table.

Each row of the table is a test: the figures such a loader and loop produce
are scripted (no timing anywhere), and the summary must name the setting
that measured best there (the ``advice`` benchmark runs the same scenarios
with real loaders), or say plainly that loading is not the bottleneck; never
a setting the loader refuses. Facts the advice needs are recorded where a
loader is wrapped (:class:`prefetch.LoaderFacts`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from benchmarks.advice import SCENARIOS, named_by
from prefetch import BackgroundLoader, CudaPrefetcher, DepthEvent, LoaderFacts, LoaderStats
from prefetch._shared.advice import Cores, advice, held_at_bound
from prefetch._shared.facts import gil_enabled

MAP = LoaderFacts(kind="map", depth="auto", cores=2)
THREADS = "BackgroundLoader(..., fetch_threads='auto')"


def epoch(facts: LoaderFacts = MAP, **figures: Any) -> LoaderStats:
    """An epoch of 32 items, 1 s from its start to its last item, with ``figures``.

    By default the loop waited 70% of the time on a loader busy 97% of it,
    which waited on I/O (on a core 3% of it), with a step that waits for a GPU.
    """
    base: dict[str, Any] = {
        "items": 32,
        "started": 10.0,
        "last_handoff": 11.0,
        "wait_seconds": 0.7,
        "source_seconds": 0.97,
        "loading_cpu_seconds": 0.03,
        "depth": 2,
        "peak_depth": 2,
        "parallel_fetch_available": facts.kind == "map" and not facts.fetch_threads,
        "facts": facts,
    }
    base.update(figures)
    return LoaderStats(**base)


def scenario_index(name: str) -> int:
    return next(i for i, scenario in enumerate(SCENARIOS) if scenario.name == name)


def named_in_benchmark(name: str, summary: str) -> str:
    """The label of the benchmark row's candidate that ``summary`` names."""
    scenario = SCENARIOS[scenario_index(name)]
    candidate = named_by(summary, scenario.candidates)
    assert candidate is not None, summary
    return candidate.label


CPU_BOUND = {"loading_cpu_seconds": 0.9}
NO_FREE_CORE = {
    "wait_seconds": 0.02,
    "loop_cpu_seconds": 0.4,
    "loop_core_wait_seconds": 0.5,
    "loading_cpu_seconds": 0.4,
    "loading_core_wait_seconds": 0.45,
}


class TestScenarioTable:
    """One test per row of the diagnosing page's table: what summary() names."""

    def test_io_bound_map_style_dataset(self) -> None:
        """Reads that wait on storage, one thread: threads read the batches in parallel."""
        text = epoch().summary()
        assert "on a core 3% of it" in text and f"parallel with {THREADS}" in text
        assert "num_workers" not in text
        assert named_in_benchmark("I/O-bound map-style dataset", text) == "fetch_threads='auto'"

    def test_io_bound_iterable_dataset(self) -> None:
        """The same reads from an IterableDataset: worker processes, a shard each."""
        text = epoch(LoaderFacts(kind="iterable", depth="auto", cores=2)).summary()
        assert "fetch_threads cannot split an IterableDataset" in text
        assert "num_workers=N, each worker reading its own shard" in text
        assert "fetch_threads='auto'" not in text  # it refuses such a loader
        label = named_in_benchmark("I/O-bound IterableDataset", text)
        assert label == "DataLoader(num_workers=2)"

    def test_python_heavy_loading_holds_the_gil(self) -> None:
        """Loading on a core 93% of its time: the GIL lets one thread run; processes help."""
        text = epoch(**CPU_BOUND).summary()
        assert "on a core 93% of it" in text and "holds the GIL" in text
        assert "worker processes with DataLoader(num_workers=N)" in text
        assert "fetch_threads='auto'" not in text
        label = named_in_benchmark("Python-heavy loading (holds the GIL)", text)
        assert label == "DataLoader(num_workers=2)"

    def test_python_heavy_loading_with_the_gil_off(self) -> None:
        """On a free-threaded Python with the GIL off, threads parse in parallel."""
        facts = dataclasses.replace(MAP, gil_enabled=False)
        text = epoch(facts, **CPU_BOUND).summary()
        assert f"parallel with {THREADS}" in text and "GIL" not in text

    def test_no_free_core(self) -> None:
        """A step on the CPU and loading waited for each other's cores: num_threads=1."""
        text = epoch(**NO_FREE_CORE).summary()
        assert text.startswith("waited 2% of the time")
        assert "no free core: loading competes with the step for the 2 cores" in text
        assert (
            "(the loop waited for one 56% of its time on the CPU, the loading threads 53%" in text
        )
        assert "BackgroundLoader(..., num_threads=1)" in text and "fetch_threads" not in text
        label = named_in_benchmark("No free core (decoding in the loader, a step on the CPU)", text)
        assert label == "num_threads=1"

    def test_no_free_core_with_num_threads_set(self) -> None:
        """With num_threads=1 already, the CPU is the limit: nothing to name on the loader."""
        facts = dataclasses.replace(MAP, num_threads=1)
        text = epoch(facts, **NO_FREE_CORE).summary()
        assert "the CPU is the limit" in text and "num_threads=1" not in text

    def test_the_loop_is_the_bottleneck(self) -> None:
        """The loop waited 2%: loading is not the bottleneck, whatever the loader."""
        text = epoch(wait_seconds=0.02).summary()
        assert text.endswith("loading is not the bottleneck: the loop waited 2% of the time")
        label = named_in_benchmark("The loop is the bottleneck", text)
        assert label == "BackgroundLoader(loader) (start)"

    def test_an_accelerate_prepared_loader(self) -> None:
        """fetch_threads refuses it: your own DataLoader under fetch_threads, or num_workers."""
        text = epoch(LoaderFacts(kind="prepared", depth="auto", cores=2)).summary()
        assert "fetch_threads cannot read accelerate's prepared loader" in text
        assert f"wrap your own DataLoader in {THREADS}" in text
        assert "num_workers=N before accelerator.prepare()" in text
        label = named_in_benchmark("An accelerate-prepared loader", text)
        assert label == "own DataLoader, fetch_threads='auto'"

    def test_an_accelerate_prepared_loader_that_holds_the_gil(self) -> None:
        """CPU-bound loading under accelerate: worker processes, given before prepare()."""
        facts = LoaderFacts(kind="prepared", depth="auto", cores=2)
        text = epoch(facts, **CPU_BOUND).summary()
        assert "holds the GIL" in text and "num_workers=N before accelerator.prepare()" in text
        assert "fetch_threads" not in text

    def test_bursty_stalls(self) -> None:
        """Busy 55% of the time, yet the loop waited 35%: a deeper buffer absorbs the bursts."""
        facts = dataclasses.replace(MAP, depth="fixed")
        text = epoch(facts, wait_seconds=0.35, source_seconds=0.55).summary()
        assert "loading keeps up on average (busy 55% of the time) but stalls in bursts" in text
        assert "BackgroundLoader(..., depth='auto')" in text
        assert named_in_benchmark("Bursty stalls (a fixed depth)", text) == "depth='auto'"

    def test_a_memory_cap(self) -> None:
        """An adaptive depth that held at max_bytes: raise max_bytes."""
        hold = DepthEvent(9, 0.2, 2, 2, "hold: at max_bytes (2 items of 1048576 bytes)")
        stats = epoch(wait_seconds=0.35, source_seconds=0.55, depth_events=[hold])
        text = stats.summary()
        assert "the adaptive depth held at max_bytes" in text
        assert "BackgroundLoader(..., max_bytes=...)" in text
        assert named_in_benchmark("A memory cap (max_bytes)", text) == "max_bytes=32 MiB"

    def test_every_row_of_the_benchmark_has_its_test(self) -> None:
        """The benchmark runs the table's eight scenarios, in its order."""
        assert [scenario.name for scenario in SCENARIOS] == [
            "I/O-bound map-style dataset",
            "I/O-bound IterableDataset",
            "Python-heavy loading (holds the GIL)",
            "No free core (decoding in the loader, a step on the CPU)",
            "The loop is the bottleneck",
            "An accelerate-prepared loader",
            "Bursty stalls (a fixed depth)",
            "A memory cap (max_bytes)",
        ]


class TestAdvice:
    """advice(): the order of its checks, and what it never says."""

    def test_a_busy_machine_is_said(self) -> None:
        """Loading waited for a core while the loop did not use one: other processes did."""
        figures = {"loading_cpu_seconds": 0.5, "loading_core_wait_seconds": 0.4}
        text = epoch(**figures).summary()
        assert "the machine is busy (the loading threads waited for a core 44% of their" in text
        assert "holds the GIL" in text  # and the advice goes on

    def test_quick_items_and_no_items_get_no_advice(self) -> None:
        """Under 1 ms per item the hand-off is the cost; an epoch without items says nothing."""
        assert advice(epoch(source_seconds=0.01)) == ""
        assert advice(LoaderStats(started=0.0, finished=1.0)) == ""

    def test_a_loader_read_by_fetch_threads_is_not_advised(self) -> None:
        """fetch_threads set: the stage summary says how busy its threads were instead."""
        facts = dataclasses.replace(MAP, fetch_threads=True)
        assert advice(epoch(facts)) == ""

    def test_unmeasured_cpu_names_both_remedies(self) -> None:
        """No loading thread of its own (a CudaPrefetcher above): threads or processes."""
        text = advice(epoch(loading_cpu_seconds=0.0))
        assert f"parallel with {THREADS} (threads, when loading releases the GIL)" in text
        assert "or DataLoader(num_workers=N) (processes)" in text

    @pytest.mark.parametrize("kind", ["iterable", "prepared", "workers", "other"])
    def test_never_fetch_threads_on_a_loader_it_refuses(self, kind: str) -> None:
        """Over any loader but a map-style one, fetch_threads is never set on that loader."""
        facts = LoaderFacts(kind=kind, depth="auto", cores=2)
        for figures in ({}, CPU_BOUND):
            text = advice(epoch(facts, **figures))
            assert "the DataLoader's batches in parallel" not in text
            assert text  # each names something

    def test_worker_processes_that_lag(self) -> None:
        """A DataLoader with workers already: raise num_workers."""
        facts = LoaderFacts(kind="workers", workers=2, depth="auto", cores=2)
        assert "raise the DataLoader's num_workers (2 now)" in advice(epoch(facts))

    def test_totals_advise_as_an_epoch_does(self) -> None:
        """TotalStats reads the same figures: the same advice for two such epochs."""
        from prefetch import TotalStats

        total = TotalStats().plus(epoch(**CPU_BOUND)).plus(epoch(**CPU_BOUND))
        assert "holds the GIL" in total.summary()


class TestCores:
    """Cores.of: who waited for a core, and whether the loop and loading competed."""

    def test_competing(self) -> None:
        """Both sides on the CPU, each waiting for the other's core."""
        cores = Cores.of(epoch(**NO_FREE_CORE))
        assert cores.compete
        assert cores.loop_starved == pytest.approx(0.5 / 0.9)
        assert cores.loading_starved == pytest.approx(0.45 / 0.85)

    def test_a_step_that_waits_for_a_gpu_does_not_compete(self) -> None:
        """Loading starved while the loop slept: not competing, a busy machine."""
        figures = dict(NO_FREE_CORE, loop_cpu_seconds=0.01, loop_core_wait_seconds=0.0)
        cores = Cores.of(epoch(**figures))
        assert not cores.compete and cores.loading_starved == pytest.approx(0.45 / 0.85)

    def test_a_short_wait_for_a_core_is_not_starved(self) -> None:
        """Waiting 4% of the epoch for a core is not starved, even at 4% of its CPU time."""
        figures = {"loading_cpu_seconds": 0.9, "loading_core_wait_seconds": 0.04}
        assert Cores.of(epoch(**figures)).loading_starved == 0.0

    def test_rarely_on_a_core_is_not_starved(self) -> None:
        """A side with work for a core under half its time is not starved, whatever it waited."""
        figures = {"loading_cpu_seconds": 0.01, "loading_core_wait_seconds": 0.2}
        assert Cores.of(epoch(**figures)).loading_starved == 0.0


class TestHeldAtBound:
    """held_at_bound: which bound an adaptive depth held at."""

    @pytest.mark.parametrize(
        ("reason", "bound"),
        [
            ("hold: at max_bytes (2 items of 8 bytes)", "max_bytes"),
            ("hold: at max_depth (32)", "max_depth"),
            ("hold: the buffer never filled since it last ran low", ""),
            ("grow: waited 2.0 steps", ""),
        ],
    )
    def test_reasons(self, reason: str, bound: str) -> None:
        assert held_at_bound([reason]) == bound


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))


class TestLoaderFacts:
    """LoaderFacts: recorded where the loader is wrapped, what the advice tells apart by."""

    @pytest.mark.parametrize(
        ("loader", "kind", "workers"),
        [
            (DataLoader(list(range(4))), "map", 0),
            (DataLoader(Stream()), "iterable", 0),
            (DataLoader(list(range(4)), num_workers=2), "workers", 2),
            (iter(range(4)), "other", 0),
            ([1, 2], "other", 0),
        ],
        ids=["map", "iterable", "workers", "generator", "list"],
    )
    def test_kind_of_loader(self, loader: Any, kind: str, workers: int) -> None:
        facts = LoaderFacts.of(loader)
        assert (facts.kind, facts.workers, facts.depth) == (kind, workers, "")
        assert facts.cores >= 1 and facts.gil_enabled == gil_enabled()

    def test_an_accelerate_prepared_loader(self) -> None:
        """A DataLoader subclass from accelerate is 'prepared' (fetch_threads refuses it)."""
        prepared_type = type(
            "DataLoaderShard", (DataLoader,), {"__module__": "accelerate.data_loader"}
        )
        assert LoaderFacts.of(prepared_type(list(range(4)))).kind == "prepared"

    def test_a_background_loader_records_its_settings_in_each_epoch(self) -> None:
        """depth, num_threads and fetch_threads reach each epoch's stats, and an outer layer's."""
        loader = BackgroundLoader(DataLoader(list(range(4))), depth=3, num_threads=1)
        for _ in loader:
            pass
        facts = loader.stats.facts
        assert (facts.kind, facts.depth, facts.num_threads, facts.fetch_threads) == (
            "map", "fixed", 1, False,
        )  # fmt: skip
        stack = CudaPrefetcher(BackgroundLoader(DataLoader(list(range(4))), fetch_threads=2))
        for _ in stack:
            pass
        assert stack.stats.facts.fetch_threads and stack.stats.facts.depth == "auto"

    def test_a_kind_it_does_not_know_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"kind=\.\.\.\) must be one of .*, got 'maps'"):
            LoaderFacts(kind="maps")

    def test_tensors_are_not_a_dataloader(self) -> None:
        assert LoaderFacts.of([torch.zeros(2)]).kind == "other"
