"""Stopping from the loop and interrupts during start-up or refills lose and leak nothing.

Every test here has a hard timeout; "promptly" means within a few seconds,
never a speed claim.
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._threads.shared import Shared, hidden_interrupt

from . import fake_device
from .processes import prefetch_threads, wait_until
from .sources import SlowDataset


class TestStopping:
    """close(), garbage collection and stuck sources never hang."""

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("stacked", [False, True])
    def test_close_returns_while_the_producer_is_stuck_in_the_source(self, stacked: bool) -> None:
        """close() returns within 2 s although the producer is blocked inside next(source)."""
        release = threading.Event()
        entered = threading.Event()

        def stuck() -> Iterator[int]:
            yield 0
            yield 1  # the stacked prefetcher fetches one batch ahead on the consumer thread
            entered.set()
            release.wait()
            yield 2

        background = BackgroundLoader(stuck(), depth=2)
        loader = CudaPrefetcher(background, device="cpu") if stacked else background
        iterator = iter(loader)
        assert next(iterator) == 0
        assert entered.wait(5)
        started = time.monotonic()
        iterator.close()
        assert time.monotonic() - started < 2.0
        with pytest.raises(StopIteration):
            next(iterator)
        release.set()
        assert wait_until(lambda: not prefetch_threads(), 5.0)

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("depth", [1, 3])
    def test_garbage_collection_stops_a_blocked_producer(self, depth: int) -> None:
        """Dropping an iterator whose producer waits on a full queue ends the thread."""
        iterator = iter(BackgroundLoader(range(10**9), depth=depth))
        next(iterator)
        assert wait_until(lambda: len(prefetch_threads()) == 1, 2.0)
        del iterator
        assert wait_until(lambda: not prefetch_threads(), 3.0)

    @pytest.mark.timeout(30)
    def test_close_from_inside_the_loop(self) -> None:
        """close() called in the loop body ends the loop cleanly after the current item."""
        loader = CudaPrefetcher(BackgroundLoader(range(100), depth=4), device="cpu", depth=2)
        seen = []
        for item in loader:
            seen.append(item)
            if item == 9:
                loader.close()
        assert seen == list(range(10))
        assert wait_until(lambda: not prefetch_threads(), 3.0)


class TestHiddenInterrupt:
    """``hidden_interrupt``: the Ctrl-C behind the stdlib's release error, and nothing else."""

    @staticmethod
    def raised(error: BaseException, context: BaseException | None) -> BaseException:
        """``error`` as raised while handling ``context`` (its ``__context__``)."""
        try:
            try:
                if context is not None:
                    raise context
            finally:
                raise error
        except BaseException as caught:
            return caught

    @pytest.mark.parametrize(
        "message", ["release unlocked lock", "cannot release un-acquired lock"]
    )
    def test_the_interrupt_behind_a_release_error(self, message: str) -> None:
        """Either lock's message, over a KeyboardInterrupt: that interrupt."""
        interrupt = KeyboardInterrupt()
        assert hidden_interrupt(self.raised(RuntimeError(message), interrupt)) is interrupt

    @pytest.mark.parametrize(
        ("error", "context"),
        [
            (RuntimeError("something else"), KeyboardInterrupt()),
            (ValueError("release unlocked lock"), KeyboardInterrupt()),
            (RuntimeError("release unlocked lock"), ValueError()),
            (RuntimeError("release unlocked lock"), None),
        ],
    )
    def test_nothing_else(self, error: BaseException, context: BaseException | None) -> None:
        """Another message, another error type or another context: none."""
        assert hidden_interrupt(self.raised(error, context)) is None


