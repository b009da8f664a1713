"""Parallel fetch at the grain of samples (``fetch_grain="sample"``, the default).

A batch's samples are read by whichever threads are free and collated once
all are in; the batches, their order, their errors and the checkpoint state
stay the DataLoader's.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

from prefetch import BackgroundLoader, sample_seed
from prefetch._threads.sample_board import SampleBoard

from .liveness import begin, set_after, wait_for
from .parallel import (
    Abort,
    Gated,
    Ordered,
    Values,
    assert_same_batches,
    assert_same_outcomes,
    outcomes,
)
from .processes import prefetch_threads

pytestmark = pytest.mark.timeout(60)


def seeded(loader: Any, seed: int = 5) -> list[Any]:
    """Every batch of one epoch of ``loader`` after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return list(loader)


class Jittery(Values):
    """:class:`Values` whose reads each sleep a random 0-2 ms (read order is then random)."""

    def __getitem__(self, index: int) -> Any:
        time.sleep(random.random() * 0.002)
        return super().__getitem__(index)


class TestSameBatches:
    """Split across threads, the batches are still exactly the DataLoader's."""

    @pytest.mark.parametrize("threads", [1, 3, 16])
    @pytest.mark.parametrize("batch_size", [1, 7, 64, None])
    def test_batch_sizes(self, threads: int, batch_size: int | None) -> None:
        """Batch sizes 1, 7, 64 and None (no batching), shuffled, give the same batches."""

        def make() -> DataLoader[Any]:
            return DataLoader(Values(150, "dict"), batch_size=batch_size, shuffle=True)

        wrapped = seeded(BackgroundLoader(make(), fetch_threads=threads))
        assert_same_batches(wrapped, seeded(make()))

    @pytest.mark.parametrize("threads", [2, 5])
    def test_drop_last(self, threads: int) -> None:
        """drop_last drops the same short batch."""
        data = Values(30)
        wrapped = list(
            BackgroundLoader(DataLoader(data, batch_size=8, drop_last=True), fetch_threads=threads)
        )
        assert len(wrapped) == 3
        assert_same_batches(wrapped, list(DataLoader(data, batch_size=8, drop_last=True)))

    @pytest.mark.parametrize("threads", [2, 5])
    def test_custom_batch_sampler(self, threads: int) -> None:
        """A batch sampler of uneven batches, an empty one included, is followed exactly."""

        class Uneven(BatchSampler):
            def __iter__(self) -> Any:
                yield from ([0, 1, 2], [], [9], list(range(10, 30)), [3, 4])

            def __len__(self) -> int:
                return 5

        def make() -> DataLoader[Any]:
            sampler = Uneven(SequentialSampler(range(30)), 1, False)
            return DataLoader(Values(30, "tuple"), batch_sampler=sampler, collate_fn=list)

        assert_same_batches(list(BackgroundLoader(make(), fetch_threads=threads)), list(make()))

    @pytest.mark.parametrize("threads", [4, 16])
    def test_order_under_random_read_times(self, threads: int) -> None:
        """Reads that finish in random order still make the batches in sampler order."""
        data = Jittery(200)
        wrapped = seeded(
            BackgroundLoader(DataLoader(data, batch_size=16, shuffle=True), fetch_threads=threads)
        )
        assert_same_batches(wrapped, seeded(DataLoader(Values(200), batch_size=16, shuffle=True)))

    def test_every_thread_reads_each_batch(self) -> None:
        """A batch of 16 is read by 3 threads at once (whole batches per thread could not)."""
        readers: set[str] = set()
        lock, met = threading.Lock(), threading.Event()

        class Meeting(Values):
            """Reads of batch 0 wait (10 s at most) until 3 threads are inside one."""

            def __getitem__(self, index: int) -> Any:
                if index < 16:
                    with lock:
                        readers.add(threading.current_thread().name)
                        if len(readers) >= 3:
                            met.set()
                    met.wait(10.0)
                return super().__getitem__(index)

        loader = BackgroundLoader(DataLoader(Meeting(64), batch_size=16), fetch_threads=4)
        assert len(list(loader)) == 4
        assert met.is_set(), f"batch 0 was read by {sorted(readers)} only"
        assert sum(loader.stats.fetch_reads) == 64
        assert len(loader.stats.fetch_reads) == 4


