"""``fetch_threads``' ceiling, ``thread_init_fn``, ``fetch_info()`` (issue 24), ``num_threads``.

A count no machine can use is refused, one above 32 per core warns once,
saying why; each fetch thread runs ``thread_init_fn(index)`` once before it
reads, and an error there reaches the loop; ``fetch_info()`` is the
threads' ``get_worker_info()``: the index, the count and the epoch's seed
inside a fetch thread, ``None`` anywhere else. The loading threads' torch ops
use ``num_threads`` threads (one per fetch thread by default), set for them
alone: the caller's and every later thread's count stay as they were.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import prefetch
from prefetch import BackgroundLoader, FetchInfo, fetch_info, sample_seed
from prefetch._threads.fetch_info import (
    _mix,
    call_thread_init,
    enter_fetch_thread,
    enter_sample,
    leave_fetch_thread,
    leave_sample,
)
from prefetch._threads.thread_side import ThreadSide
from prefetch._torch import intra_op
from prefetch._torch.intra_op import THREAD_INTRA_OP

from .liveness import engine_of, set_after, wait_for

WAIT_SECONDS = 10.0
"""Longest the threads may take to meet at the barrier before the test fails."""


class Recorder(Dataset[int]):
    """``size`` samples that record ``(sample, thread name, fetch_info())`` for each read.

    With ``meet``, the first ``meet`` reads wait for each other at a barrier,
    so they are made by that many threads at once.
    """

    def __init__(self, size: int, meet: int = 0, events: list[Any] | None = None) -> None:
        self.size = size
        self.events: list[Any] = events if events is not None else []
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(meet, timeout=WAIT_SECONDS) if meet else None
        self._meet = meet

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        with self._lock:
            self.events.append(("read", index, threading.current_thread().name, fetch_info()))
        if self._barrier is not None and index < self._meet:
            self._barrier.wait()
        return index


def reads(dataset: Recorder) -> list[tuple[int, str, FetchInfo | None]]:
    """The reads a dataset recorded, without the marker."""
    return [event[1:] for event in dataset.events if event[0] == "read"]


class TestCeiling:
    """fetch_threads above 256 is refused; above 32 per core warns once; "auto" stays within."""

    @pytest.mark.parametrize("count", [257, 1000])
    def test_above_256_is_refused(self, count: int) -> None:
        """The error names the argument, the range and the value, and says why."""
        with pytest.raises(ValueError, match=r"fetch_threads=\.\.\.\) expects") as raised:
            BackgroundLoader(DataLoader(Recorder(4)), fetch_threads=count)
        message = str(raised.value)
        assert "an int from 1 to 256, got " + str(count) in message
        assert f"read {count} batches ahead" in message

    def test_above_32_per_core_warns_once_at_the_users_line(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On 2 cores, 65 threads warn (once, over two epochs); the warning names this file."""
        monkeypatch.setattr(prefetch._threads.fetch_options, "available_cores", lambda: 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = BackgroundLoader(DataLoader(Recorder(8), batch_size=2), fetch_threads=65)
            for _ in range(2):
                assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        (warning,) = caught
        assert warning.category is UserWarning and warning.filename == __file__
        message = str(warning.message)
        assert message.startswith(
            "BackgroundLoader(fetch_threads=65): more than 32 threads per core "
            "(2 cores here, so 64 at most) cannot help"
        )
        assert "fetch_threads='auto'" in message

    @pytest.mark.parametrize("count", [64, "auto"])
    def test_within_the_ceiling_is_silent(
        self, monkeypatch: pytest.MonkeyPatch, count: int | str
    ) -> None:
        """64 threads on 2 cores, or "auto", say nothing."""
        monkeypatch.setattr(prefetch._threads.fetch_options, "available_cores", lambda: 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = BackgroundLoader(DataLoader(Recorder(2)), fetch_threads=count)
        assert caught == [] and loader.fetch_threads == count


class TestFetchInfo:
    """fetch_info() inside fetch threads; None everywhere else."""

    def test_three_threads_see_their_index_count_and_seed(self) -> None:
        """Three threads reading at once report indices 0, 1, 2, a count of 3 and the seed."""
        dataset = Recorder(12, meet=3)
        generator = torch.Generator().manual_seed(7)
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=1, generator=generator), fetch_threads=3
        )
        assert [batch.item() for batch in loader] == list(range(12))
        infos = [info for _, _, info in reads(dataset)]
        assert all(isinstance(info, FetchInfo) for info in infos)
        assert {info.index for info in infos} == {0, 1, 2}
        assert {info.threads for info in infos} == {3}
        expected = iter(DataLoader(dataset, generator=torch.Generator().manual_seed(7)))
        assert {info.seed for info in infos} == {expected._base_seed}  # type: ignore[attr-defined]
        by_thread = {(name, info.index) for _, name, info in reads(dataset)}
        assert len(by_thread) == 3  # one index per thread

    def test_seed_follows_the_global_generator_and_changes_each_epoch(self) -> None:
        """Without a generator the seed comes from torch's, as the DataLoader's own does."""
        dataset = Recorder(4)
        loader = BackgroundLoader(DataLoader(dataset, batch_size=2), fetch_threads=2)
        torch.manual_seed(3)
        expected = [iter(DataLoader(dataset))._base_seed for _ in range(2)]  # type: ignore[attr-defined]
        torch.manual_seed(3)
        seeds = []
        for _ in range(2):
            dataset.events.clear()
            list(loader)
            seeds.append({info.seed for _, _, info in reads(dataset)})
        assert seeds == [{expected[0]}, {expected[1]}] and expected[0] != expected[1]

    def test_none_outside_the_threads_that_read_samples(self) -> None:
        """The main thread, a plain DataLoader and a thread drawing whole items see None."""
        assert fetch_info() is None
        dataset = Recorder(4)
        assert list(DataLoader(dataset)) and len(reads(dataset)) == 4
        items = BackgroundLoader(dataset[index] for index in range(4))  # a generator: items
        assert [int(item) for item in items] == [0, 1, 2, 3] and len(reads(dataset)) == 8
        assert {info for _, _, info in reads(dataset)} == {None}
        assert all(name.startswith("prefetch-") for _, name, _ in reads(dataset)[4:])

    def test_the_one_thread_of_a_default_loader_reads_as_thread_zero(self) -> None:
        """Without fetch_threads, the thread reading a DataLoader's samples is thread 0 of 1."""
        dataset = Recorder(4)
        assert [batch.tolist() for batch in BackgroundLoader(DataLoader(dataset))] == [
            [0],
            [1],
            [2],
            [3],
        ]
        infos = {info for _, _, info in reads(dataset)}
        assert len(infos) == 1
        (info,) = infos
        assert info is not None and (info.index, info.threads) == (0, 1)

    def test_frozen(self) -> None:
        """A FetchInfo cannot be changed."""
        info = FetchInfo(0, 2, 5)
        with pytest.raises(AttributeError):
            info.index = 1  # type: ignore[misc]
        assert (info.index, info.threads, info.seed) == (0, 2, 5)


