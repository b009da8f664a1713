"""Each figure of ``LoaderStats`` means what its docstring says (issue 35), exactly.

Every test drives a scripted source and loop through a real
``BackgroundLoader``. Time-based figures read a fake clock that moves only
when the script says: the source moves it while the loop waits for an item
(the wait), the loop moves it in its step. Where the script needs the other
side to have reached a point (the loop waiting for item ``i``, the source
inside ``next()``), it waits for that, bounded (:func:`tests.liveness.wait_for`);
nothing sleeps, and no assertion is about how long anything took.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, LoaderStats
from prefetch._shared import cpu_clock, epoch, stats, totals
from prefetch._threads import (
    consumer_side,
    iterator,
    parallel_fetch,
    producers,
    shared,
    thread_side,
)

from .clocks import START, FakeClock
from .liveness import engine_of, threads_blocked, wait_for

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Every module that stamps a figure reads the fake clock."""
    fake = FakeClock()
    for module in (
        epoch, stats, totals, iterator, consumer_side, thread_side, producers, parallel_fetch,
    ):  # fmt: skip
        monkeypatch.setattr(module, "time", fake)
    return fake


class Script:
    """A source that yields ``len(loads)`` items, each once the loop waits for it.

    Item ``i`` (and the end, after the last) is made only when the loop's
    ``next()`` waits for it: the source then moves the clock by ``loads[i]``
    (the last entry is the end's). ``entered[i]`` is set when the source is
    asked for item ``i``.
    """

    def __init__(self, loads: list[float], clock: FakeClock | None = None) -> None:
        self.loads, self.clock = loads, clock
        self.entered = [threading.Event() for _ in loads]
        self.iterator: Any = None  # the epoch's iterator, once started
        self.engine: Any = None  # and its engine

    def start(self, iterator: Any) -> None:
        """Start the epoch of ``iterator`` (over this source); the source may look at it now."""
        self.engine = engine_of(iterator)
        self.iterator = iterator

    def waiting_for(self, index: int) -> bool:
        """Whether the loop waits inside next() for item ``index``."""
        it, engine = self.iterator, self.engine
        if it is None:
            return False
        return bool(it.stats.items == index and engine.shared.consumer_waiting)

    def __iter__(self) -> Iterator[int]:
        for index, load in enumerate(self.loads):
            self.entered[index].set()
            wait_for(lambda index=index: self.waiting_for(index), f"the loop to wait for {index}")
            if self.clock is not None:
                self.clock.advance(load)
            if index < len(self.loads) - 1:
                yield index


def run(script: Script, loader: BackgroundLoader[Any], steps: list[float], clock: FakeClock) -> Any:
    """The loop: take each item, let the source enter its next draw, then step."""
    iterator_ = iter(loader)
    script.start(iterator_)
    for index, step in enumerate(steps):
        assert next(iterator_) == index
        assert script.entered[index + 1].wait(5), f"the source never drew after item {index}"
        clock.advance(step)
    with pytest.raises(StopIteration):
        next(iterator_)
    return iterator_


class TestWaitAndElapsed:
    """items, wait_seconds, end_wait_seconds, elapsed_seconds, wait_fraction, source_seconds."""

    LOADS = [1.0, 2.0, 4.0, 16.0]  # three items, then the end
    STEPS = [0.5, 0.25, 8.0]

    def epoch(self, clock: FakeClock) -> LoaderStats:
        script = Script(self.LOADS, clock)
        loader = BackgroundLoader(script, depth=1)
        run(script, loader, self.STEPS, clock)
        return loader.stats

    def test_items(self, clock: FakeClock) -> None:
        """Items handed to the loop."""
        assert self.epoch(clock).items == 3

    def test_wait_seconds_are_the_waits_for_items(self, clock: FakeClock) -> None:
        """Each wait for an item, exactly; the wait for the end is not among them."""
        assert self.epoch(clock).wait_seconds == 1.0 + 2.0 + 4.0

    def test_end_wait_seconds_is_the_wait_after_the_last_item(self, clock: FakeClock) -> None:
        """The loop waited 16 s for the end of the data: outside the epoch's time."""
        assert self.epoch(clock).end_wait_seconds == 16.0

    def test_elapsed_runs_from_the_start_to_the_last_item(self, clock: FakeClock) -> None:
        """Waits and steps up to the last item; not the last step, nor the end."""
        figures = self.epoch(clock)
        assert figures.started == START and figures.last_handoff == START + 7.75
        assert figures.elapsed_seconds == 1.0 + 0.5 + 2.0 + 0.25 + 4.0
        assert figures.finished == START + 7.75 + 8.0 + 16.0

    def test_wait_fraction_and_the_summary_never_exceed_the_time(self, clock: FakeClock) -> None:
        """The share and the summary's seconds are of the same time: 7.00 s of 7.75 s."""
        figures = self.epoch(clock)
        assert figures.wait_fraction == 7.0 / 7.75
        assert figures.summary().startswith(
            "waited 90% of the time for data (7.00 s of 7.75 s, 3 items), "
            "then 16.00 s after the last item; depth 1 (peak 1)"
        )

    def test_source_seconds_is_the_time_inside_the_source(self, clock: FakeClock) -> None:
        """From each draw's start to its item: the loads, and the steps it spent blocked in it."""
        assert self.epoch(clock).source_seconds == sum(self.LOADS) + sum(self.STEPS)

    def test_an_error_after_the_last_item_is_an_end_wait(self, clock: FakeClock) -> None:
        """A wait that ends in an error, not an item, stays out of wait_seconds."""
        script = Script([0.5, 3.0], clock)

        def failing() -> Iterator[int]:
            yield from script  # item 0, then the loop waits 3 s for the next draw
            raise ValueError("bad record")

        loader = BackgroundLoader(failing(), depth=1)
        it = iter(loader)
        script.start(it)
        assert next(it) == 0
        with pytest.raises(ValueError, match="bad record"):
            next(it)
        figures = loader.stats
        assert (figures.wait_seconds, figures.end_wait_seconds) == (0.5, 3.0)
        assert figures.elapsed_seconds == 0.5


