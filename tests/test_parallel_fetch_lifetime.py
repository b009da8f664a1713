"""Parallel fetch stops, bounds, resumes and lasts like one thread (issue 13).

With ``fetch_threads=N``: ``close()``, ``with``, ``break`` and garbage
collection stop all N threads, even while they are blocked in a read, and
nothing more is read; the items and bytes in flight stay within the bound
that counts every thread, and batches posted out of order count as ready
(what the adaptive depth hears); a ``StatefulDataLoader`` checkpoint taken after
any batch resumes exactly where the plain loader would; and a soak of random
epochs loses, repeats and leaks nothing.
"""

from __future__ import annotations

import copy
import gc
import random
import threading
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader
from prefetch._threads.engine import Engine
from prefetch._threads.sample_board import SampleBoard

from .liveness import begin, engine_of, set_after, wait_for, wait_went_ahead
from .parallel import (
    THREAD_COUNTS,
    Abort,
    Counted,
    Gated,
    Values,
    WithGetItems,
    assert_same_batches,
    assert_same_outcomes,
    outcomes,
)
from .processes import prefetch_threads, settle, wait_until

STOP_SECONDS = 1.0
"""Longest a stop may take while every thread is blocked in a read."""


def stop(held: list[Any], loader: BackgroundLoader[Any], how: str) -> None:
    """Stop the epoch in ``held`` (its only reference) the way a user would.

    ``close()`` on it or on its loader, a ``with`` block, or dropping it (as
    ``break`` does) and collecting garbage.
    """
    iterator = held.pop()
    if how == "close":
        iterator.close()
    elif how == "loader.close":
        loader.close()
    elif how == "with":
        with iterator:
            pass
    else:
        assert how == "gc"
        del iterator
        gc.collect()


class TestStopWhileBlockedInARead:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    @pytest.mark.parametrize("how", ["close", "loader.close", "with", "gc"])
    def test_stop_is_prompt_and_reads_nothing_more(self, threads: int, how: str) -> None:
        """A stop returns within 1 s with N threads in a read; after the gate, all N leave."""
        dataset = Gated(100)
        loader = BackgroundLoader(DataLoader(dataset), depth=4, fetch_threads=threads)
        try:
            held = [begin(iter(loader))]
            wait_for(lambda: dataset.waiting == threads, f"{threads} reads to wait at the gate")
            # Every thread is inside a read that waits for the gate: none can begin another.
            assert dataset.started == threads
            started = time.monotonic()
            stop(held, loader, how)
            assert time.monotonic() - started < STOP_SECONDS
            assert len(prefetch_threads()) == threads  # still in their reads
        finally:
            dataset.gate.set()
        wait_for(lambda: not prefetch_threads(), "every thread to leave")
        assert dataset.started == dataset.finished == threads

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_break_after_a_batch(self, threads: int) -> None:
        """Breaking out of the loop while the other reads are blocked stops every thread."""
        # Read 0 is free by its index: reads start in any order (with N threads, read 1 may
        # start before read 0; free-threaded 3.13t showed it), and the loop waits for batch 0.
        dataset = Gated(100, only=set(range(1, 100)))
        loader = BackgroundLoader(DataLoader(dataset), depth=4, fetch_threads=threads)
        try:
            for batch in loader:
                assert batch.tolist() == [0]
                wait_for(lambda: dataset.started == threads + 1, "the reads to start")
                break
            assert len(prefetch_threads()) == threads
        finally:
            dataset.gate.set()
        wait_for(lambda: not prefetch_threads(), "every thread to leave")
        assert dataset.started == dataset.finished == threads + 1