class TestIndexReuse:
    """A fetch thread that leaves frees its index for the next one started."""

    def test_a_lowered_then_raised_count_reuses_the_freed_indices(self) -> None:
        """Three threads, cut to one, then three again: the two new threads take the
        indices of the two that left (each thread's ``thread_init_fn`` says its index)."""
        started: list[tuple[int, str]] = []
        lock = threading.Lock()

        def init(index: int) -> None:
            with lock:
                started.append((index, threading.current_thread().name))

        loader = BackgroundLoader(
            DataLoader(Recorder(60), batch_size=1), depth=2, fetch_threads=3, thread_init_fn=init
        )
        iterator = iter(loader)
        engine = engine_of(iterator)
        try:
            wait_for(lambda: len(started) == 3, "three threads set up")
            engine.set_threads(1)
            wait_for(
                lambda: sum(thread.is_alive() for thread in engine.threads) == 1,
                "two threads to leave",
            )
            staying = {thread.name for thread in engine.threads if thread.is_alive()}
            left = {index for index, name in started if name not in staying}
            engine.set_threads(3)
            wait_for(lambda: len(started) == 5, "two more threads set up")
            assert {index for index, _ in started[3:]} == left
            assert [batch.item() for batch in iterator] == list(range(60))
        finally:
            iterator.close()


