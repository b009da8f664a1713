"""Parallel fetch gives exactly the DataLoader's batches (issue 13).

``BackgroundLoader(DataLoader(ds, num_workers=0), fetch_threads=N)`` reads
and collates batches in N threads. Whatever N, the loop sees what the
DataLoader itself gives: the same batches bit for bit in sampler order, the
same errors (the same objects) in the same places, the same random state
afterwards. Loaders it cannot read are refused when it is built. Stopping,
bounds, resume and a soak are in ``test_parallel_fetch_lifetime.py``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import namedtuple
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler
from torch.utils.data._utils.collate import default_collate

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._torch.fetcher import PARALLEL_FETCH

from .liveness import engine_of, wait_went_ahead
from .parallel import (
    THREAD_COUNTS,
    Abort,
    Values,
    WithGetItems,
    assert_same_batches,
    assert_same_outcomes,
    outcomes,
)
from .processes import live_child_pids, prefetch_threads, wait_until

EVERY_COUNT: list[int | str] = [*THREAD_COUNTS, "auto"]
Pair = namedtuple("Pair", ["features", "indices"])


def both(make: Any, threads: int | str, seed: int | None = 0) -> tuple[list[Any], list[Any]]:
    """One epoch of ``make()`` plain and through fetch_threads, each after the same seed."""
    if seed is not None:
        torch.manual_seed(seed)
    plain = list(make())
    if seed is not None:
        torch.manual_seed(seed)
    wrapped = list(BackgroundLoader(make(), fetch_threads=threads))
    return wrapped, plain


def pair_collate(samples: list[tuple[torch.Tensor, int]]) -> Pair:
    """A custom collate_fn: stacked features (scaled) and an index tensor, as a namedtuple."""
    features = torch.stack([row for row, _ in samples]) * 3 + 1
    return Pair(features, torch.tensor([index for _, index in samples]))


class UnevenBatches(Sampler[list[int]]):
    """A custom batch_sampler: batches of sizes 1, 2, 3, ... over a fixed permutation."""

    def __init__(self, size: int) -> None:
        self.order = torch.randperm(size, generator=torch.Generator().manual_seed(5)).tolist()

    def __iter__(self) -> Any:
        start, width = 0, 1
        while start < len(self.order):
            yield self.order[start : start + width]
            start, width = start + width, width + 1

    def __len__(self) -> int:
        return sum(1 for _ in self)


def is_slice_of_one(call: Any, batches: list[Any]) -> bool:
    """Whether ``call`` is a contiguous run of the indices of one of ``batches``."""
    call = list(call)
    for batch in batches:
        batch = list(batch)
        for start in range(len(batch) - len(call) + 1):
            if batch[start : start + len(call)] == call:
                return True
    return False


class TestSameBatchesAsTheDataLoader:
    @pytest.mark.parametrize("threads", EVERY_COUNT)
    @pytest.mark.parametrize("kind", ["tensor", "dict", "tuple"])
    def test_seeded_shuffle(self, threads: int | str, kind: str) -> None:
        """A shuffle seeded by torch.manual_seed gives the DataLoader's batches, bit for bit."""
        dataset = Values(53, kind)
        wrapped, plain = both(lambda: DataLoader(dataset, batch_size=4, shuffle=True), threads)
        assert_same_batches(wrapped, plain)
        assert len(plain) == 14

    @pytest.mark.parametrize("threads", EVERY_COUNT)
    def test_shuffle_with_a_generator(self, threads: int | str) -> None:
        """A shuffle driven by generator= gives the same batches and leaves it in the same state."""
        dataset = Values(40)
        plain_gen, wrapped_gen = torch.Generator(), torch.Generator()
        plain_gen.manual_seed(11)
        wrapped_gen.manual_seed(11)
        plain = list(DataLoader(dataset, batch_size=3, shuffle=True, generator=plain_gen))
        loader = DataLoader(dataset, batch_size=3, shuffle=True, generator=wrapped_gen)
        wrapped = list(BackgroundLoader(loader, fetch_threads=threads))
        assert_same_batches(wrapped, plain)
        assert torch.equal(wrapped_gen.get_state(), plain_gen.get_state())

    @pytest.mark.parametrize("threads", EVERY_COUNT)
    def test_random_state_after_the_epoch(self, threads: int | str) -> None:
        """After a seeded shuffled epoch, torch's next random draws are the DataLoader's."""
        dataset = Values(30)
        torch.manual_seed(3)
        list(DataLoader(dataset, batch_size=4, shuffle=True))
        plain_after = torch.rand(5)
        torch.manual_seed(3)
        list(
            BackgroundLoader(DataLoader(dataset, batch_size=4, shuffle=True), fetch_threads=threads)
        )
        assert torch.equal(torch.rand(5), plain_after)

    @pytest.mark.parametrize("threads", EVERY_COUNT)
    @pytest.mark.parametrize("drop_last", [True, False])
    def test_drop_last(self, threads: int | str, drop_last: bool) -> None:
        """drop_last keeps or drops the short last batch as the DataLoader does."""
        dataset = Values(23, "dict")
        make = lambda: DataLoader(dataset, batch_size=5, shuffle=True, drop_last=drop_last)  # noqa: E731
        wrapped, plain = both(make, threads)
        assert_same_batches(wrapped, plain)
        assert len(wrapped) == (4 if drop_last else 5)

    @pytest.mark.parametrize("threads", EVERY_COUNT)
    def test_custom_collate_fn(self, threads: int | str) -> None:
        """A custom collate_fn's batches (a namedtuple) come through with their type."""
        dataset = Values(31, "tuple")
        make = lambda: DataLoader(dataset, batch_size=4, shuffle=True, collate_fn=pair_collate)  # noqa: E731
        wrapped, plain = both(make, threads)
        assert_same_batches(wrapped, plain)
        assert all(type(batch) is Pair for batch in wrapped)

    @pytest.mark.parametrize("threads", EVERY_COUNT)
    def test_batch_size_none(self, threads: int | str) -> None:
        """batch_size=None: single samples, converted as the DataLoader converts them."""
        dataset = Values(17, "tuple")
        wrapped, plain = both(lambda: DataLoader(dataset, batch_size=None, shuffle=True), threads)
        assert_same_batches(wrapped, plain)
        assert len(wrapped) == 17

    @pytest.mark.parametrize("threads", EVERY_COUNT)
    def test_custom_batch_sampler(self, threads: int | str) -> None:
        """A custom batch_sampler's uneven batches arrive as the DataLoader gives them."""
        dataset = Values(29, "dict")
        make = lambda: DataLoader(dataset, batch_sampler=UnevenBatches(29))  # noqa: E731
        wrapped, plain = both(make, threads, seed=None)
        assert_same_batches(wrapped, plain)
        assert [len(batch["x"]) for batch in wrapped] == [1, 2, 3, 4, 5, 6, 7, 1]

    @pytest.mark.parametrize("threads", EVERY_COUNT)
    def test_getitems_is_used(self, threads: int | str) -> None:
        """A dataset's __getitems__ reads each batch, as in the DataLoader, and is called."""
        plain_set, wrapped_set = WithGetItems(26), WithGetItems(26)
        torch.manual_seed(8)
        plain = list(DataLoader(plain_set, batch_size=4, shuffle=True))
        torch.manual_seed(8)
        loader = DataLoader(wrapped_set, batch_size=4, shuffle=True)
        wrapped = list(BackgroundLoader(loader, fetch_threads=threads))
        assert_same_batches(wrapped, plain)
        assert len(plain_set.calls) == 7
        # At the grain of samples each batch is read in contiguous chunks, about one a thread.
        assert all(is_slice_of_one(call, plain_set.calls) for call in wrapped_set.calls)
        assert sorted(i for call in wrapped_set.calls for i in call) == sorted(range(26))
        assert wrapped_set.reads == []  # __getitem__ never called

    @pytest.mark.parametrize("threads", [1, 3])
    def test_getitems_sees_whole_batches_at_batch_grain(self, threads: int) -> None:
        """With fetch_grain="batch", __getitems__ gets exactly the DataLoader's batches."""
        plain_set, wrapped_set = WithGetItems(26), WithGetItems(26)
        torch.manual_seed(8)
        plain = list(DataLoader(plain_set, batch_size=4, shuffle=True))
        torch.manual_seed(8)
        loader = DataLoader(wrapped_set, batch_size=4, shuffle=True)
        wrapped = list(BackgroundLoader(loader, fetch_threads=threads, fetch_grain="batch"))
        assert_same_batches(wrapped, plain)
        assert sorted(wrapped_set.calls) == sorted(plain_set.calls)

    @pytest.mark.parametrize("threads", [1, 3])
    def test_getitems_is_not_used_without_batches(self, threads: int) -> None:
        """batch_size=None: the DataLoader reads each sample with __getitem__, never
        __getitems__ (which takes a list); so do the threads."""
        plain_set, wrapped_set = WithGetItems(6), WithGetItems(6)
        plain = list(DataLoader(plain_set, batch_size=None))
        wrapped = list(
            BackgroundLoader(DataLoader(wrapped_set, batch_size=None), fetch_threads=threads)
        )
        assert_same_batches(wrapped, plain)
        assert plain_set.calls == [] and wrapped_set.calls == []
        assert sorted(index for index, _ in wrapped_set.reads) == list(range(6))

    @pytest.mark.parametrize(("batch", "threads", "chunk"), [(12, 3, 4), (4, 4, 1), (6, 1, 6)])
    def test_getitems_chunks_one_per_thread(self, batch: int, threads: int, chunk: int) -> None:
        """At the grain of samples a batch is read in one chunk per thread: 12 over 3 threads
        in chunks of 4, 4 over 4 in chunks of 1, and over 1 thread the whole batch at once."""
        dataset = WithGetItems(2 * batch)
        loader = DataLoader(dataset, batch_size=batch)
        wrapped = list(BackgroundLoader(loader, fetch_threads=threads))
        assert_same_batches(wrapped, list(DataLoader(WithGetItems(2 * batch), batch_size=batch)))
        chunks = sorted(tuple(call) for call in dataset.calls)
        assert chunks == [tuple(range(s, s + chunk)) for s in range(0, 2 * batch, chunk)]

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_set_epoch_reshuffles_a_distributed_sampler(self, threads: int) -> None:
        """set_epoch reshuffles a DistributedSampler exactly as the DataLoader does, each epoch."""
        dataset = Values(50)

        def make() -> DataLoader[Any]:
            sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=4)
            return DataLoader(dataset, batch_size=4, sampler=sampler)

        plain, wrapped = make(), BackgroundLoader(make(), fetch_threads=threads)
        firsts = []
        for epoch in range(3):
            plain.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            wrapped.set_epoch(epoch)
            assert wrapped.sampler.epoch == epoch  # type: ignore[attr-defined]
            expected = list(plain)
            assert_same_batches(list(wrapped), expected)
            firsts.append(expected[0])
        assert not torch.equal(firsts[0], firsts[1])  # the epochs were reshuffled