class TestBuffer:
    """depth, peak_depth, peak_items, peak_bytes, depth_events."""

    def test_peak_items_counts_items_made_not_slots_taken(self) -> None:
        """Depth 8 over a slow source: one item made, not 8 slots, at the first item."""
        gates = [threading.Event() for _ in range(5)]

        def gated() -> Iterator[int]:
            for index, gate in enumerate(gates):
                assert gate.wait(10), f"item {index} never released"
                yield index

        it = iter(BackgroundLoader(gated(), depth=8))
        engine = engine_of(it)
        gates[0].set()
        assert next(it) == 0
        assert it.stats.peak_items == 1  # 8 slots were taken (reserved) for this one
        for index in (1, 2, 3):
            gates[index].set()
            wait_for(lambda index=index: engine.snapshot().ready == index, f"item {index}")
        assert it.stats.peak_items == 3  # made and not yet taken: items 1, 2 and 3
        assert [next(it) for _ in range(3)] == [1, 2, 3]
        gates[4].set()
        assert list(it) == [4]
        assert it.stats.peak_items == 3

    def test_depth_peak_depth_and_no_events_for_a_fixed_depth(self) -> None:
        """A fixed depth is the depth and its peak; it records no event."""
        loader = BackgroundLoader(range(10), depth=3)
        assert list(loader) == list(range(10))
        figures = loader.stats
        assert (figures.depth, figures.peak_depth, figures.depth_events) == (3, 3, [])
        assert (figures.fetch_threads, figures.peak_fetch_threads) == (1, 1)  # its one thread
        assert (figures.fetch_seconds, figures.thread_events) == ([], [])

    def test_peak_bytes_and_items_of_a_full_buffer(self) -> None:
        """Four 1 KiB tensors posted and not taken: 4 items, 4096 bytes, at most."""
        items = [torch.zeros(256) for _ in range(6)]
        it = iter(BackgroundLoader(items, depth=4, max_bytes=1 << 20))
        engine = engine_of(it)
        wait_for(lambda: threads_blocked(engine), "the buffer to fill")
        assert it.stats.peak_items == 4 and it.stats.peak_bytes == 4 * 1024
        assert len(list(it)) == 6
        assert it.stats.peak_bytes == 4 * 1024