class TestThreadInitFn:
    """thread_init_fn(index) runs once per fetch thread, first; its error reaches the loop."""

    def test_only_a_fetch_thread_calls_it(self) -> None:
        """The hook's caller, outside a thread that reads samples, says where it runs."""
        called: list[int] = []
        message = r"^thread_init_fn runs only in parallel-fetch threads$"
        with pytest.raises(AssertionError, match=message):
            call_thread_init(called.append)
        assert called == []

    def test_called_once_per_thread_before_it_reads(self) -> None:
        """Three threads, two epochs: three calls each epoch, each before its thread's reads."""
        events: list[Any] = []
        lock = threading.Lock()

        def init(index: int) -> None:
            with lock:
                events.append(("init", index, threading.current_thread().name, fetch_info()))

        dataset = Recorder(12, meet=3, events=events)
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=1), fetch_threads=3, thread_init_fn=init
        )
        for _ in range(2):
            events.clear()
            assert [batch.item() for batch in loader] == list(range(12))
            inits = [event for event in events if event[0] == "init"]
            assert sorted(index for _, index, _, _ in inits) == [0, 1, 2]
            assert all(info is not None and info.index == index for _, index, _, info in inits)
            names = [name for _, _, name, _ in inits]
            assert len(set(names)) == 3
            for position, event in enumerate(events):
                if event[0] == "read":  # its thread was set up before
                    assert ("init", event[3].index, event[2], event[3]) in events[:position]

    def test_error_reaches_the_loop(self) -> None:
        """The hook's exception is raised in the loop as the same object; the epoch is over."""
        error = ValueError("no credentials for thread 1")

        def init(index: int) -> None:
            if index == 1:
                raise error

        loader = BackgroundLoader(
            DataLoader(Recorder(64), batch_size=1), fetch_threads=2, thread_init_fn=init
        )
        iterator = iter(loader)
        with pytest.raises(ValueError) as raised:
            for _ in iterator:
                pass
        assert raised.value is error
        assert next(iterator, "over") == "over"

    def test_the_first_failure_is_the_one_raised(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Both threads' hooks raise, thread 1's after thread 0's failure was numbered: the
        loop gets thread 0's, the epoch's end stands at the first failure."""
        failed = threading.Event()
        set_after(monkeypatch, ThreadSide, "fail", failed)
        errors = [ValueError("thread 0"), ValueError("thread 1")]

        def init(index: int) -> None:
            if index == 1:
                assert failed.wait(10.0)
            raise errors[index]

        loader = BackgroundLoader(
            DataLoader(Recorder(8), batch_size=1), fetch_threads=2, thread_init_fn=init
        )
        iterator = iter(loader)
        with pytest.raises(ValueError) as raised:
            next(iterator)
        assert raised.value is errors[0]
        assert next(iterator, "over") == "over"

    def test_refused_without_fetch_threads(self) -> None:
        """One thread has no fetch-thread index: the error says what it needs."""
        with pytest.raises(ValueError, match=r"thread_init_fn=\.\.\.\) runs in each parallel"):
            BackgroundLoader(DataLoader(Recorder(2)), thread_init_fn=print)

    def test_not_callable(self) -> None:
        """A value that is not a function is refused, naming the argument and the type."""
        with pytest.raises(TypeError, match=r"thread_init_fn=\.\.\.\) expects a function .* int"):
            BackgroundLoader(DataLoader(Recorder(2)), fetch_threads=2, thread_init_fn=3)  # type: ignore[arg-type]


class TestSampleSeed:
    """``sample_seed()``: one seed per sample of an epoch, from the base seed and its place."""

    @staticmethod
    def seeds(
        base: int, places: list[tuple[int, int]], offset: int | None = None
    ) -> list[int | None]:
        """``sample_seed(offset)`` at each place (``sample_seed()`` for ``None``), as a fetch
        thread of base seed ``base``."""
        seeds: list[int | None] = []

        def read() -> None:
            enter_fetch_thread(0, base, lambda: 1)
            try:
                for batch, position in places:
                    enter_sample(batch, position)
                    seeds.append(sample_seed() if offset is None else sample_seed(offset))
                    leave_sample()
            finally:
                leave_fetch_thread()

        thread = threading.Thread(target=read)  # its own thread-locals, none left behind
        thread.start()
        thread.join()
        return seeds

    def test_the_mixer_is_splitmix64s_finalizer(self) -> None:
        """splitmix64 from state 0 (the mixer over multiples of its gamma) gives its outputs."""
        gamma, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1
        outputs = [_mix(gamma * step & mask) for step in range(1, 5)]
        assert outputs == [
            0xE220A8397B1DCDAF,
            0x6E789E6AA1B965F4,
            0x06C45D188009454F,
            0xF88BB8A8724C81EC,
        ]

    def test_each_sample_of_an_epoch_has_its_own_seed(self) -> None:
        """1,000 places (40 batches of 25): 1,000 seeds, each fit for manual_seed."""
        places = [(batch, position) for batch in range(40) for position in range(25)]
        seeds = self.seeds(1234, places)
        assert len(set(seeds)) == len(places)
        assert all(seed is not None and 0 <= seed < 1 << 63 for seed in seeds)
        assert max(seed or 0 for seed in seeds) >= 1 << 62  # every one of the 63 bits is used

    def test_another_base_seed_gives_other_seeds(self) -> None:
        """Two epochs seeded apart share no sample seed at the same places."""
        places = [(batch, position) for batch in range(4) for position in range(8)]
        assert not set(self.seeds(1, places)) & set(self.seeds(2, places))

    def test_offset_is_the_seed_of_a_later_sample_of_the_batch(self) -> None:
        """In ``__getitems__``, ``sample_seed(k)`` is the seed of the sample k further on."""
        assert self.seeds(7, [(3, 2)], offset=5) == self.seeds(7, [(3, 7)])
        assert self.seeds(7, [(3, 2)], offset=5) != self.seeds(7, [(3, 2)])
        assert self.seeds(7, [(3, 2)], offset=0) == self.seeds(7, [(3, 2)])  # the default

    @pytest.mark.parametrize(("batch_size", "chunked"), [(3, False), (None, False), (3, True)])
    def test_a_loader_gives_each_sample_the_seed_of_its_place(
        self, batch_size: int | None, chunked: bool
    ) -> None:
        """Read by two threads, sample ``i`` gets the seed of its place: batch ``i // 3``,
        position ``i % 3`` (unbatched: batch ``i``, position 0), under the epoch's base seed;
        in ``__getitems__`` (chunked), ``sample_seed(k)`` for the chunk's sample ``k``."""
        seen: dict[int, tuple[int, int | None]] = {}

        class Seeds(Dataset[int]):
            def __len__(self) -> int:
                return 12

            def __getitem__(self, index: int) -> int:
                info = fetch_info()
                assert info is not None
                seen[index] = (info.seed, sample_seed())
                return index

        class ChunkSeeds(Seeds):
            def __getitems__(self, indices: list[int]) -> list[int]:
                info = fetch_info()
                assert info is not None
                for offset, index in enumerate(indices):
                    seen[index] = (info.seed, sample_seed(offset))
                return indices

        dataset = ChunkSeeds() if chunked else Seeds()
        loader = BackgroundLoader(DataLoader(dataset, batch_size=batch_size), fetch_threads=2)
        assert len(list(loader)) == (4 if batch_size else 12)
        (base,) = {seed for seed, _ in seen.values()}
        size = batch_size or 1
        places = [(index // size, index % size) for index in range(12)]
        assert [seen[index][1] for index in range(12)] == self.seeds(base, places)

    def test_a_resumed_epoch_goes_on_with_the_places_after_the_checkpoint(self) -> None:
        """A StatefulDataLoader resumed after 2 batches of 3: sample ``i`` still gets the seed
        of batch ``i // 3`` (the number goes on, not from 0)."""
        from torchdata.stateful_dataloader import StatefulDataLoader

        seen: dict[int, tuple[int | None, int | None]] = {}

        class Seeds(Dataset[int]):
            def __len__(self) -> int:
                return 12

            def __getitem__(self, index: int) -> int:
                info = fetch_info()  # None for the first, plain loader
                seen[index] = (None if info is None else info.seed, sample_seed())
                return index

        first = StatefulDataLoader(Seeds(), batch_size=3)
        iterator = iter(first)
        assert [next(iterator).tolist() for _ in range(2)] == [[0, 1, 2], [3, 4, 5]]
        state = first.state_dict()
        del iterator
        resumed = StatefulDataLoader(Seeds(), batch_size=3)
        resumed.load_state_dict(state)
        loader = BackgroundLoader(resumed, fetch_threads=2)
        assert [batch.tolist() for batch in loader] == [[6, 7, 8], [9, 10, 11]]
        (base,) = {seen[index][0] for index in range(6, 12)}
        assert base is not None
        places = [(index // 3, index % 3) for index in range(6, 12)]
        assert [seen[index][1] for index in range(6, 12)] == self.seeds(base, places)

    def test_none_in_collate_fn_after_the_reads(self) -> None:
        """``collate_fn`` runs in a fetch thread after a batch's reads: no sample, ``None``."""
        seen: list[int | None] = []

        def collate(samples: list[int]) -> list[int]:
            seen.append(sample_seed())
            return samples

        loader = DataLoader(list(range(8)), batch_size=2, collate_fn=collate)
        assert list(BackgroundLoader(loader, fetch_threads=2)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert seen == [None] * 4

    def test_none_between_reads(self) -> None:
        """In a fetch thread but outside a sample's read (``thread_init_fn``): ``None``."""
        seen: list[int | None] = []

        def init(index: int) -> None:
            seen.append(sample_seed())

        loader = BackgroundLoader(
            DataLoader(Recorder(4), batch_size=1), fetch_threads=2, thread_init_fn=init
        )
        assert len(list(loader)) == 4
        assert seen == [None, None]


class CountRecorder(Dataset[int]):
    """Samples that record the intra-op count of the thread reading them, after a parallel op."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.counts: list[int] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        torch.ones(1 << 17).add_(1)  # over ATen's grain: a parallel op, which reads the count
        self.counts.append(torch.get_num_threads())
        return index


def count_in_a_thread(run: Callable[[], Any] = lambda: None) -> tuple[Any, int]:
    """Call ``run`` in a new thread; return its result and that thread's intra-op count after."""
    done: list[tuple[Any, int]] = []
    thread = threading.Thread(target=lambda: done.append((run(), torch.get_num_threads())))
    thread.start()
    thread.join()
    return done[0]


def count_of_a_new_thread() -> int:
    """The intra-op count a thread started now gets (torch's process-wide one)."""
    return count_in_a_thread()[1]


SET_THIS_THREAD = intra_op._runtime  # the real lookup, whatever a test patches later
KNOWN_COUNT = 2
"""The caller's and the process-wide count inside :func:`known_counts`: not 1, so that a
loading thread's default of one tells apart from both."""


@contextlib.contextmanager
def known_counts() -> Iterator[int]:
    """Run with the caller's and torch's process-wide count at :data:`KNOWN_COUNT`.

    Another test (torchdata's threads call ``torch.set_num_threads(1)``) may
    have left them apart; both are put back after.
    """
    process, caller = count_of_a_new_thread(), torch.get_num_threads()
    torch.set_num_threads(KNOWN_COUNT)
    try:
        yield KNOWN_COUNT
    finally:
        torch.set_num_threads(process)  # the process-wide count, and the caller's
        setter = SET_THIS_THREAD()
        if caller != process and setter is not None:
            setter(caller)  # the caller's alone
        assert (torch.get_num_threads(), count_of_a_new_thread()) == (caller, process)


@pytest.mark.skipif(
    not THREAD_INTRA_OP.active(), reason=f"per-thread count off: {THREAD_INTRA_OP.problem()}"
)
class TestIntraOpThreads:
    """``num_threads`` (one with fetch_threads) sets the loading threads' count, theirs alone."""

    @pytest.mark.parametrize(
        ("settings", "expected"),
        [
            ({"fetch_threads": 2}, 1),
            ({"fetch_threads": 2, "num_threads": "more"}, "more"),
            ({"num_threads": "more"}, "more"),
        ],
        ids=["fetch-threads-default", "fetch-threads-num-threads", "one-thread-num-threads"],
    )
    def test_the_loading_threads_alone(self, settings: dict[str, Any], expected: Any) -> None:
        with known_counts() as before:
            more = before + 1  # told apart from the count every other thread has
            settings = {key: more if value == "more" else value for key, value in settings.items()}
            dataset = CountRecorder(8)
            loader = BackgroundLoader(DataLoader(dataset, batch_size=2), **settings)
            assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
            assert set(dataset.counts) == {more if expected == "more" else expected}
            assert loader.settings.num_threads == (more if expected == "more" else expected)
            assert torch.get_num_threads() == before  # the caller's
            assert count_of_a_new_thread() == before  # torch's process-wide count

    def test_one_thread_keeps_torchs_default(self) -> None:
        with known_counts() as before:
            dataset = CountRecorder(4)
            loader = BackgroundLoader(DataLoader(dataset, batch_size=2))
            assert len(list(loader)) == 2
            assert set(dataset.counts) == {before}
            assert loader.settings.num_threads is None