class TestReadyCount:
    def test_results_posted_out_of_order_count_as_ready(self) -> None:
        """Batches posted before an earlier one are taken with it, in order, once it is posted."""
        dataset = Gated(20, only={0, *range(5, 20)})  # 1..4 read at once; 0 and 5.. wait
        loader = BackgroundLoader(DataLoader(dataset), depth=4, fetch_threads=2)
        iterator = iter(loader)
        engine = engine_of(iterator)
        try:
            wait_for(lambda: engine.snapshot().posted == 4, "batches 1..4 posted")
            assert engine.snapshot().ready == 0  # batch 0 is missing: nothing in order yet
            dataset.gate.set()  # batch 0 now, after them; 5.. too, but no ticket is free
            wait_for(lambda: engine.snapshot().ready == 5, "batch 0 posted")
            dataset.gate.clear()  # batches 5.. wait again
            runs, waited = engine.consumer.exchange(0, 0, wait=False)
            assert [run.items[0].tolist() for run in runs] == [[index] for index in range(5)]
            assert waited == 0.0 and engine.snapshot().ready == 0
        finally:
            dataset.gate.set()
            iterator.close()


class TestInFlightBound:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    @pytest.mark.parametrize("depth", [1, 3])
    def test_items_read_ahead_count_every_thread(self, threads: int, depth: int) -> None:
        """Batches read and not yet consumed never exceed depth + N - 1, and reach it."""
        bound = depth + threads - 1
        dataset = Counted(bound + 24, bound)
        loader = BackgroundLoader(DataLoader(dataset), depth=depth, fetch_threads=threads)
        check_bound(loader, dataset, bound)

    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    @pytest.mark.parametrize(("budget", "fits"), [(3500, 3), (2000, 2), (500, 1)])
    def test_bytes_in_flight_respect_max_bytes(self, threads: int, budget: int, fits: int) -> None:
        """With max_bytes, the batches read ahead fit the budget (one always flows)."""
        dataset = Counted(40, fits, nbytes=1000)
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=None), depth=32, max_bytes=budget, fetch_threads=threads
        )
        check_bound(loader, dataset, fits)


class TestFirstRound:
    """Before any batch's size is known, the default budget lets every thread read."""

    @staticmethod
    def together(threads: int) -> Any:
        """A dataset whose reads wait (3 s at most) until ``threads`` reads are under way."""
        barrier = threading.Barrier(threads, timeout=3.0)

        class Together(torch.utils.data.Dataset[torch.Tensor]):
            def __len__(self) -> int:
                return 4 * threads

            def __getitem__(self, index: int) -> torch.Tensor:
                if index < threads:  # the first round: every thread reads at once, or none goes on
                    barrier.wait()
                return torch.full((256,), float(index))

        return Together()

    @pytest.mark.parametrize("threads", [2, 4])
    def test_default_budget_reads_the_first_round_at_once(self, threads: int) -> None:
        """depth='auto' (1 GiB budget): N first reads run together, as N workers' would."""
        loader = BackgroundLoader(
            DataLoader(self.together(threads), batch_size=None), fetch_threads=threads
        )
        got = [int(batch[0]) for batch in loader]
        assert got == list(range(4 * threads))  # a lone first read would break the barrier

    def test_a_budget_you_set_reads_one_until_a_size_is_known(self) -> None:
        """max_bytes given: the first read runs alone, so reads waiting for company fail."""
        loader = BackgroundLoader(
            DataLoader(self.together(2), batch_size=None), max_bytes=1 << 30, fetch_threads=2
        )
        with pytest.raises(threading.BrokenBarrierError):
            list(loader)

    def test_a_later_epoch_starts_from_the_size_seen(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each epoch's engine starts knowing the largest batch of the one before (0 at first)."""
        known: list[int] = []
        start = Engine.start

        def spy(self: Engine) -> None:
            known.append(
                self.snapshot().largest_item
            )  # before any thread runs: only the hint counts
            start(self)

        monkeypatch.setattr(Engine, "start", spy)
        loader = BackgroundLoader(
            DataLoader(Counted(12, 2, nbytes=1000), batch_size=None),
            depth=2,
            max_bytes=3500,
            fetch_threads=2,
        )
        assert len(list(loader)) == 12
        assert len(list(loader)) == 12
        assert known == [0, 1000]


def check_bound(loader: BackgroundLoader[Any], dataset: Counted, bound: int) -> None:
    """Consume slowly, letting the threads fill up; no read may begin beyond ``bound``."""
    iterator = begin(iter(loader))
    engine = engine_of(iterator)
    for _ in range(dataset.size):
        wanted = min(dataset.consumed_calls + bound, dataset.size)
        wait_for(lambda: dataset.started >= wanted, f"{wanted} reads to start", collect=False)  # noqa: B023
        wait_went_ahead(engine)  # the threads went as far as they may: no read can begin now
        dataset.consumed_calls += 1
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)
    assert dataset.violations == []
    assert dataset.most_ahead == bound