class TestOrder:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_slow_samples_arrive_in_sampler_order(self, threads: int) -> None:
        """Samples that take random times still arrive in sampler order."""
        rng = random.Random(threads)
        delays = {i: rng.choice([0.0, 0.0, 0.001, 0.004, 0.012]) for i in range(48)}
        dataset = Values(48, "tuple", delays=delays)
        make = lambda: DataLoader(dataset, batch_size=2, shuffle=True)  # noqa: E731
        wrapped, plain = both(make, threads)
        assert_same_batches(wrapped, plain)
        if threads > 1:  # the reads really were spread over threads
            assert len({name for _, name in dataset.reads[48:]}) > 1


class FailingDraws:
    """A batch sampler of twelve one-sample batches whose draws at the positions of ``errors``
    (from 1) raise its error there and go on; ``draws`` counts its draws.

    A plain object that is its own iterator and starts over in ``__iter__``, as
    hand-written samplers do: the DataLoader calls ``iter()`` on it once an epoch.
    """

    def __init__(self, errors: dict[int, Exception]) -> None:
        self.errors = errors
        self.draws = self.position = 0

    def __iter__(self) -> FailingDraws:
        self.position = 0
        return self

    def __next__(self) -> list[int]:
        self.draws += 1
        self.position += 1
        if self.position > 12:
            raise StopIteration
        if self.position in self.errors:
            raise self.errors[self.position]
        return [self.position]

    def __len__(self) -> int:
        return 12