class Timed(Dataset[torch.Tensor]):
    """Each read moves the clock by 0.5 s."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        self.clock.advance(0.5)
        return torch.tensor(index)


class TestParallelFetch:
    """fetch_threads and its peak, fetch_seconds, fetch_reads, collate_seconds, peak_samples."""

    def test_one_fetch_thread_scripted(self, clock: FakeClock) -> None:
        """8 reads of 0.5 s and 2 collates of 0.25 s, by one thread, 4 samples a batch."""

        def collate(samples: list[torch.Tensor]) -> torch.Tensor:
            clock.advance(0.25)
            return torch.stack(samples)

        data = DataLoader(Timed(clock), batch_size=4, collate_fn=collate)
        loader = BackgroundLoader(data, depth=2, fetch_threads=1)
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        figures = loader.stats
        assert (figures.fetch_threads, figures.peak_fetch_threads) == (1, 1)
        assert figures.fetch_seconds == [8 * 0.5] and figures.fetch_reads == [8]
        assert figures.collate_seconds == 2 * 0.25
        assert figures.source_seconds == 8 * 0.5 + 2 * 0.25
        assert figures.peak_samples == 4
        assert not figures.parallel_fetch_available  # it reads in parallel already

    def test_a_thread_adds_its_reads_every_account_every(self) -> None:
        """One thread reading a batch of 2 * ACCOUNT_EVERY samples adds its reads to the
        stats in steps of ACCOUNT_EVERY, not only when the batch is done: read k sees the
        reads before it rounded down to a step."""
        every = producers.ACCOUNT_EVERY
        seen: list[list[int]] = []

        class Peeking(Dataset[torch.Tensor]):
            def __len__(self) -> int:
                return 2 * every

            def __getitem__(self, index: int) -> torch.Tensor:
                seen.append(list(running.stats.fetch_reads))
                return torch.tensor(index)

        loader = BackgroundLoader(DataLoader(Peeking(), batch_size=2 * every), fetch_threads=1)
        running = iter(loader)  # its stats are its epoch's from the start (the loader's may not be)
        assert len(list(running)) == 1
        assert seen == [[k // every * every] for k in range(2 * every)]
        assert running.stats.fetch_reads == [2 * every]

    def test_an_unbatched_loaders_items_are_one_sample_each(self) -> None:
        """``batch_size=None``: each item read is one sample; one thread at depth 1 has one
        on the board at a time."""
        loader = BackgroundLoader(DataLoader(range(4), batch_size=None), depth=1, fetch_threads=1)
        assert list(loader) == [0, 1, 2, 3]
        assert loader.stats.peak_samples == 1 and loader.stats.fetch_reads == [4]

    @pytest.mark.parametrize(("threads", "summed"), [("auto", 12 * 0.25), (2, 0.0)])
    def test_read_cpu_reaches_the_thread_policy(
        self, monkeypatch: pytest.MonkeyPatch, threads: int | str, summed: float
    ) -> None:
        """With fetch_threads="auto" the engine sums each read's CPU (the thread's clock
        before and after the read), which its thread policy weighs: 0.25 s for each of 12.
        With a fixed count no policy weighs it, and no clock is read (a system call)."""
        cpu: dict[int, float] = {}

        class ThreadClock:
            """``time.thread_time`` moved by the reads; the rest of ``time`` as it is."""

            def thread_time(self) -> float:
                return cpu.get(threading.get_ident(), 0.0)

            def __getattr__(self, name: str) -> Any:
                return getattr(time, name)

        class Burning(Dataset[int]):
            def __len__(self) -> int:
                return 12

            def __getitem__(self, index: int) -> int:
                thread = threading.get_ident()
                cpu[thread] = cpu.get(thread, 0.0) + 0.25
                return index

        monkeypatch.setattr(shared, "time", ThreadClock())
        loader = BackgroundLoader(DataLoader(Burning(), batch_size=4), fetch_threads=threads)
        iterator = iter(loader)
        engine = engine_of(iterator)
        assert [batch.tolist() for batch in iterator] == [
            [0, 1, 2, 3],
            [4, 5, 6, 7],
            [8, 9, 10, 11],
        ]
        snapshot = engine.snapshot()
        assert (snapshot.reads, snapshot.cpu_seconds) == (12, summed)


class TestCpuClocks:
    """loading_cpu_seconds, loading_core_wait_seconds, loop_cpu_seconds, loop_core_wait_seconds."""

    def scripted_clocks(self, loop: threading.Thread) -> Callable[[], tuple[float, float]]:
        """Each read gives a thread 0.25 s more on a core and 0.125 s more waiting (the loop:
        1.0 and 0.5)."""
        reads: dict[int, int] = {}

        def clocks() -> tuple[float, float]:
            thread = threading.get_ident()
            reads[thread] = reads.get(thread, 0) + 1
            scale = 4.0 if thread == loop.ident else 1.0
            return 0.25 * scale * reads[thread], 0.125 * scale * reads[thread]

        return clocks

    def epoch(
        self, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, load: float, step: float
    ) -> LoaderStats:
        """Three items and the end, each made in ``load`` s, the loop stepping ``step`` s."""
        loop = threading.current_thread()
        monkeypatch.setattr(cpu_clock, "thread_clocks", self.scripted_clocks(loop))
        script = Script([load] * 4, clock)
        loader = BackgroundLoader(script, depth=1)
        run(script, loader, [step] * 3, clock)
        return loader.stats

    def test_read_when_a_thread_posts_and_at_hand_overs(
        self, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Three items and the end, posted one by one: four reads of the loading thread.

        The loop's clocks start at its first item and are read at its other two.
        """
        figures = self.epoch(clock, monkeypatch, load=1.0, step=0.5)
        assert (figures.loading_cpu_seconds, figures.loading_core_wait_seconds) == (1.0, 0.5)
        assert (figures.loop_cpu_seconds, figures.loop_core_wait_seconds) == (2.0, 1.0)

    def test_reads_are_spaced(self, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
        """Hand-overs closer than cpu_clock.READ_EVERY apart do not read the clocks again."""
        figures = self.epoch(clock, monkeypatch, load=0.001, step=0.001)
        assert figures.loading_cpu_seconds == 0.25  # its first post only
        assert figures.loop_cpu_seconds == 0.0  # the clocks started at the first item