SAMPLES, BATCHES = 22, 8


def stateful() -> StatefulDataLoader:
    """A shuffled StatefulDataLoader of 8 batches (of 3, the last of 1) over :class:`Values`."""
    return StatefulDataLoader(Values(SAMPLES, "tuple"), batch_size=3, shuffle=True)


def plain_rest(taken: int | None) -> tuple[list[Any], list[Any]]:
    """The plain loader's first ``taken`` batches (all: ``None``) and what resumes after them."""
    torch.manual_seed(21)
    loader = stateful()
    iterator = iter(loader)
    head = [next(iterator) for _ in range(taken)] if taken is not None else list(iterator)
    state = copy.deepcopy(loader.state_dict())
    fresh = stateful()
    fresh.load_state_dict(state)
    torch.manual_seed(99)
    return head, list(fresh)


class TestResumeAtEveryPoint:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_resume_after_every_batch(self, threads: int) -> None:
        """A checkpoint after any k batches resumes with the plain loader's rest after k.

        The checkpoint is taken once the threads have read as far ahead as they
        may (depth 2: N + 1 batches beyond the last one consumed).
        """
        for taken in [*range(BATCHES + 1), None]:
            head, rest = plain_rest(taken)
            torch.manual_seed(21)
            loader = BackgroundLoader(stateful(), depth=2, fetch_threads=threads)
            iterator = begin(iter(loader))
            # taken None: a checkpoint taken at the end
            consumed = list(iterator) if taken is None else [next(iterator) for _ in range(taken)]
            drawn = min(BATCHES, len(consumed) + threads + 1)
            reads = min(SAMPLES, 3 * drawn)
            wait_for(lambda: len(loader.dataset.reads) == reads, f"{reads} samples read")  # noqa: B023
            state = copy.deepcopy(loader.state_dict())
            iterator.close()
            resumed = BackgroundLoader(stateful(), fetch_threads=threads)
            resumed.load_state_dict(state)
            torch.manual_seed(99)
            assert_same_batches(consumed, head)
            assert_same_batches(list(resumed), rest)
            if taken is not None:
                assert len(head) + len(rest) == BATCHES

    def test_a_getitems_dataset_resumes_after_the_batches_consumed(self) -> None:
        """Batches read in chunks through ``__getitems__`` carry their checkpoints too."""
        loader = BackgroundLoader(
            StatefulDataLoader(WithGetItems(12), batch_size=3), depth=2, fetch_threads=2
        )
        iterator = iter(loader)
        consumed = [next(iterator) for _ in range(2)]
        state = copy.deepcopy(loader.state_dict())
        iterator.close()
        resumed = BackgroundLoader(StatefulDataLoader(WithGetItems(12), batch_size=3))
        resumed.load_state_dict(state)
        plain = list(StatefulDataLoader(WithGetItems(12), batch_size=3))
        assert_same_batches(consumed, plain[:2])
        assert_same_batches(list(resumed), plain[2:])