class TestInterruptedStart:
    """A Ctrl-C that lands while the producer thread is being started leaves no thread behind."""

    @pytest.mark.timeout(30)
    def test_start_interrupted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """KeyboardInterrupt inside the producer's Thread.start() propagates; the thread stops."""
        real_start = threading.Thread.start

        def interrupted_start(thread: threading.Thread) -> None:
            real_start(thread)
            if thread.name.startswith("prefetch-"):
                raise KeyboardInterrupt  # as a SIGINT landing in Thread.start()'s wait

        monkeypatch.setattr(threading.Thread, "start", interrupted_start)
        loader = BackgroundLoader(range(10**6), depth=2)
        try:
            iterator = iter(loader)  # lazy: the thread starts at the first next()
            with pytest.raises(KeyboardInterrupt):
                next(iterator)
            monkeypatch.undo()
            assert wait_until(lambda: not prefetch_threads(), 3.0), "producer thread leaked"
        finally:
            for thread in prefetch_threads():  # unblock the leaked thread for the next tests
                engine = getattr(getattr(thread, "_target", None), "__self__", None)
                if engine is not None:
                    engine.stop()

    @pytest.mark.timeout(30)
    def test_start_interrupted_before_the_thread_runs(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """KeyboardInterrupt before Thread.start() started the thread: it propagates, and the
        next epoch of the same loader is whole (the thread that never ran gave back its
        place)."""
        real_start = threading.Thread.start

        def interrupted_start(thread: threading.Thread) -> None:
            if thread.name.startswith("prefetch-"):
                raise KeyboardInterrupt
            real_start(thread)

        loader = BackgroundLoader(range(5), depth=2)
        monkeypatch.setattr(threading.Thread, "start", interrupted_start)
        iterator = iter(loader)
        with pytest.raises(KeyboardInterrupt):
            next(iterator)
        monkeypatch.undo()
        shared = iterator._engine.shared  # the interrupted epoch's: no thread counted in it
        assert (shared.running, shared.staying, shared.tickets.in_flight) == (0, 0, 0)
        assert list(loader) == list(range(5))
        assert wait_until(lambda: not prefetch_threads(), 3.0), prefetch_threads()

    @pytest.mark.timeout(30)
    def test_an_interrupt_the_stdlib_loses_in_event_wait(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Ctrl-C inside Thread.start()'s ``Event.wait``, in the instant after
        ``Condition.wait`` let the lock go: the stdlib raises ``RuntimeError: release
        unlocked lock`` in its place. The loop sees the KeyboardInterrupt, the started
        thread stops, and the next epoch is whole."""
        real_start, real_wait = threading.Thread.start, threading.Event.wait
        starting = threading.local()

        def watched_start(thread: threading.Thread) -> None:
            starting.prefetch = thread.name.startswith("prefetch-")
            try:
                real_start(thread)
            finally:
                starting.prefetch = False

        def interrupted_wait(event: threading.Event, timeout: float | None = None) -> bool:
            if not getattr(starting, "prefetch", False):
                return real_wait(event, timeout)
            with event._cond:  # type: ignore[attr-defined]  # as Event.wait does
                event._cond._lock.release()  # type: ignore[attr-defined]  # Condition.wait's
                raise KeyboardInterrupt  # the signal handler's, before Condition.wait's try

        loader = BackgroundLoader(range(5), depth=2)
        monkeypatch.setattr(threading.Thread, "start", watched_start)
        monkeypatch.setattr(threading.Event, "wait", interrupted_wait)
        with pytest.raises(KeyboardInterrupt):
            next(iter(loader))
        monkeypatch.undo()
        assert wait_until(lambda: not prefetch_threads(), 3.0), prefetch_threads()
        assert list(loader) == list(range(5))


class TestInterruptKept:
    """Ctrl-C while the loop waits in next(), the error kept: the epoch's threads stop."""

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("stack", ["background", "fetch_threads", "cuda_prefetcher"])
    def test_a_kept_interrupt_keeps_no_thread_reading(
        self, stack: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A SIGINT lands while ``for batch in loader`` waits; while the except block holds
        the KeyboardInterrupt, nothing holds the iterator: its threads stop and reading ends
        (the guide's promise for an error that leaves the loop).

        An event says the loop waits (a spy on the engine's one wait for data): walking
        the main thread's frames from another thread while it runs crashed 3.13t.
        """
        waiting = threading.Event()
        wait_for_data = Shared.wait_for_data

        def spy(shared: Shared, seconds: float) -> None:
            waiting.set()
            wait_for_data(shared, seconds)

        monkeypatch.setattr(Shared, "wait_for_data", spy)
        data = SlowDataset(10_000, delay=0.02)  # the storage's latency
        loader: Any = BackgroundLoader(
            DataLoader(data, batch_size=8), fetch_threads=2 if stack == "fetch_threads" else None
        )
        if stack == "cuda_prefetcher":
            loader = CudaPrefetcher(loader, device="cpu")
        main = threading.main_thread().ident
        assert main == threading.get_ident()

        def interrupt_in_the_wait() -> None:
            if waiting.wait(10.0):  # the loop is in the wait, or about to enter it
                signal.pthread_kill(main, signal.SIGINT)

        interrupter = threading.Thread(target=interrupt_in_the_wait)
        kept: BaseException | None = None
        interrupter.start()
        try:
            for _batch in loader:
                pass
        except KeyboardInterrupt as error:
            kept = error  # held, as an except block that logs or saves a checkpoint holds it
        interrupter.join(10)
        assert isinstance(kept, KeyboardInterrupt)
        stopped = wait_until(lambda: not prefetch_threads(), 3.0, collect=False)
        assert stopped, f"threads still reading while the error is kept: {prefetch_threads()}"
        reads = data.reads
        assert wait_until(lambda: data.reads > reads, 0.2, collect=False) is False
        del kept


class TestInterruptWhileRefilling:
    """Ctrl-C while CudaPrefetcher waits for its source: neither postponed nor lost."""

    @staticmethod
    def gated_loader() -> tuple[threading.Event, BackgroundLoader[int]]:
        gate = threading.Event()

        def gated() -> Iterator[int]:
            yield 0
            gate.wait(20)
            yield 1

        return gate, BackgroundLoader(gated(), depth=1)

    @staticmethod
    def interrupt_soon() -> threading.Timer:
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        return timer

    @pytest.mark.timeout(30)
    def test_cpu_path_hands_over_without_waiting_for_the_next(self) -> None:
        """On the CPU a batch is handed over at once; Ctrl-C comes out of the next() that waits."""
        gate, background = self.gated_loader()
        iterator = iter(CudaPrefetcher(background, device="cpu"))
        try:
            assert next(iterator) == 0  # does not wait for batch 1
            timer = self.interrupt_soon()
            with pytest.raises(KeyboardInterrupt):
                next(iterator)
            timer.cancel()
            gate.set()
            assert list(iterator) == [1]  # nothing lost
        finally:
            gate.set()
            iterator.close()

    @pytest.mark.timeout(30)
    def test_device_path_raises_from_the_refill_and_loses_nothing(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With streams, Ctrl-C during the refill comes out of that next(); batch 0 then follows."""
        fake_device.install(monkeypatch)
        gate, background = self.gated_loader()
        iterator = iter(CudaPrefetcher(background))
        try:
            timer = self.interrupt_soon()
            with pytest.raises(KeyboardInterrupt):
                next(iterator)  # refills batch 1 before handing over batch 0: blocks
            timer.cancel()
            gate.set()
            assert list(iterator) == [0, 1]
        finally:
            gate.set()
            iterator.close()

    @pytest.mark.timeout(30)
    def test_source_keyboard_interrupt_keeps_its_place(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A KeyboardInterrupt raised by the source arrives after the batches before it."""
        fake_device.install(monkeypatch)
        error = KeyboardInterrupt("from the source")

        def source() -> Iterator[int]:
            yield 0
            yield 1
            raise error

        got: list[int] = []
        with pytest.raises(KeyboardInterrupt) as caught:
            for batch in CudaPrefetcher(BackgroundLoader(source()), device="cpu", depth=2):
                got.append(batch)
        assert caught.value is error and got == [0, 1]