class TestErrors:
    """A sample's error makes its batch raise in its place, as the DataLoader does."""

    @pytest.mark.parametrize("threads", [1, 4])
    def test_error_at_its_batch_and_the_epoch_goes_on(self, threads: int) -> None:
        """A KeyError at sample 13 makes batch 1 (of 8) raise; the other batches arrive."""
        error = KeyError(13)
        data = Values(40, fail={13: error})
        expected = outcomes(iter(DataLoader(data, batch_size=8)))
        actual = outcomes(
            iter(BackgroundLoader(DataLoader(data, batch_size=8), fetch_threads=threads))
        )
        assert [kind for kind, _ in actual] == ["item", "error", "item", "item", "item"]
        assert_same_outcomes(actual, expected)

    @pytest.mark.parametrize("threads", [2, 8])
    def test_earliest_error_of_a_batch_wins(self, threads: int) -> None:
        """An Exception before a BaseException in one batch is raised, and the epoch goes on."""
        first, later = ValueError("first"), Abort("later")
        data = Values(24, fail={3: first, 6: later}, delays={3: 0.02})
        actual = outcomes(
            iter(BackgroundLoader(DataLoader(data, batch_size=8), fetch_threads=threads))
        )
        expected = outcomes(iter(DataLoader(data, batch_size=8)))
        assert [kind for kind, _ in actual] == ["error", "item", "item"]
        assert_same_outcomes(actual, expected)

    @pytest.mark.parametrize("threads", [2, 8])
    def test_base_exception_ends_the_epoch_in_place(self, threads: int) -> None:
        """A BaseException at sample 10 ends the epoch after batch 0, as the same object."""
        error = Abort("stop")
        data = Values(40, fail={10: error})
        actual = outcomes(
            iter(BackgroundLoader(DataLoader(data, batch_size=8), fetch_threads=threads))
        )
        assert [kind for kind, _ in actual] == ["item", "final"]
        assert actual[1][1] is error
        wait_for(lambda: not prefetch_threads(), "every thread to leave")

    @pytest.mark.parametrize("error", [KeyError(2), Abort("stop")], ids=["Exception", "Base"])
    def test_no_sample_after_the_error_is_read(self, error: BaseException) -> None:
        """One thread reads a batch's samples in order; after the one that raises it reads
        none of that batch, and the reads are the DataLoader's, one for one."""

        def reads(loader: Any, data: Values) -> list[int]:
            outcomes(iter(loader))
            return [index for index, _ in data.reads]

        plain = Values(24, fail={2: error})
        wrapped = Values(24, fail={2: error})
        expected = reads(DataLoader(plain, batch_size=8), plain)
        actual = reads(
            BackgroundLoader(DataLoader(wrapped, batch_size=8), fetch_threads=1), wrapped
        )
        assert actual[:3] == [0, 1, 2] and 3 not in actual
        assert actual == expected

    def test_a_later_error_given_back_after_an_earlier_one(self) -> None:
        """Samples 0 and 1 both raise, 1's error given back after 0's cut the batch short:
        the batch completes (no sample counted twice) and raises 0's, as plain."""
        reading_1, reading_8 = threading.Event(), threading.Event()
        errors = {0: KeyError(0), 1: KeyError(1)}
        expected = outcomes(iter(DataLoader(Values(24, fail=errors), batch_size=8)))
        # sample 8 is read once the thread that gave back sample 0 moved on
        sets, waits = {1: reading_1, 8: reading_8}, {0: reading_1, 1: reading_8}
        data = Ordered(24, sets=sets, waits=waits, fail=errors)
        loader = BackgroundLoader(DataLoader(data, batch_size=8), depth=2, fetch_threads=2)
        actual = outcomes(iter(loader))
        assert [kind for kind, _ in actual] == ["error", "item", "item"]
        assert actual[0][1] is errors[0]
        assert_same_outcomes(actual, expected)

    @pytest.mark.parametrize("lower", [KeyError(3), Abort("first")], ids=["Exception", "Base"])
    def test_an_error_below_one_that_cut_the_batch_short(
        self, monkeypatch: pytest.MonkeyPatch, lower: BaseException
    ) -> None:
        """Sample 6 raises a BaseException once sample 7 is being read (every unit handed
        out); once that is given back, sample 3 raises: the batch completes, counting
        sample 7 once, and raises 3's error, after which the epoch goes on or ends as plain."""
        reading_7, cut_at_6 = threading.Event(), threading.Event()
        set_after(
            monkeypatch,
            SampleBoard,
            "give_back_and_take",
            cut_at_6,
            when=lambda batch, unit, part, error: (batch.seq, unit) == (0, 6),
        )
        errors: dict[int, BaseException] = {3: lower, 6: Abort("later")}
        expected = outcomes(iter(DataLoader(Values(24, fail=errors), batch_size=8)))
        data = Ordered(24, sets={7: reading_7}, waits={3: cut_at_6, 6: reading_7}, fail=errors)
        loader = BackgroundLoader(DataLoader(data, batch_size=8), depth=2, fetch_threads=8)
        actual = outcomes(iter(loader))
        kinds = ["error", "item", "item"] if isinstance(lower, Exception) else ["final"]
        assert [kind for kind, _ in actual] == kinds
        assert actual[0][1] is lower
        assert_same_outcomes(actual, expected)

    def test_a_final_keeps_the_batch_still_being_read_before_it(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A BaseException in batch 1 while batch 0 is still being read: the final drops the
        batches after it, not batch 0, which arrives before the exception."""
        cut = threading.Event()  # batch 1's final has dropped the batches after it
        set_after(monkeypatch, SampleBoard, "cut", cut)
        error = Abort("stop")
        data = Ordered(40, waits={0: cut}, fail={10: error})
        loader = BackgroundLoader(DataLoader(data, batch_size=8), fetch_threads=2)
        actual = outcomes(iter(loader))
        assert [kind for kind, _ in actual] == ["item", "final"]
        assert torch.equal(actual[0][1], data.data[:8]) and actual[1][1] is error
        wait_for(lambda: not prefetch_threads(), "every thread to leave")


def every_thread_in_a_read(data: Gated, batch_size: int, threads: int) -> Iterator[Any]:
    """Start an epoch over ``data`` (every read gated) and wait until each of its
    ``threads`` is blocked in a read; on a failure the gate is opened."""
    loader = BackgroundLoader(
        DataLoader(data, batch_size=batch_size), depth=2, fetch_threads=threads
    )
    iterator = iter(loader)
    try:
        begin(iterator)  # start it without next(), which would wait for the gate
        wait_for(lambda: data.waiting == threads, f"{threads} reads to wait at the gate")
    except BaseException:
        data.gate.set()
        raise
    return iterator


class TestBounds:
    """What is in flight is counted in samples and bounded."""

    @pytest.mark.parametrize("threads", [2, 4])
    def test_samples_being_read_stay_within_the_bound(self, threads: int) -> None:
        """Batches being read hold at most (threads + 1) batches of samples, and hit one batch."""
        data = Values(256, delays={i: 0.001 for i in range(256)})
        loader = BackgroundLoader(DataLoader(data, batch_size=32), depth=2, fetch_threads=threads)
        for _ in loader:
            time.sleep(0.002)
        peak = loader.stats.peak_samples
        assert 32 <= peak <= (threads + 1) * 32

    def test_peak_counts_the_samples_of_every_batch_being_read(self) -> None:
        """Two threads, each blocked in the read of a 1-sample batch: two batches are being
        read at once, and peak_samples counts the samples of both."""
        data = Gated(8, free=0)
        running = every_thread_in_a_read(data, batch_size=1, threads=2)
        try:
            assert running.stats.peak_samples == 2
        finally:
            data.gate.set()
        assert [int(batch) for batch in running] == list(range(8))
        assert 2 <= running.stats.peak_samples <= 3  # threads + 1 batches at most

    @pytest.mark.parametrize("how", ["close", "gc"])
    def test_stop_while_every_thread_is_in_a_read(self, how: str) -> None:
        """With 4 threads blocked inside one batch's reads, a stop returns and they all leave."""
        data = Gated(64, free=0)
        iterator = every_thread_in_a_read(data, batch_size=16, threads=4)
        try:
            assert data.started == 4  # one read per thread, each blocked: none begins another
            started = time.monotonic()
            if how == "close":
                iterator.close()
            else:
                del iterator
            assert time.monotonic() - started < 1.0
        finally:
            data.gate.set()
        wait_for(lambda: not prefetch_threads(), "every thread to leave")
        assert data.started == data.finished == 4


class Noisy(Dataset[torch.Tensor]):
    """Each sample is its index plus noise drawn from :func:`prefetch.sample_seed`."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> torch.Tensor:
        seed = sample_seed()
        assert seed is not None
        time.sleep(random.random() * 0.001)
        noise = torch.rand(2, generator=torch.Generator().manual_seed(seed))
        return index + noise


class TestSampleSeed:
    """sample_seed() depends on the sample's place in the epoch, not on the thread."""

    def epoch(self, threads: int, grain: str = "sample", seed: int = 3) -> torch.Tensor:
        torch.manual_seed(seed)
        loader = DataLoader(Noisy(), batch_size=6, shuffle=True)
        batches = BackgroundLoader(loader, fetch_threads=threads, fetch_grain=grain)
        return torch.cat(list(batches))

    def test_same_across_thread_counts_and_grains(self) -> None:
        """Two seeded runs give the same augmented batches with 1, 3 or 8 threads, either grain."""
        reference = self.epoch(1)
        for threads, grain in [(3, "sample"), (8, "sample"), (3, "batch")]:
            assert torch.equal(self.epoch(threads, grain), reference), (threads, grain)

    def test_differs_by_seed_and_by_sample(self) -> None:
        """Another base seed gives other noise; two samples never share a draw."""
        a, b = self.epoch(2, seed=3), self.epoch(2, seed=4)
        assert not torch.equal(a - a.floor(), b - b.floor())
        fractions = (a - a.floor()).flatten().tolist()
        assert len(set(fractions)) == len(fractions)

    def test_none_outside_the_reads(self) -> None:
        """On the loop's thread, and in a thread drawing whole items, there is no sample seed."""
        assert sample_seed() is None
        seen: list[int | None] = []

        class Probe(Dataset[int]):
            def __len__(self) -> int:
                return 2

            def __getitem__(self, index: int) -> int:
                seen.append(sample_seed())
                return index

        probe = Probe()
        assert list(BackgroundLoader(probe[index] for index in range(2))) == [0, 1]
        assert seen == [None, None]
        list(BackgroundLoader(DataLoader(probe)))  # the one thread reads the samples: seeded
        assert None not in seen[2:] and len(seen) == 4


class TestFetchGrainArgument:
    """fetch_grain is checked and named in its errors."""

    def test_other_value_is_refused(self) -> None:
        """A value other than 'sample' or 'batch' raises ValueError naming it."""
        with pytest.raises(
            ValueError, match=r"fetch_grain=\.\.\.\) expects 'sample' or 'batch', got 'samples'"
        ):
            BackgroundLoader(DataLoader(Values(4)), fetch_threads=2, fetch_grain="samples")  # type: ignore[arg-type]

    def test_batch_without_fetch_threads_is_refused(self) -> None:
        """fetch_grain='batch' without fetch_threads says that it needs them."""
        with pytest.raises(ValueError, match="needs fetch_threads"):
            BackgroundLoader(DataLoader(Values(4)), fetch_grain="batch")