class TestErrorsInPlace:
    @pytest.mark.parametrize("threads", [None, 2])
    @pytest.mark.parametrize("failing", [(), (1,), (1, 2, 5), (3, 12)])
    def test_a_samplers_draw_errors_in_place(
        self, threads: int | None, failing: tuple[int, ...]
    ) -> None:
        """A batch sampler whose draws raise and go on, the first one included: the
        DataLoader's batches and errors, each once, in its order (the first draw, taken in
        iter() to fix a seeded shuffle, is not repeated)."""
        errors: dict[int, Exception] = {position: KeyError(position) for position in failing}
        plain = outcomes(iter(DataLoader(Values(20), batch_sampler=FailingDraws(errors))))
        sampler = FailingDraws(errors)
        loader = BackgroundLoader(
            DataLoader(Values(20), batch_sampler=sampler), fetch_threads=threads
        )
        assert_same_outcomes(outcomes(iter(loader)), plain)
        assert sampler.draws == 13

    @pytest.mark.parametrize("threads", [2, 3])
    def test_draw_errors_hold_a_ticket_each(self, threads: int) -> None:
        """A sampler's errors that go on take a ticket each, as batches do: with the loop away
        the threads draw depth + threads - 1 times, no more; then the DataLoader's outcomes."""
        errors: dict[int, Exception] = {position: KeyError(position) for position in (2, 4, 6)}
        plain = outcomes(iter(DataLoader(Values(20), batch_sampler=FailingDraws(errors))))
        sampler = FailingDraws(errors)
        loader = BackgroundLoader(
            DataLoader(Values(20), batch_sampler=sampler), depth=2, fetch_threads=threads
        )
        iterator = iter(loader)
        try:
            wait_went_ahead(engine_of(iterator))
            assert sampler.draws == 2 + threads - 1
            assert_same_outcomes(outcomes(iterator), plain)
        finally:
            iterator.close()

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    @pytest.mark.parametrize("batch", [0, 3, 9])
    def test_getitem_error_then_the_epoch_goes_on(self, threads: int, batch: int) -> None:
        """An Exception reading batch k arrives as the same object after 0..k-1; k+1 follows."""
        error = KeyError("sample missing")
        dataset = Values(30, fail={batch * 3 + 1: error})
        plain = outcomes(iter(DataLoader(dataset, batch_size=3)))
        wrapped = outcomes(
            iter(BackgroundLoader(DataLoader(dataset, batch_size=3), fetch_threads=threads))
        )
        assert_same_outcomes(wrapped, plain)
        assert [kind for kind, _ in wrapped].index("error") == batch
        assert len(wrapped) == 10 and wrapped[batch][1] is error

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_collate_error_then_the_epoch_goes_on(self, threads: int) -> None:
        """An Exception in collate_fn arrives in its batch's place; later batches follow."""
        errors = {2: ValueError("bad batch 2"), 5: ValueError("bad batch 5")}

        def collate(samples: list[tuple[torch.Tensor, int]]) -> Any:
            error = errors.get(samples[0][1] // 3)  # no shuffle: the batch's number
            if error is not None:
                raise error
            return default_collate(samples)

        dataset = Values(24, "tuple")
        plain = outcomes(iter(DataLoader(dataset, batch_size=3, collate_fn=collate)))
        loader = DataLoader(dataset, batch_size=3, collate_fn=collate)
        wrapped = outcomes(iter(BackgroundLoader(loader, fetch_threads=threads)))
        assert_same_outcomes(wrapped, plain)
        kinds = ["item", "item", "error", "item", "item", "error", "item", "item"]
        assert [kind for kind, _ in wrapped] == kinds
        assert wrapped[2][1] is errors[2] and wrapped[5][1] is errors[5]

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    @pytest.mark.parametrize("raiser", ["read", "collate_fn"])
    def test_stop_iteration_from_a_read_is_raised_in_place(self, threads: int, raiser: str) -> None:
        """A read or ``collate_fn`` raising StopIteration does not end the epoch: it is
        raised in place, as plain.

        The plain DataLoader lets it out of that ``next()`` (a ``for`` loop
        ends there) and a later ``next()`` goes on with the next batch; the
        wrapper does the same, not taking it for the source's end.
        """
        stop = StopIteration(f"{raiser} stopped")

        def collate(samples: list[Any]) -> Any:
            batch = default_collate(samples)
            if raiser == "collate_fn" and torch.equal(batch, dataset.data[3:6]):
                raise stop
            return batch

        def after_the_stop(iterator: Any) -> tuple[list[Any], list[Any]]:
            before = []
            with pytest.raises(StopIteration) as raised:
                while True:
                    before.append(next(iterator))
            assert raised.value is stop
            return before, list(iterator)

        dataset = Values(12, fail={4: stop} if raiser == "read" else {})
        plain = after_the_stop(iter(DataLoader(dataset, batch_size=3, collate_fn=collate)))
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=3, collate_fn=collate), fetch_threads=threads
        )
        wrapped = after_the_stop(iter(loader))
        assert (len(plain[0]), len(plain[1])) == (1, 2)
        assert_same_batches(wrapped[0], plain[0])
        assert_same_batches(wrapped[1], plain[1])

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    @pytest.mark.parametrize("batch", [0, 4])
    def test_base_exception_ends_the_epoch(self, threads: int, batch: int) -> None:
        """A BaseException in batch k ends the epoch after 0..k-1, and no thread is left."""
        abort = Abort("stop reading")
        dataset = Values(40, fail={batch * 2: abort})
        plain = list(DataLoader(Values(40), batch_size=2))[:batch]
        iterator = iter(BackgroundLoader(DataLoader(dataset, batch_size=2), fetch_threads=threads))
        seen = outcomes(iterator)
        assert seen[-1] == ("final", abort) and seen[-1][1] is abort
        assert_same_batches([item for _, item in seen[:-1]], plain)
        with pytest.raises(StopIteration):
            next(iterator)
        assert wait_until(lambda: not prefetch_threads(), 5.0), prefetch_threads()


