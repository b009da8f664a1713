"""Parallel fetch at the grain of samples (``fetch_grain="sample"``, the default).

A batch's samples are read by whichever threads are free and collated once
all are in; the batches, their order, their errors and the checkpoint state
stay the DataLoader's.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

from prefetch import BackgroundLoader, sample_seed

from .liveness import begin, wait_for
from .parallel import (
    Abort,
    Gated,
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

    @pytest.mark.parametrize("how", ["close", "gc"])
    def test_stop_while_every_thread_is_in_a_read(self, how: str) -> None:
        """With 4 threads blocked inside one batch's reads, a stop returns and they all leave."""
        data = Gated(64, free=0)
        loader = BackgroundLoader(DataLoader(data, batch_size=16), depth=2, fetch_threads=4)
        iterator = iter(loader)
        try:
            begin(iterator)  # start it without next(), which would wait for the gate
            wait_for(lambda: data.waiting == 4, "4 reads to wait at the gate")
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