class TestResumeAfterAnError:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    @pytest.mark.parametrize("batch", [0, 3])
    @pytest.mark.parametrize("where", ["read", "collate"])
    def test_checkpoint_at_a_failed_batch_resumes_after_it(
        self, threads: int, batch: int, where: str
    ) -> None:
        """A batch whose read or collate_fn raised was drawn: its checkpoint resumes after it.

        As the plain StatefulDataLoader: the failed batch is neither repeated
        nor anything after it skipped.
        """

        def collate(samples: list[Any]) -> Any:
            if where == "collate" and samples[0][1] == 3 * batch:  # no shuffle: batch's first
                raise KeyError("sample missing")
            return default_collate(samples)

        def failing() -> StatefulDataLoader:
            fail = {3 * batch + 1: KeyError("sample missing")} if where == "read" else {}
            dataset = Values(SAMPLES, "tuple", fail=fail)
            return StatefulDataLoader(dataset, 3, collate_fn=collate)

        def rest_after_the_error(loader: Any) -> tuple[list[Any], list[Any]]:
            iterator = iter(loader)
            head = [next(iterator) for _ in range(batch)]
            with pytest.raises(KeyError, match="sample missing"):
                next(iterator)
            state = copy.deepcopy(loader.state_dict())
            if isinstance(loader, BackgroundLoader):
                iterator.close()
            fresh = failing()
            fresh.load_state_dict(state)
            return head, list(fresh)

        plain_head, plain_rest = rest_after_the_error(failing())
        head, rest = rest_after_the_error(BackgroundLoader(failing(), fetch_threads=threads))
        assert len(plain_rest) == BATCHES - batch - 1
        assert_same_batches(head, plain_head)
        assert_same_batches(rest, plain_rest)