class NoLen(IterableDataset[int]):
    """An IterableDataset: only its own iterator can read it."""

    def __iter__(self) -> Any:
        return iter(range(4))


NamedLikeHuggingFaces = type(
    "IterableDataset",  # Hugging Face's class has the name of torch's
    (NoLen,),
    {"__module__": "datasets.iterable_dataset", "__qualname__": "IterableDataset"},
)


class OwnIter(DataLoader[Any]):
    """A DataLoader subclass with its own ``__iter__``, as accelerate's prepared loaders."""

    def __iter__(self) -> Any:
        yield from super().__iter__()


class WithState(Values):
    """A map-style dataset with its own checkpoint state."""

    def state_dict(self) -> dict[str, int]:
        return {"reads": len(self.reads)}


class TestRefusals:
    @pytest.mark.parametrize(
        ("loader", "error", "why"),
        [
            (
                [torch.zeros(2)] * 3,
                TypeError,
                "reads a DataLoader's dataset, sampler and collate_fn in threads; got list. "
                "For any other iterable leave fetch_threads unset: one thread overlaps its "
                "loading with your loop",
            ),
            (
                (x for x in range(3)),
                TypeError,
                "reads a DataLoader's dataset, sampler and collate_fn in threads; got generator. "
                "For any other iterable leave fetch_threads unset: one thread overlaps its "
                "loading with your loop",
            ),
            (
                DataLoader(NoLen(), batch_size=2),
                TypeError,
                "needs a map-style dataset (indices to read in parallel); got NoLen, an "
                "IterableDataset, which only its own iterator can read, in order. Leave "
                "fetch_threads unset, or give it num_workers (each worker process reads its "
                "own shard)",
            ),
            (
                DataLoader(NamedLikeHuggingFaces(), batch_size=2),
                TypeError,
                "needs a map-style dataset (indices to read in parallel); got an "
                "IterableDataset (from datasets.iterable_dataset), which only its own iterator "
                "can read, in order. Leave fetch_threads unset, or give it num_workers (each "
                "worker process reads its own shard)",
            ),
            (
                DataLoader(Values(8), batch_size=2, num_workers=1),  # one worker is one too many
                ValueError,
                "replaces worker processes with threads, but this DataLoader has "
                "num_workers=1. Build it with num_workers=0, or leave fetch_threads unset to "
                "overlap the workers' batches with one thread",
            ),
            (
                OwnIter(Values(8), batch_size=2),
                TypeError,
                "reads a DataLoader's batches without its own next(), but OwnIter defines its "
                "own __iter__() (accelerate's prepared loaders do: device placement, "
                "synchronised random states), which parallel fetch would skip. Pass a "
                "DataLoader or StatefulDataLoader, or leave fetch_threads unset over this one",
            ),
            (
                DataLoader(WithState(8), batch_size=2),
                ValueError,
                "cannot read a dataset with its own state (WithState.state_dict) from several "
                "threads: the state would not match the batches. Leave fetch_threads unset",
            ),
        ],
        ids=[
            "list",
            "generator",
            "iterable-dataset",
            "hf-named",
            "num-workers",
            "own-iter",
            "dataset-state",
        ],
    )
    def test_each_refusal_says_why_and_what_to_do(
        self, loader: Any, error: type[Exception], why: str
    ) -> None:
        """A loader threads cannot read is refused at once, with the whole message: what
        threads read, what they were given, what to do instead; no thread is started."""
        with pytest.raises(error) as raised:
            BackgroundLoader(loader, fetch_threads=2)
        assert str(raised.value) == f"BackgroundLoader(fetch_threads=...) {why}"
        assert prefetch_threads() == []

    def test_torch_internals_gone_are_refused_after_the_loader_checks(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With the fetcher's internals gone (torch changed them), a DataLoader threads could
        read is refused with a RuntimeError naming them; a DataLoader with workers is still
        refused for its workers first."""
        monkeypatch.setattr(PARALLEL_FETCH, "problem", lambda: "no _dataset_fetcher")
        with pytest.raises(RuntimeError) as raised:
            BackgroundLoader(DataLoader(Values(8), batch_size=2), fetch_threads=2)
        message = str(raised.value)
        assert message.startswith(
            "BackgroundLoader(fetch_threads=...) needs the internals of torch's DataLoader iterator"
        )
        assert "(no _dataset_fetcher; checked on torch " in message
        with pytest.raises(ValueError, match="num_workers=2"):
            BackgroundLoader(DataLoader(Values(8), num_workers=2), fetch_threads=2)

    def test_workers_given_after_construction_are_refused_at_the_first_next(self) -> None:
        """``num_workers`` set on the DataLoader after wrapping it (torch allows that):
        the epoch's first ``next()`` refuses the workers' iterator, naming it, and no
        worker process or thread is left."""
        data = DataLoader(Values(8), batch_size=2)
        loader = BackgroundLoader(data, fetch_threads=2)
        data.num_workers, data.prefetch_factor = 2, 2  # what DataLoader(...) sets for workers
        with pytest.raises(TypeError) as raised:
            next(iter(loader))
        assert str(raised.value) == (
            "BackgroundLoader(fetch_threads=...) needs torch's single-process DataLoader "
            "iterator; iter(DataLoader) gave _MultiProcessingDataLoaderIter"
        )
        assert wait_until(lambda: not live_child_pids(), 10.0), live_child_pids()
        assert wait_until(lambda: not prefetch_threads(), 5.0), prefetch_threads()

    @pytest.mark.parametrize(
        ("value", "error"),
        [
            (0, ValueError),
            (-1, ValueError),
            (1.5, TypeError),
            ("many", TypeError),
            (True, TypeError),
        ],
    )
    def test_bad_values_name_the_argument(self, value: Any, error: type[Exception]) -> None:
        """fetch_threads=0, -1, 1.5, 'many' or True is refused, naming it and the value."""
        with pytest.raises(error) as raised:
            BackgroundLoader(DataLoader(Values(4)), fetch_threads=value)
        message = str(raised.value)
        assert "fetch_threads" in message and repr(value) in message
        assert "int from 1 to 256" in message and "'auto'" in message


class TestStacking:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_cuda_prefetcher_on_top(self, threads: int) -> None:
        """CudaPrefetcher over parallel fetch gives the same batches; len and set_epoch pass."""
        dataset = Values(44, "dict")

        def make() -> DataLoader[Any]:
            sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=9)
            return DataLoader(dataset, batch_size=4, sampler=sampler)

        plain = make()
        stacked = CudaPrefetcher(BackgroundLoader(make(), fetch_threads=threads), device="cpu")
        assert len(stacked) == len(plain) == 11
        for epoch in (0, 1):
            plain.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            stacked.set_epoch(epoch)
            assert stacked.sampler.epoch == epoch
            assert_same_batches(list(stacked), list(plain))


class TestStats:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_every_thread_reports_its_fetch_time(self, threads: int) -> None:
        """stats.fetch_threads is N and each of the N threads has a positive fetch time."""
        barrier = threading.Barrier(threads, timeout=10.0)

        class Rendezvous(Values):
            """The first N reads wait for each other: N threads must be reading at once."""

            def __getitem__(self, index: int) -> Any:
                if index < threads:
                    barrier.wait()
                time.sleep(0.002)
                return super().__getitem__(index)

        loader = BackgroundLoader(
            DataLoader(Rendezvous(2 * threads)), depth=1, fetch_threads=threads
        )
        batches = list(loader)
        assert len(batches) == 2 * threads
        stats = loader.stats
        assert stats.fetch_threads == threads == stats.peak_fetch_threads
        assert len(stats.fetch_seconds) == threads
        assert all(seconds > 0 for seconds in stats.fetch_seconds), stats.fetch_seconds

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_collate_time_is_counted(self, threads: int) -> None:
        """A slow collate_fn shows in stats.collate_seconds, apart from the fetch time."""

        def slow_collate(samples: list[torch.Tensor]) -> torch.Tensor:
            time.sleep(0.01)
            return default_collate(samples)

        loader = DataLoader(Values(12), batch_size=3, collate_fn=slow_collate)
        background = BackgroundLoader(loader, fetch_threads=threads)
        assert len(list(background)) == 4
        assert background.stats.collate_seconds >= 4 * 0.01
        assert background.stats.collate_seconds <= background.stats.source_seconds

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_a_failed_batch_adds_no_collate_time(self, threads: int) -> None:
        """A batch whose read raised is never collated: collate_seconds counts none of it."""
        dataset = Values(12, fail={index: KeyError(index) for index in range(12)})
        background = BackgroundLoader(DataLoader(dataset, batch_size=3), fetch_threads=threads)
        kinds = [kind for kind, _ in outcomes(iter(background))]
        assert kinds == ["error"] * 4
        stats = background.stats
        assert stats.collate_seconds == 0.0
        assert all(seconds >= 0.0 for seconds in stats.fetch_seconds), stats.fetch_seconds

    def test_the_default_loader_reads_a_batch_at_a_time(self) -> None:
        """Without fetch_threads the one thread reads each batch whole, as a worker does.

        One read per batch (``fetch_reads``), one thread in the stats, and the
        DataLoader's batches; at the grain of samples it would count a read per
        sample.
        """
        reads: list[int] = []

        class Counted(Values):
            def __getitem__(self, index: int) -> Any:
                reads.append(index)
                return super().__getitem__(index)

        loader = BackgroundLoader(DataLoader(Counted(12), batch_size=4), depth=2)
        expected = [batch.tolist() for batch in DataLoader(Values(12), batch_size=4)]
        assert [batch.tolist() for batch in loader] == expected
        stats = loader.stats
        assert (stats.fetch_threads, stats.peak_fetch_threads) == (1, 1)
        assert stats.fetch_reads == [3] and stats.peak_samples == 4
        assert sorted(reads) == list(range(12))

    @pytest.mark.parametrize("threads", [None, 2])
    def test_no_byte_limit_counts_no_bytes(self, threads: int | None) -> None:
        """A fixed depth without max_bytes does not measure its batches: peak_bytes stays 0."""
        data = DataLoader(torch.zeros(12, 256), batch_size=4)
        loader = BackgroundLoader(data, depth=2, fetch_threads=threads)
        assert [batch.shape for batch in loader] == [torch.Size([4, 256])] * 3
        assert loader.stats.peak_bytes == 0
        bounded = BackgroundLoader(data, depth=2, max_bytes=1 << 20, fetch_threads=threads)
        assert len(list(bounded)) == 3
        assert bounded.stats.peak_bytes >= 4 * 256 * 4  # a batch at least, when a limit applies
