"""The engine wakes a blocked thread on every event that frees it, without polling.

The producer re-checks every ``POLL_SECONDS`` as a safety net; here that net
is taken away (30 s), so a lost wake-up leaves the producer blocked and the
bounded waits of :mod:`tests.liveness` fail within seconds, naming it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from prefetch import BackgroundLoader
from prefetch._shared.epoch import EpochRecord
from prefetch._threads import iterator as iterator_module
from prefetch._threads import producers
from prefetch._threads import shared as shared_module
from prefetch._threads.consumer_side import ConsumerSide
from prefetch._threads.engine import Engine
from prefetch._threads.messages import Run
from prefetch._threads.shared import Shared
from prefetch._threads.tasks import IteratorTasks, ProducerSpec
from prefetch._threads.thread_side import ThreadSide
from prefetch._threads.tickets import Held

from .liveness import (
    consume,
    describe,
    engine_of,
    take,
    threads_blocked,
    wait_for,
    wait_went_ahead,
)

LIVENESS = 2.0


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blocked producer re-checks only after 30 s: every wake-up must be delivered."""
    monkeypatch.setattr(shared_module, "POLL_SECONDS", 30.0)  # both sides' waits


@pytest.mark.usefixtures("no_poll")
class TestWakeUps:
    """Each event that frees a slot wakes the blocked producer at once."""

    @pytest.mark.parametrize("depth", [1, 3])
    def test_release_slot_wakes_the_producer(self, depth: int) -> None:
        """Every consumed item wakes a producer blocked on a full buffer."""
        loader = BackgroundLoader(range(12), depth=depth)
        assert consume(loader, step=0.002, timeout=LIVENESS) == list(range(12))

    def test_byte_budget_release_wakes_the_producer(self) -> None:
        """A producer blocked on the byte budget is woken when an item is consumed."""
        items = [torch.zeros(256) for _ in range(8)]  # 1 KiB each, 2 KiB budget
        loader = BackgroundLoader(items, depth=8, max_bytes=2048)
        got = consume(loader, step=0.002, timeout=LIVENESS)
        assert all(a is b for a, b in zip(got, items, strict=True))

    def test_deeper_depth_wakes_the_producer(self) -> None:
        """Raising the depth wakes a producer blocked on the old one."""
        iterator = iter(BackgroundLoader(range(10), depth=1))
        try:
            engine = engine_of(iterator)
            wait_for(
                lambda: engine.snapshot().waiting_threads > 0, lambda: describe(engine), LIVENESS
            )
            engine.set_depth(3)
            wait_for(lambda: engine.snapshot().ready == 3, lambda: describe(engine), LIVENESS)
            assert [take(iterator, LIVENESS) for _ in range(3)] == [0, 1, 2]
        finally:
            iterator.close()

    @pytest.mark.parametrize("depth", [1, 2, 4])
    def test_units_to_read_wake_a_thread_waiting_for_tickets(self, depth: int) -> None:
        """Two fetch threads, every read waiting for a second one under way: a batch drawn
        while the other thread waits for a ticket wakes it to read the batch's other half."""
        barrier = threading.Barrier(2, timeout=LIVENESS)

        class Pairs(torch.utils.data.Dataset[int]):
            def __len__(self) -> int:
                return 16

            def __getitem__(self, index: int) -> int:
                barrier.wait()  # alone, it fails the test: BrokenBarrierError
                return index

        data = DataLoader(Pairs(), batch_size=2)
        iterator = iter(BackgroundLoader(data, depth=depth, fetch_threads=2))
        try:
            engine = engine_of(iterator)
            got = []
            for _ in range(8):  # each batch taken once both threads wait for a ticket
                wait_went_ahead(engine, LIVENESS)
                got.append(take(iterator, LIVENESS).tolist())
            assert got == [[2 * i, 2 * i + 1] for i in range(8)]
        finally:
            iterator.close()

    def test_stop_wakes_the_producer(self) -> None:
        """close() ends a producer blocked on a full buffer, well before its next poll."""
        iterator = iter(BackgroundLoader(range(10), depth=1))
        engine = engine_of(iterator)
        (thread,) = engine.threads
        wait_for(lambda: threads_blocked(engine), lambda: describe(engine), LIVENESS)
        iterator.close()
        wait_for(lambda: not thread.is_alive(), lambda: describe(engine), LIVENESS)