class TestTicketsComeBack:
    @pytest.mark.parametrize("threads", THREAD_COUNTS)
    def test_every_ticket_is_back_after_a_whole_epoch(self, threads: int) -> None:
        """Each batch's ticket is posted with it and given back: none in flight at the end."""
        loader = BackgroundLoader(
            DataLoader(Values(30), batch_size=3), depth=2, fetch_threads=threads
        )
        iterator = iter(loader)
        engine = engine_of(iterator)
        assert len(list(iterator)) == 10
        assert wait_until(lambda: not prefetch_threads(), 5.0), prefetch_threads()
        snapshot = engine.snapshot()
        assert (snapshot.in_flight, snapshot.fetched) == (0, 10)

    def test_every_ticket_is_back_after_an_ending_error(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A BaseException ends the epoch at batch 0 while thread B still reads batch 1:
        the later batch is cut, and once the threads left no ticket is in flight."""
        entered, release = threading.Event(), threading.Event()
        error = Abort("batch 0")
        set_after(
            monkeypatch, SampleBoard, "cut", release
        )  # batch 1 was cut while its read went on

        class Ending(Values):
            def __getitem__(self, index: int) -> Any:
                if index == 0:
                    assert entered.wait(10.0)  # batch 1 is being read
                    raise error
                if index == 1:
                    entered.set()
                    assert release.wait(10.0)  # until batch 0 ended the epoch there
                return super().__getitem__(index)

        loader = BackgroundLoader(DataLoader(Ending(8)), depth=4, fetch_threads=2)
        iterator = iter(loader)
        engine = engine_of(iterator)
        try:
            with pytest.raises(Abort) as raised:
                next(iterator)
            assert raised.value is error
            assert next(iterator, "over") == "over"
        finally:
            release.set()
            iterator.close()
        assert wait_until(lambda: not prefetch_threads(), 5.0), prefetch_threads()
        snapshot = engine.snapshot()
        assert (snapshot.in_flight, snapshot.fetched) == (0, 0)


class TestNothingReadAfterTheEnd:
    def test_a_batch_cut_by_an_ending_error_gives_out_no_more_samples(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Batch 1 is on the board, one sample being read and one not handed out, when a
        BaseException in batch 0 ends the epoch: that last sample is never read."""
        entered, release = threading.Event(), threading.Event()
        error = Abort("sample 0")
        set_after(
            monkeypatch, SampleBoard, "cut", release
        )  # batch 1 cut while its first sample is read

        class Ending(Values):
            def __getitem__(self, index: int) -> Any:
                if index == 0:
                    assert entered.wait(10.0)  # batch 1's first sample is being read
                    raise error
                if index == 2:
                    entered.set()
                    assert release.wait(10.0)  # until batch 0's error cut batch 1
                return super().__getitem__(index)

        dataset = Ending(8)
        loader = BackgroundLoader(DataLoader(dataset, batch_size=2), depth=4, fetch_threads=2)
        iterator = iter(loader)
        try:
            with pytest.raises(Abort) as raised:
                next(iterator)
            assert raised.value is error
            assert next(iterator, "over") == "over"
        finally:
            release.set()
            iterator.close()
        assert wait_until(lambda: not prefetch_threads(), 5.0), prefetch_threads()
        assert sorted(index for index, _ in dataset.reads) == [1, 2]  # 0 raised first

    @pytest.mark.parametrize("failing", [0, 2])
    def test_a_base_exception_in_a_sample_ends_its_batchs_reads(self, failing: int) -> None:
        """One thread reads a batch of 4 sample by sample: after a BaseException in sample
        ``failing``, the samples after it are not read (as the DataLoader's loop stops)."""
        error = Abort(f"sample {failing}")
        dataset = Values(8, fail={failing: error})
        loader = BackgroundLoader(DataLoader(dataset, batch_size=4), depth=2, fetch_threads=1)
        with pytest.raises(Abort) as raised:
            list(loader)
        assert raised.value is error
        assert wait_until(lambda: not prefetch_threads(), 5.0), prefetch_threads()
        assert [index for index, _ in dataset.reads] == list(range(failing + 1))


class TestSoak:
    def test_random_epochs(self) -> None:
        """Random thread counts, depths, errors and stops: nothing lost, repeated or left."""
        rng = random.Random(13)
        started, epochs = time.monotonic(), 0
        while epochs < 300 and time.monotonic() - started < 15:
            run_random_epoch(rng)
            epochs += 1
            if epochs % 50 == 0:
                assert settle(5.0) == ([], [])
        assert epochs >= 100
        assert settle(5.0) == ([], [])


def run_random_epoch(rng: random.Random) -> None:
    """One epoch with random settings, checked against the plain DataLoader's epoch."""
    size, batch = rng.randint(0, 30), rng.randint(1, 4)
    fail: dict[int, BaseException] = {}
    for index in rng.sample(range(size), min(size, rng.randint(0, 3))):
        fail[index] = KeyError(index)
    if size and rng.random() < 0.15:
        fail[rng.randrange(size)] = Abort("soak")
    dataset = Values(size, fail=fail)
    expected = outcomes(iter(DataLoader(dataset, batch_size=batch)))
    depth = rng.choice([1, 2, 4, "auto"])
    threads = rng.choice(THREAD_COUNTS)
    loader = BackgroundLoader(DataLoader(dataset, batch_size=batch), depth, fetch_threads=threads)
    limit = rng.choice([None, rng.randint(0, len(expected))])
    if limit is None:
        assert_same_outcomes(outcomes(iter(loader)), expected)
        return
    held = [iter(loader)]
    seen = outcomes(Taking(held[0], limit))
    assert_same_outcomes(seen, expected[:limit])
    for kind, value in seen:  # the dataset keeps raising these objects: their tracebacks
        if kind != "item":  # (our frames, which hold the iterator) must not keep it alive
            value.__traceback__ = None
    stop(held, loader, rng.choice(["close", "loader.close", "with", "gc"]))


class Taking:
    """An iterator over the first ``count`` outcomes of ``iterator``, errors included."""

    def __init__(self, iterator: Any, count: int) -> None:
        self.iterator = iterator
        self.left = count

    def __next__(self) -> Any:
        if self.left == 0:
            raise StopIteration
        self.left -= 1
        return next(self.iterator)
