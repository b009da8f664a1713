"""Stats for loggers and across epochs (issue 24): scalars, totals, and advice that names a knob.

``LoaderStats.scalars`` and ``TotalStats.scalars`` flatten the figures for any
logger; ``wrapper.total_stats`` sums a wrapper's epochs; ``summary()``
recommends ``fetch_threads`` when the producer of a map-style single-process
DataLoader cannot keep up.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from prefetch import BackgroundLoader, CudaPrefetcher, LoaderStats, TotalStats

BASE = {
    "items",
    "wait_seconds",
    "end_wait_seconds",
    "loop_cpu_seconds",
    "loop_core_wait_seconds",
    "source_seconds",
    "elapsed_seconds",
    "wait_fraction",
}
BUFFER = {
    "depth",
    "peak_depth",
    "peak_items",
    "peak_bytes",
    "loading_cpu_seconds",
    "loading_core_wait_seconds",
    "fetch_threads",
    "peak_fetch_threads",
    "fetch_seconds",
    "collate_seconds",
}


class SlowSamples(Dataset[torch.Tensor]):
    """A map-style dataset whose every sample sleeps ``seconds`` (a read that releases the GIL)."""

    def __init__(self, size: int = 12, seconds: float = 0.01) -> None:
        self.size, self.seconds = size, seconds

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.tensor(index)


class Stream(IterableDataset[int]):
    """An iterable-style dataset: fetch_threads cannot read it."""

    def __iter__(self) -> Any:
        return iter(range(4))


def drain(loader: Any) -> LoaderStats:
    """Run one epoch with a step that takes no time; return its stats."""
    for _ in loader:
        pass
    return loader.stats  # type: ignore[no-any-return]


def data_bound(available: bool, **changes: Any) -> LoaderStats:
    """An epoch of 10 items, 2 s long, the loop waiting 1.5 s on a producer busy 1.9 s."""
    stats = LoaderStats(
        items=10,
        wait_seconds=1.5,
        source_seconds=1.9,
        started=0.0,
        finished=2.0,
        depth=2,
        peak_depth=2,
        fetch_threads=1,
        peak_fetch_threads=1,
        parallel_fetch_available=available,
    )
    return dataclasses.replace(stats, **changes)


class TestLoaderStatsScalars:
    """LoaderStats.scalars: flat floats under a prefix, the same names every epoch."""

    def test_names_and_values_of_a_plain_epoch(self) -> None:
        """Without a buffer: the five base figures, as floats, under the prefix given."""
        stats = LoaderStats(
            items=4, wait_seconds=1.0, source_seconds=3.0, started=10.0, finished=14.0
        )
        scalars = stats.scalars(prefix="data/")
        assert scalars == {
            "data/items": 4.0,
            "data/wait_seconds": 1.0,
            "data/end_wait_seconds": 0.0,
            "data/loop_cpu_seconds": 0.0,
            "data/loop_core_wait_seconds": 0.0,
            "data/source_seconds": 3.0,
            "data/elapsed_seconds": 4.0,
            "data/wait_fraction": 0.25,
        }
        assert all(type(value) is float for value in scalars.values())

    def test_a_background_loader_adds_its_buffer_and_threads(self) -> None:
        """A BackgroundLoader epoch logs its depth, peaks and threads too, every value a float."""
        loader = BackgroundLoader(DataLoader(list(range(6)), batch_size=2), fetch_threads=2)
        stats = drain(loader)
        scalars = stats.scalars()
        assert set(scalars) == BASE | BUFFER
        assert scalars["items"] == 3.0 and scalars["fetch_threads"] == 2.0
        assert scalars["fetch_seconds"] == pytest.approx(sum(stats.fetch_seconds))

    def test_a_device_prefetcher_logs_the_base_figures(self) -> None:
        """A CudaPrefetcher has no buffer: only the base names, so none is a meaningless 0."""
        stats = drain(CudaPrefetcher([torch.zeros(1)] * 3, device="cpu"))
        assert set(stats.scalars()) == BASE

    def test_prefix_must_be_a_string(self) -> None:
        """A prefix that is not a str is refused, naming the argument and the value."""
        with pytest.raises(TypeError, match=r"scalars\(prefix=...\) expects a str, got 3"):
            LoaderStats().scalars(prefix=3)  # type: ignore[arg-type]


class TestSummaryAdvice:
    """summary() names fetch_threads when the producer of a parallel-readable loader lags."""

    def test_data_bound_epoch_names_fetch_threads(self) -> None:
        """Waited 75% on a producer busy 95%, 190 ms per item: the summary says what to do."""
        text = data_bound(True).summary()
        assert "the loader cannot keep up (busy 95% of the time)" in text
        assert "fetch_threads='auto'" in text and "num_workers" in text  # CPU time not measured

    @pytest.mark.parametrize(
        "changes",
        [
            pytest.param({"parallel_fetch_available": False}, id="fetch_threads_cannot_read_it"),
            pytest.param({"wait_seconds": 0.1}, id="loop_barely_waited"),
            pytest.param({"source_seconds": 1.0}, id="producer_often_idle"),
            pytest.param({"source_seconds": 1.9, "items": 5000}, id="items_too_cheap"),
        ],
    )
    def test_no_advice_where_threads_would_not_help(self, changes: dict[str, Any]) -> None:
        """No advice without each condition: readable loader, a wait, a busy and slow producer."""
        stats = data_bound(True, **changes)
        assert "read the DataLoader's batches in parallel" not in stats.summary()
        assert stats.summary().startswith("waited ")

    def test_a_slow_map_style_dataloader_gets_the_advice(self) -> None:
        """One thread over a DataLoader(num_workers=0) that sleeps per sample: advised."""
        stats = drain(BackgroundLoader(DataLoader(SlowSamples(), batch_size=2)))
        assert stats.parallel_fetch_available
        assert "fetch_threads='auto'" in stats.summary()

    def test_a_device_prefetcher_above_it_gives_the_advice_too(self) -> None:
        """CudaPrefetcher(BackgroundLoader(DataLoader)): what the loop sees carries the advice."""
        stack = CudaPrefetcher(BackgroundLoader(DataLoader(SlowSamples(), batch_size=2)))
        assert "fetch_threads='auto'" in drain(stack).summary()

    @pytest.mark.parametrize(
        "make",
        [
            pytest.param(
                lambda: BackgroundLoader(DataLoader(SlowSamples(), batch_size=2), fetch_threads=2),
                id="already_parallel",
            ),
            pytest.param(lambda: BackgroundLoader(DataLoader(Stream())), id="iterable_dataset"),
            pytest.param(lambda: BackgroundLoader(iter(range(3))), id="generator"),
            pytest.param(lambda: CudaPrefetcher(DataLoader(SlowSamples())), id="no_thread"),
        ],
    )
    def test_loaders_fetch_threads_cannot_read_are_not_advised(self, make: Any) -> None:
        """Already parallel, not a map-style DataLoader, or no BackgroundLoader: flag off."""
        stats = drain(make())
        assert not stats.parallel_fetch_available
        assert "fetch_threads=" not in stats.summary()


class TestTotalStats:
    """TotalStats: sums and maxima of epochs, its summary and scalars."""

    def test_plus_sums_counts_and_times_and_keeps_peaks(self) -> None:
        """Items, waits, source, elapsed and thread times add up; peaks are the maxima."""
        first = LoaderStats(
            items=4, wait_seconds=1.0, source_seconds=2.0, started=0.0, finished=4.0,
            depth=2, peak_depth=3, peak_items=3, peak_bytes=100, fetch_threads=2,
            peak_fetch_threads=2, fetch_seconds=[1.0, 0.5], collate_seconds=0.25,
        )  # fmt: skip
        second = dataclasses.replace(
            first, items=2, peak_depth=5, peak_bytes=50, peak_fetch_threads=4, fetch_seconds=[2.0]
        )
        total = TotalStats().plus(first).plus(second)
        assert (total.epochs, total.items) == (2, 6)
        assert (total.wait_seconds, total.source_seconds, total.elapsed_seconds) == (2.0, 4.0, 8.0)
        assert (total.peak_depth, total.peak_items, total.peak_bytes) == (5, 3, 100)
        assert (total.peak_fetch_threads, total.fetch_seconds, total.collate_seconds) == (
            4,
            3.5,
            0.5,
        )
        assert total.wait_fraction == 0.25

    def test_an_epoch_without_items_adds_nothing(self) -> None:
        """An iter() that never handed an item over (a framework's probe) is not an epoch."""
        total = TotalStats().plus(LoaderStats(started=0.0, finished=5.0, wait_seconds=1.0))
        assert total == TotalStats()

    def test_summary_and_scalars(self) -> None:
        """The summary counts epochs and advises as one epoch's does; scalars add 'epochs'."""
        total = TotalStats().plus(data_bound(True)).plus(data_bound(True))
        text = total.summary()
        assert text.startswith("2 epochs: waited 75% of the time for data (3.00 s of 4.00 s")
        assert "peak depth 2" in text and "fetch_threads='auto'" in text
        scalars = total.scalars(prefix="all/")
        assert scalars["all/epochs"] == 2.0 and scalars["all/items"] == 20.0
        assert {name.removeprefix("all/") for name in scalars} == (BASE | BUFFER | {"epochs"}) - {
            "depth",
            "fetch_threads",
        }

    def test_is_a_frozen_snapshot(self) -> None:
        """A snapshot cannot be changed by accident (it is not the live epoch's stats)."""
        with pytest.raises(dataclasses.FrozenInstanceError):
            TotalStats().items = 3  # type: ignore[misc]


class TestWrapperTotalStats:
    """wrapper.total_stats: every epoch this wrapper ran, summed."""

    def test_sums_the_epochs_the_loop_ran(self) -> None:
        """Three epochs: totals equal the sum of the three epochs' own stats."""
        loader = BackgroundLoader(DataLoader(list(range(6)), batch_size=2), depth=2)
        epochs = [drain(loader) for _ in range(3)]
        total = loader.total_stats
        assert (total.epochs, total.items) == (3, 9)
        assert total.wait_seconds == pytest.approx(sum(s.wait_seconds for s in epochs))
        assert total.source_seconds == pytest.approx(sum(s.source_seconds for s in epochs))
        assert total.elapsed_seconds == pytest.approx(sum(s.elapsed_seconds for s in epochs))
        assert total.peak_depth == 2 and total.peak_items == max(s.peak_items for s in epochs)

    def test_an_iterator_dropped_before_its_first_item_is_not_counted(self) -> None:
        """iter() then drop (Lightning's iterability check): epochs and items unchanged."""
        loader = BackgroundLoader(DataLoader(list(range(6)), batch_size=2))
        drain(loader)
        iter(loader)  # created and dropped at once
        gc.collect()
        assert (loader.total_stats.epochs, loader.total_stats.items) == (1, 3)

    def test_open_epoch_counts_and_its_clock_ends_at_the_last_item(self) -> None:
        """A half-read epoch counts its items and its time to its last item, dropped or not."""
        loader = BackgroundLoader(list(range(10)))
        iterator = iter(loader)
        next(iterator), next(iterator)
        time.sleep(0.05)  # the loop's step after its last item: not the loader's time
        assert (loader.total_stats.epochs, loader.total_stats.items) == (1, 2)
        elapsed = loader.stats.elapsed_seconds
        assert elapsed == loader.total_stats.elapsed_seconds < 0.05
        del iterator  # break out of the loop
        gc.collect()
        assert loader.stats.finished is not None  # over: folded into the running total
        assert loader.total_stats.elapsed_seconds == elapsed

    def test_each_layer_of_a_stack_has_its_own_and_close_keeps_them(self) -> None:
        """Outer and inner wrappers count separately; close() does not reset the totals."""
        inner = BackgroundLoader(DataLoader(list(range(4)), batch_size=2))
        outer = CudaPrefetcher(inner, device="cpu")
        drain(outer)
        drain(outer)
        outer.close()
        assert outer.total_stats.epochs == inner.total_stats.epochs == 2
        assert outer.total_stats.items == 4 and outer.total_stats.peak_depth is None
        assert inner.total_stats.peak_depth is not None

    def test_before_any_epoch_it_is_zero(self) -> None:
        """A wrapper that never ran an epoch reports empty totals."""
        assert BackgroundLoader([1, 2]).total_stats == TotalStats()