class TestNoSpareWakeUps:
    """A side is woken only while it waits, and once until it waits again."""

    @pytest.mark.parametrize("depth", [1, 2, 8])
    def test_each_wake_finds_a_waiter(self, monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
        """Over an epoch of a source without a length (no end gate), every wake-up of the
        threads finds one waiting for tickets and not woken yet (still in the condition's
        waiters: a second wake before it ran again would find none), and every wake-up of
        the loop finds it waiting for a run and not woken yet (under the GIL a thread wakes
        it as it takes tickets, and its post then does not)."""
        seen: list[tuple[str, bool]] = []
        wake_threads, wake_consumer = Shared.wake_threads, Shared.wake_consumer

        def threads(self: Shared) -> None:
            # a waiter in the condition itself: one woken earlier has left it (woken or not)
            waiter = bool(self.space._waiters)  # type: ignore[attr-defined]  # CPython's list
            seen.append(("threads", self.waiting > 0 and not self.woken and waiter))
            wake_threads(self)

        def consumer(self: Shared) -> None:
            waiter = bool(self.data._waiters)  # type: ignore[attr-defined]  # as above
            seen.append(("consumer", self.consumer_waiting and not self.consumer_woken and waiter))
            wake_consumer(self)

        monkeypatch.setattr(Shared, "wake_threads", threads)
        monkeypatch.setattr(Shared, "wake_consumer", consumer)

        def source() -> Iterator[int]:
            for index in range(3_000):
                if index % 500 == 0:
                    time.sleep(0.001)  # the loop waits now and then
                yield index

        assert list(BackgroundLoader(source(), depth=depth)) == list(range(3_000))
        assert {side for side, _ in seen} == {"threads", "consumer"}
        assert [side for side, waiting in seen if not waiting] == []


def idle_engine(depth: int = 4, threads: int = 1, *, reads: bool = False) -> Engine:
    """An engine over ``range(100)`` whose threads never start: its sides called on this one.

    ``reads``: its tasks say their draws are read unit by unit (as ``fetch_threads``').
    """
    tasks = IteratorTasks(iter(range(100)), owned=True)
    if reads:
        tasks.board = object()  # type: ignore[assignment]  # only looked at for None here
    record = EpochRecord(None)
    return Engine(tasks, ProducerSpec(), record, depth=depth, threads=threads, max_bytes=None)


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[Any]:
    """Record the arguments (after ``self``) of each call of ``owner.name``, and make it."""
    calls: list[Any] = []
    method = getattr(owner, name)

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return method(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


class TestEarlyWakeUps:
    """Under the GIL the loop is woken as a thread over an iterator takes tickets for it."""

    @pytest.mark.parametrize(
        ("gil", "threads", "reads", "early"),
        [
            (True, 1, False, True),
            (False, 1, False, False),  # no GIL: the loop runs beside the thread
            (True, 1, True, False),  # draws whose units are read: slow, several threads
            (True, 2, False, False),
        ],
    )
    def test_early_wakes_for_one_thread_over_an_iterator_under_the_gil(
        self, monkeypatch: pytest.MonkeyPatch, gil: bool, threads: int, reads: bool, early: bool
    ) -> None:
        """The sides wake each other early only for one thread over an iterator, GIL on."""
        monkeypatch.setattr(shared_module, "gil_enabled", lambda: gil)
        assert idle_engine(threads=threads, reads=reads).shared.early_wakes is early

    @pytest.mark.parametrize(
        ("early", "waiting", "woken", "depth", "wakes"),
        [
            (True, True, False, 16, True),
            (False, True, False, 16, False),  # see the test above
            (True, False, False, 16, False),  # the loop does not wait
            (True, True, True, 16, False),  # woken already, not run since
            (True, True, False, 17, False),  # 17 draws before it blocks: too soon
        ],
    )
    def test_taking_tickets_wakes_a_waiting_loop(
        self,
        monkeypatch: pytest.MonkeyPatch,
        early: bool,
        waiting: bool,
        woken: bool,
        depth: int,
        wakes: bool,
    ) -> None:
        """Taking at most ``EARLY_WAKE`` (16) tickets wakes a loop that waits and was not
        woken since it last waited, where the sides wake each other early; the tickets are
        taken either way."""
        engine = idle_engine(depth)
        shared = engine.shared
        shared.consumer_waiting, shared.consumer_woken = waiting, woken
        shared.early_wakes = early
        calls = count_calls(monkeypatch, Shared, "wake_consumer")
        held = Held()
        assert engine.side.take_tickets(held, 100) == depth
        assert (held.tickets, len(calls)) == (depth, int(wakes))
        assert shared.consumer_woken is (woken or wakes)

    @pytest.mark.parametrize(("woken", "wakes"), [(False, True), (True, False)])
    def test_a_post_wakes_a_loop_not_woken_yet(
        self, monkeypatch: pytest.MonkeyPatch, woken: bool, wakes: bool
    ) -> None:
        """A post wakes the waiting loop only if nothing woke it since it last waited."""
        engine = idle_engine()
        shared = engine.shared
        held = Held()
        engine.side.take_tickets(held, 2)
        shared.consumer_waiting, shared.consumer_woken = True, woken
        calls = count_calls(monkeypatch, Shared, "wake_consumer")
        engine.side.post(0, Run([0, 1]), held, seconds=0.0)
        assert len(calls) == int(wakes)
        assert [run.items for run in shared.handover.take()] == [[0, 1]]


class TestTicketsGivenBack:
    """When the loop gives tickets back: after a wait at once, then at return points."""

    @pytest.mark.parametrize(
        ("after", "early_wake", "depth", "taken", "first_return"),
        [
            (7, 16, 16, 1, 1),  # return points every 4: the first item's ticket comes back
            (39, 8, 64, 16, 16),  # 39 ready > 8: at the next return point, the 16th item
        ],
    )
    def test_the_first_item_after_a_wait_for_a_few_gives_its_ticket_back(
        self,
        monkeypatch: pytest.MonkeyPatch,
        after: int,
        early_wake: int,
        depth: int,
        taken: int,
        first_return: int,
    ) -> None:
        """The loop waits for ``after`` items, posted as one run (runs of a quarter of the
        depth without the GIL): with at most ``EARLY_WAKE`` of them ready, handing the first
        one over gives its ticket back at once (waking the thread early); with more, waking
        it then would be too soon, and the tickets come back at the next return point."""
        monkeypatch.setattr(producers, "POST_AFTER", 1e3)  # no post for a slow draw
        monkeypatch.setattr(iterator_module, "EARLY_WAKE", early_wake)
        gate = threading.Event()

        def source() -> Iterator[int]:
            yield 0
            gate.wait(10.0)
            yield from range(1, after + 1)

        calls = count_calls(monkeypatch, ConsumerSide, "exchange")
        iterator = iter(BackgroundLoader(source(), depth=depth))
        engine = engine_of(iterator)

        def open_gate() -> None:
            wait_for(lambda: engine.shared.consumer_waiting, "the loop to wait", LIVENESS)
            gate.set()

        opener = threading.Thread(target=open_gate, name="test-opener")
        try:
            assert next(iterator) == 0
            before = len(calls)
            opener.start()
            assert [next(iterator) for _ in range(taken)] == list(range(1, taken + 1))
            waited, returned = ((0, 0), {"wait": True}), ((first_return, 0), {"wait": False})
            assert calls[before:] == [waited, returned]
        finally:
            gate.set()
            opener.join(LIVENESS)
            iterator.close()

    @pytest.mark.parametrize(("idle", "returned"), [(False, [4, 4, 4, 4]), (True, [16])])
    def test_return_points_skipped_while_the_thread_woken_has_not_run(
        self, monkeypatch: pytest.MonkeyPatch, idle: bool, returned: list[int]
    ) -> None:
        """Taking a run of 16 at depth 16, the loop gives tickets back every 4 items, or,
        while the thread it woke has not run since, once the run is used up."""
        monkeypatch.setattr(ConsumerSide, "threads_woken_idle", lambda self: idle)
        iterator = iter(BackgroundLoader(range(16), depth=16))
        engine = engine_of(iterator)
        wait_went_ahead(engine, LIVENESS)
        calls = count_calls(monkeypatch, ConsumerSide, "exchange")
        assert [next(iterator) for _ in range(16)] == list(range(16))
        iterator.close()
        assert [args[0] for args, _ in calls if args[0]] == returned

    @pytest.mark.parametrize(
        ("early", "woken", "waiting", "idle"),
        [
            (True, True, 1, True),
            (True, False, 1, False),  # it waits again: tickets wake it
            (True, True, 0, False),  # it runs (draws): tickets let it go on
            (False, True, 1, False),  # no early wake-ups (no GIL, units read, threads)
        ],
    )
    def test_threads_woken_idle(self, early: bool, woken: bool, waiting: int, idle: bool) -> None:
        """A thread counts as woken and idle while, woken, it is still in its wait."""
        engine = idle_engine()
        shared = engine.shared
        shared.early_wakes, shared.woken, shared.waiting = early, woken, waiting
        assert engine.consumer.threads_woken_idle() is idle


class TestPostThenWait:
    """A thread over an iterator waits for its next tickets in the lock's hold that posted."""

    @pytest.mark.parametrize("depth", [1, 2, 8])
    def test_the_lock_is_not_let_go_between_post_and_wait(
        self, monkeypatch: pytest.MonkeyPatch, depth: int
    ) -> None:
        """After its first post, every wait for tickets starts with the lock still held: the
        loop the post woke cannot find the thread between the two (with the GIL it would wait
        for the interpreter while the thread comes back to wait)."""
        held: list[bool] = []
        take_tickets = ThreadSide.take_tickets

        def spy(self: ThreadSide, *args: Any, **kwargs: Any) -> int:
            held.append(self.shared.lock._is_owned())  # type: ignore[attr-defined]
            return take_tickets(self, *args, **kwargs)

        monkeypatch.setattr(ThreadSide, "take_tickets", spy)
        assert list(BackgroundLoader(range(200), depth=depth)) == list(range(200))
        assert len(held) > 2, held
        assert held[0] is False  # the thread's first tickets: nothing posted yet
        assert all(held[1:]), held


@pytest.mark.usefixtures("no_poll")
class TestTheLoopBlocks:
    """A loop waiting for an item blocks until it is posted: it does not poll or spin."""

    def test_a_waiting_next_asks_the_engine_once(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Waiting 0.3 s for an item takes one blocking exchange, not one per instant."""
        gate = threading.Event()

        def source() -> Iterator[int]:
            yield 0
            gate.wait(10.0)
            yield 1

        calls = [0]
        exchange = ConsumerSide.exchange

        def spy(self: ConsumerSide, *args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return exchange(self, *args, **kwargs)

        monkeypatch.setattr(ConsumerSide, "exchange", spy)
        iterator = iter(BackgroundLoader(source(), depth=2))
        opener = threading.Timer(0.3, gate.set)  # the wait's length, not a synchronisation
        try:
            assert next(iterator) == 0
            before = calls[0]
            opener.start()
            assert next(iterator) == 1
            assert calls[0] - before <= 3, calls[0] - before
        finally:
            opener.cancel()
            gate.set()
            iterator.close()


class TestOversizedItem:
    """An item larger than max_bytes flows alone: the byte budget never deadlocks."""

    @pytest.mark.parametrize("depth", ["auto", 2])
    def test_each_oversized_item_flows(self, depth: Any) -> None:
        """Items four times max_bytes are delivered, one outstanding at a time."""
        items = [torch.full((1024,), float(i)) for i in range(6)]
        loader = BackgroundLoader(items, depth, max_bytes=1024)
        got = consume(loader, timeout=LIVENESS)
        assert all(a is b for a, b in zip(got, items, strict=True))
        assert loader.stats.peak_items == 1


class TestDescribe:
    """A stuck producer is described with the numbers that show why it is stuck."""

    def test_names_free_slots_and_bytes(self) -> None:
        """The description gives depth, slots taken and free, bytes and the budget."""
        iterator = iter(BackgroundLoader([torch.zeros(256)] * 4, depth=2, max_bytes=4096))
        try:
            engine = engine_of(iterator)
            wait_for(
                lambda: engine.snapshot().waiting_threads > 0, lambda: describe(engine), LIVENESS
            )
            assert describe(engine) == (
                "1 of 1 thread(s) still blocked on a full buffer with 0 free slots "
                "(2 of 2 taken; 2048 B buffered + largest item 1024 B vs max_bytes 4096)"
            )
        finally:
            iterator.close()


def slow_items(n: int, seconds: float = 0.02) -> Any:
    """``range(n)``, each item taking ``seconds``: the consumer waits for every one."""
    for index in range(n):
        time.sleep(seconds)
        yield index


@pytest.mark.usefixtures("no_poll")
class TestALostWakeUpIsCaught:
    """With one wake-up removed, the checks above fail within seconds (so they can fail)."""

    def test_without_waking_the_consumer(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A consumer waiting for an item is never woken: the bounded take() fails fast."""
        monkeypatch.setattr(Shared, "wake_consumer", lambda self: None)
        started = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match=r"after 2\.0 s"):
            consume(BackgroundLoader(slow_items(5), depth=2), timeout=LIVENESS)
        assert time.monotonic() - started < 3 * LIVENESS

    def test_without_waking_the_producer(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A producer blocked on a full buffer is never woken: the bounded take() fails fast."""
        monkeypatch.setattr(Shared, "wake_threads", lambda self: None)
        started = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match="blocked on a full buffer"):
            consume(BackgroundLoader(range(12), depth=2), step=0.002, timeout=LIVENESS)
        assert time.monotonic() - started < 3 * LIVENESS
