"""Faults: failing sources, killed workers, Ctrl-C and interpreter exit (issue 6).

Every test here has a hard timeout; "promptly" means within a few seconds,
never a speed claim.
"""

from __future__ import annotations

import _thread
import functools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch.compat import BackgroundGenerator
from prefetch.thread_worker import request_stop

from . import fake_device
from .helpers_faults import (
    CustomBaseError,
    FailingIterable,
    KwOnlyError,
    LineReader,
    ListSource,
    NoSuperError,
    child_pids,
    kill_session,
    live_child_pids,
    make_errors,
    prefetch_threads,
    session_members,
    settle,
    start_script,
    wait_until,
)

Wrap = Callable[[Any], Any]

WRAPPERS: dict[str, Wrap] = {
    "background-d1": lambda src: BackgroundLoader(src, depth=1),
    "background-d4": lambda src: BackgroundLoader(src, depth=4),
    "cuda-cpu-d2": lambda src: CudaPrefetcher(src, device="cpu", depth=2),
    "stacked": lambda src: CudaPrefetcher(BackgroundLoader(src, depth=3), device=None, depth=2),
}

ERROR_KINDS = sorted(make_errors())


class SlowDataset(Dataset[torch.Tensor]):
    """A map-style dataset whose items take ``delay`` seconds; negative indices raise."""

    def __init__(self, size: int, delay: float = 0.0) -> None:
        self.size = size
        self.delay = delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index < 0:
            raise ValueError(f"poisoned index {index}")
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor(index)


def drain(iterator: Iterator[Any]) -> tuple[list[Any], BaseException | None]:
    """Consume ``iterator``; return the items and the exception that ended it (or None)."""
    items: list[Any] = []
    try:
        for item in iterator:
            items.append(item)
    except BaseException as error:
        return items, error
    return items, None


class TestSourceRaisesAfterItems:
    """An error raised by the source after N items arrives intact, in its place."""

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    @pytest.mark.parametrize("kind", ERROR_KINDS)
    @pytest.mark.parametrize("after", [0, 1, 5])
    def test_same_object_after_every_earlier_item(
        self, wrapper: str, kind: str, after: int
    ) -> None:
        """The exact exception object arrives after the N items before it; then the epoch ends."""
        error = make_errors()[kind]
        loader = WRAPPERS[wrapper](FailingIterable(list(range(10)), fail_at=after, error=error))
        iterator = iter(loader)
        items, raised = drain(iterator)
        assert items == list(range(after))
        assert raised is error
        with pytest.raises(StopIteration):
            next(iterator)
        assert wait_until(lambda: not prefetch_threads(), 3.0)

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("kind", ERROR_KINDS)
    def test_compat_generator_delivers_the_same_object(self, kind: str) -> None:
        """prefetch.compat.BackgroundGenerator hands over the same object after the items."""
        error = make_errors()[kind]
        items, raised = drain(BackgroundGenerator(FailingIterable([0, 1, 2], 2, error), 2))
        assert items == [0, 1]
        assert raised is error

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("kind", ["KwOnlyError", "NoSuperError", "CustomBaseError"])
    def test_single_process_dataloader_passes_the_object(self, kind: str) -> None:
        """Through DataLoader(num_workers=0) the dataset's exception is still the same object."""
        error = make_errors()[kind]

        class Raising(Dataset[int]):
            def __len__(self) -> int:
                return 8

            def __getitem__(self, index: int) -> int:
                if index == 5:
                    raise error
                return index

        loader = CudaPrefetcher(BackgroundLoader(DataLoader(Raising()), depth=2), device="cpu")
        items, raised = drain(iter(loader))
        assert [int(x) for x in items] == [0, 1, 2, 3, 4]
        assert raised is error

    @pytest.mark.timeout(30)
    def test_unusual_constructors_are_not_rebuilt(self) -> None:
        """Exceptions that cannot be rebuilt from args keep type, attributes and identity."""
        for error in (KwOnlyError(code=11), NoSuperError(4, 5)):
            loader = BackgroundLoader(FailingIterable([1, 2], fail_at=1, error=error))
            items, raised = drain(iter(loader))
            assert items == [1]
            assert raised is error
        assert isinstance(raised, NoSuperError) and raised.total == 9

    @pytest.mark.timeout(30)
    def test_loader_is_reusable_after_an_error(self) -> None:
        """After an epoch ends with an error, the next epoch runs in full."""
        source = FailingIterable(list(range(6)), fail_at=3, error=KeyboardInterrupt())
        loader = CudaPrefetcher(BackgroundLoader(source, depth=2), device="cpu")
        items, raised = drain(iter(loader))
        assert items == [0, 1, 2] and isinstance(raised, KeyboardInterrupt)
        source.fail_at = None
        assert list(loader) == list(range(6))

    @pytest.mark.timeout(30)
    def test_consumer_side_base_exception_stops_the_thread(self) -> None:
        """A KeyboardInterrupt raised in the loop body stops the producer (no leak)."""
        loader = BackgroundLoader(range(10**9), depth=3)
        with pytest.raises(KeyboardInterrupt):
            for item in loader:
                if item == 5:
                    raise KeyboardInterrupt
        assert wait_until(lambda: not prefetch_threads(), 3.0)


class TestSourceRaisesInProtocol:
    """Errors from the source's own methods (iter, len, set_epoch, state_dict) pass through."""

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    @pytest.mark.parametrize("kind", ["ValueError", "KeyboardInterrupt", "CustomBaseError"])
    def test_iter_raises(self, wrapper: str, kind: str) -> None:
        """An error in the source's __iter__ is raised by iter() itself; no thread starts."""
        error = make_errors()[kind]

        class BadIter:
            def __iter__(self) -> Iterator[int]:
                raise error

        loader = WRAPPERS[wrapper](BadIter())
        with pytest.raises(BaseException) as info:
            iter(loader)
        assert info.value is error
        assert not prefetch_threads()

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    def test_len_raises(self, wrapper: str) -> None:
        """An error (other than TypeError) in the source's __len__ reaches len() as is."""
        error = KwOnlyError(code=3)

        class BadLen(FailingIterable):
            def __len__(self) -> int:
                raise error

        loader = WRAPPERS[wrapper](BadLen([1, 2, 3]))
        with pytest.raises(KwOnlyError) as info:
            len(loader)
        assert info.value is error
        assert [x for x in loader] == [1, 2, 3]  # not list(): it asks len() for a hint

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    def test_set_epoch_raises(self, wrapper: str) -> None:
        """An error in the source's set_epoch reaches the caller of set_epoch as is."""
        error = CustomBaseError("set_epoch")

        class BadEpoch(FailingIterable):
            def set_epoch(self, epoch: int) -> None:
                raise error

        loader = WRAPPERS[wrapper](BadEpoch([1, 2]))
        with pytest.raises(CustomBaseError) as info:
            loader.set_epoch(1)
        assert info.value is error
        assert list(loader) == [1, 2]

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("fail_pos", [2, 4, 7])
    def test_state_dict_raises_in_the_producer(self, fail_pos: int) -> None:
        """An error from state_dict() read after an item arrives in that item's place."""
        error = NoSuperError(0, 0)

        class BadState(ListSource):
            def state_dict(self) -> dict[str, int]:
                if self.pos == fail_pos:
                    raise error
                return super().state_dict()

        source = BadState(10)
        loader = BackgroundLoader(source, depth=3)
        items, raised = drain(iter(loader))
        # state_dict() after item fail_pos - 1 raised: that item is replaced by the error.
        assert [index for _, index, _ in items] == list(range(fail_pos - 1))
        assert raised is error
        assert loader.state_dict() == {"pos": fail_pos - 1, "epoch": 0}

    @pytest.mark.timeout(30)
    def test_state_dict_raises_at_epoch_start(self) -> None:
        """An error from the start-of-epoch state_dict() is raised by iter(); no thread starts."""
        error = SystemExit(9)

        class BadState(ListSource):
            def state_dict(self) -> dict[str, int]:
                raise error

        loader = BackgroundLoader(BadState(5))
        with pytest.raises(SystemExit) as info:
            iter(loader)
        assert info.value is error
        assert not prefetch_threads()

    @pytest.mark.timeout(30)
    def test_load_state_dict_raises(self) -> None:
        """An error from the source's load_state_dict() reaches the caller; the loader works on."""
        error = KwOnlyError(code=1)

        class BadLoad(ListSource):
            def load_state_dict(self, state: dict[str, int]) -> None:
                raise error

        source = BadLoad(4)
        loader = BackgroundLoader(source, depth=2)
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(KwOnlyError) as info:
            loader.load_state_dict({"pos": 0, "epoch": 0})
        assert info.value is error
        assert not prefetch_threads()
        # The source keeps its own position (the producer ran ahead of the consumer).
        start = source.pos
        assert [index for _, index, _ in loader] == list(range(start, 4))


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
            with pytest.raises(KeyboardInterrupt):
                iter(loader)
            monkeypatch.undo()
            assert wait_until(lambda: not prefetch_threads(), 3.0), "producer thread leaked"
        finally:
            for thread in prefetch_threads():  # unblock the leaked thread for the next tests
                channel = getattr(thread, "_args", (None,))[0]
                if channel is not None:
                    request_stop(channel)


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
            for batch in CudaPrefetcher(BackgroundLoader(source()), depth=2):
                got.append(batch)
        assert caught.value is error and got == [0, 1]


class TestDataLoaderWorkers:
    """Multi-process DataLoader faults: killed workers, worker errors, persistent workers."""

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("stacked", [False, True])
    def test_sigkill_of_a_worker_raises_promptly(self, stacked: bool) -> None:
        """A SIGKILLed worker gives the loop DataLoader's error within 5 s; nothing leaks."""
        # DataLoader's own worker-status check runs every 5 s, so cleanup may take that long.
        # DataLoader reports the death as RuntimeError('DataLoader worker ... killed'), or, when
        # the kill lands while a batch's shared-memory handle is being passed, as the EOFError /
        # ConnectionError of that transfer. Either is DataLoader's own error, delivered as is.
        data = DataLoader(SlowDataset(10_000, delay=0.002), batch_size=2, num_workers=2)
        background = BackgroundLoader(data, depth=2)
        loader = CudaPrefetcher(background, device="cpu") if stacked else background
        killed_at: float | None = None
        with pytest.raises((RuntimeError, EOFError, ConnectionError)) as info:
            for step, _batch in enumerate(loader):
                if step == 5:
                    workers = live_child_pids()
                    assert len(workers) == 2
                    os.kill(workers[0], signal.SIGKILL)
                    killed_at = time.monotonic()
                assert killed_at is None or time.monotonic() - killed_at < 5.0
        assert killed_at is not None
        assert time.monotonic() - killed_at < 5.0
        if isinstance(info.value, RuntimeError):
            assert "worker" in str(info.value).lower(), info.value
        del info
        threads, children = settle(15.0)
        assert threads == [] and children == []

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("poison_at", [0, 7])
    def test_worker_error_shuts_workers_down_before_delivery(self, poison_at: int) -> None:
        """A dataset error in a worker arrives after the batches before it; the workers are gone."""
        indices = list(range(16))
        indices.insert(poison_at, -1)
        data = DataLoader(SlowDataset(16), batch_size=1, sampler=indices, num_workers=2)
        loader = BackgroundLoader(data, depth=3)
        items, raised = drain(iter(loader))
        assert [int(x) for x in items] == list(range(poison_at))
        assert isinstance(raised, ValueError) and "poisoned" in str(raised)
        # Rule 7: the source was shut down before the error was handed over.
        assert wait_until(lambda: not live_child_pids(), 2.0), live_child_pids()
        # Holding the error (and its traceback) must not break the next epoch.
        indices.remove(-1)
        assert [int(x) for x in loader] == list(range(16))
        assert raised is not None
        threads, children = settle(10.0)
        assert threads == [] and children == []

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    def test_persistent_workers_break_then_new_epoch_without_holding_the_iterator(self) -> None:
        """With persistent_workers, `break` then a new epoch gives a full, exact epoch."""
        # Regression test for a core bug found by this suite (issue 6): BackgroundLoader kept
        # only a weakref to its iterator, so after `break` dropped it, the next iter() did not
        # join the old producer, which was still inside the persistent DataLoader iterator
        # that iter() resets ('AssertionError: Invalid iterator state', lost batches).
        data = DataLoader(
            SlowDataset(64, delay=0.002), batch_size=2, num_workers=2, persistent_workers=True
        )
        loader = BackgroundLoader(data, depth=2)
        failures = []
        try:
            for _ in range(12):
                for step, _batch in enumerate(loader):
                    if step == 4:
                        break  # the iterator is dropped; its producer is inside next(source)
                try:
                    got = [int(x) for batch in loader for x in batch]
                except AssertionError as error:  # DataLoader: 'Invalid iterator state'
                    failures.append(repr(error))
                    continue
                if got != list(range(64)):
                    failures.append(f"epoch delivered {got}")
        finally:
            loader.close()
            del loader, data
            settle(15.0)
        assert failures == []


# --------------------------------------------------------------------------- subprocesses

TRAIN_SCRIPT = """
import gc, logging, os, sys, threading, time, traceback
import torch
from torch.utils.data import DataLoader, Dataset
from prefetch import BackgroundLoader, CudaPrefetcher

import faulthandler, signal
faulthandler.register(signal.SIGUSR1, all_threads=True)
torch.set_num_threads(1)
KIND = __KIND__
ROUNDS = __ROUNDS__

class DS(Dataset):
    def __len__(self): return 48
    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.full((4,), float(i))

if KIND == "list":
    loader = BackgroundLoader([torch.full((4, 4), float(i)) for i in range(12)], depth=2)
elif KIND == "dl0":
    loader = BackgroundLoader(DataLoader(DS(), batch_size=4), depth=3)
elif KIND == "dl2":
    loader = BackgroundLoader(DataLoader(DS(), batch_size=4, num_workers=2), depth=2)
elif KIND == "stacked":
    loader = CudaPrefetcher(BackgroundLoader(DataLoader(DS(), batch_size=4), depth=2), depth=2)
else:
    raise SystemExit("unknown kind")

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)

def train_forever():
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        expected = 0
        for x in loader:
            first = float(x.reshape(-1)[0])
            assert first == float(expected * (4 if KIND != "list" else 1)), (first, expected)
            expected += 1
            loss = model(x.reshape(-1, 4)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert expected == 12, expected
        epoch += 1

def prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("prefetch-")]

print("ready", flush=True)
known = 0  # no interrupt, wherever it lands (thread start-up too), may leave a thread
for round in range(ROUNDS):
    try:
        train_forever()
    except KeyboardInterrupt as error:
        frames = traceback.extract_tb(error.__traceback__)
        where = " > ".join(
            f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}" for f in frames[-4:]
        )
        del error, frames
    # outside the handler the traceback no longer holds the loop's iterator
    if not logging._lock.acquire(timeout=0.5):
        # CPython: a KeyboardInterrupt inside os.fork()'s at-fork hook (DataLoader starting
        # workers) leaves logging's module lock held forever; nothing to do with prefetch.
        print("caught-forklock", round, flush=True)
        os._exit(0)
    logging._lock.release()
    gc.collect()
    deadline = time.monotonic() + 3
    while len(prefetch_threads()) > known and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()
    if len(prefetch_threads()) > known:
        stacks = sys._current_frames()
        for t in prefetch_threads():
            stack = traceback.extract_stack(stacks[t.ident])[-4:]
            print("leak", t.name, " > ".join(f"{f.name}:{f.lineno}" for f in stack), flush=True)
        print("leak interrupted at", where, flush=True)
    print("caught", round, len(prefetch_threads()), known, flush=True)
train_forever()
"""


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, float]:
    """Wait up to ``timeout`` s for ``proc``; return (rc, stderr, seconds). Kill on timeout."""
    started = time.monotonic()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        _, err = proc.communicate(timeout=10)
        raise AssertionError(
            f"subprocess still running after {timeout} s:\n{err[-3000:]}"
        ) from None
    return proc.returncode, err, time.monotonic() - started


def assert_session_empty(session_id: int, timeout: float) -> None:
    """Assert that every process of ``session_id`` (worker processes too) has ended."""
    if not wait_until(lambda: not session_members(session_id), timeout):
        left = session_members(session_id)
        kill_session(session_id)
        raise AssertionError(f"processes left behind: {left}")


def dump_and_kill(proc: subprocess.Popen[str]) -> str:
    """Make a running script dump its threads' stacks (SIGUSR1), kill it, return its stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        kill_session(proc.pid)
    try:
        _, err = proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        return "(no stderr)"
    return err[-4000:]


def drive_sigint(kind: str, rounds: int) -> str:
    """Run TRAIN_SCRIPT for ``kind``, interrupt it ``rounds + 1`` times; return a summary.

    Raises AssertionError (naming ``kind``) if an interrupt is not seen within the
    bounds, an interrupted epoch's thread survives, or the process does not end.
    """
    rng = random.Random(f"sigint-{kind}")
    proc = start_script(
        TRAIN_SCRIPT.replace("__KIND__", repr(kind)).replace("__ROUNDS__", str(rounds))
    )
    reader = LineReader(proc)
    repeats = 0
    known = leaked = "0"
    try:
        assert reader.wait_for("ready", timeout=90), f"{kind}: script did not start"
        for round_index in range(rounds):
            time.sleep(rng.uniform(0.0, 0.3))
            line = None
            for _attempt in range(3):
                proc.send_signal(signal.SIGINT)
                line = reader.wait_for("caught", timeout=5)
                if line is not None:
                    break
                # Python drops a KeyboardInterrupt raised inside an at-fork hook or a
                # __del__ ('Exception ignored in ...'), e.g. while DataLoader forks its
                # workers; a user presses Ctrl-C again.
                repeats += 1
            assert line is not None, f"{kind}: no KeyboardInterrupt after three SIGINTs"
            if line.startswith("caught-forklock"):
                proc.communicate(timeout=10)
                return f"{kind}: stopped after {round_index} rounds by the CPython at-fork lock"
            _, got_round, leaked, known = line.split()
            # No interrupt may leave a thread behind, wherever it landed.
            assert int(got_round) == round_index and int(leaked) <= int(known), (
                f"{kind}: {line} {''.join(reader.other[-6:])}"
            )
        time.sleep(rng.uniform(0.0, 0.3))
        started = time.monotonic()
        for _attempt in range(3):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                repeats += 1  # swallowed by an at-fork hook or a __del__, as above
        rc, err, _ = finish(proc, timeout=1)
        seconds = time.monotonic() - started
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n{kind} stderr:\n{dump_and_kill(proc)}") from None
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
            proc.communicate(timeout=10)
    assert rc != 0, f"{kind}: rc {rc}"
    assert "KeyboardInterrupt" in err, f"{kind}: {err[-3000:]}"
    assert_session_empty(proc.pid, timeout=10)
    return (
        f"{kind}: {rounds + 1} SIGINTs, {repeats} re-sent, {leaked} threads leaked, "
        f"exit after {seconds:.2f} s"
    )


def run_concurrently(jobs: dict[str, Callable[[], str]], at_once: int | None = None) -> None:
    """Run the ``jobs`` in parallel threads; print their summaries; fail listing every failure.

    ``at_once`` caps how many run together (a 2-core CI machine tearing down many
    torch processes at once can take longer than the bound under test).
    """
    from concurrent.futures import ThreadPoolExecutor

    workers = at_once or len(jobs)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="test-driver") as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
    failures = []
    for name, future in futures.items():
        error = future.exception()
        if error is None:
            print(future.result())
        else:
            failures.append(f"{name}: {error}")
    assert not failures, "\n".join(failures)


class TestCtrlC:
    """SIGINT at random moments of a training loop: KeyboardInterrupt, never a hang."""

    @pytest.mark.slow
    @pytest.mark.timeout(150)
    def test_sigint_at_random_moments(self) -> None:
        """Each SIGINT is a KeyboardInterrupt within 5 s; the last ends the process; no leaks."""
        # Four loops run side by side (a list, DataLoader with 0 and 2 workers, and
        # CudaPrefetcher over BackgroundLoader). Between interrupts each loop restarts,
        # every epoch is exact and the interrupted epoch's thread is gone; no worker
        # process outlives its script.
        rounds = 4
        kinds = ["list", "dl0", "dl2", "stacked"]
        run_concurrently({kind: functools.partial(drive_sigint, kind, rounds) for kind in kinds})


EXIT_SCRIPTS = {
    "blocked-on-full-queue": """
        import itertools
        from prefetch import BackgroundLoader
        it = iter(BackgroundLoader(itertools.count(), depth=2))
        assert next(it) == 0
        print("ready", flush=True)
    """,
    "stuck-in-source": """
        import threading
        from prefetch import BackgroundLoader
        def stuck():
            yield 0
            threading.Event().wait()
            yield 1
        it = iter(BackgroundLoader(stuck(), depth=2))
        assert next(it) == 0
        print("ready", flush=True)
    """,
    "stuck-in-source-closed": """
        import threading, time
        from prefetch import BackgroundLoader, CudaPrefetcher
        def stuck():
            yield 0
            yield 1  # the prefetcher takes one batch ahead before handing over the first
            threading.Event().wait()
            yield 2
        it = iter(CudaPrefetcher(BackgroundLoader(stuck(), depth=2), device="cpu"))
        assert next(it) == 0
        started = time.monotonic()
        it.close()
        assert time.monotonic() - started < 2, "close() hung"
        print("ready", flush=True)
    """,
    "dataloader-workers-mid-epoch": """
        import time
        import torch
        from torch.utils.data import DataLoader
        from prefetch import BackgroundLoader
        class DS(torch.utils.data.Dataset):
            def __len__(self): return 10_000
            def __getitem__(self, i):
                time.sleep(0.001)
                return i
        it = iter(BackgroundLoader(DataLoader(DS(), batch_size=2, num_workers=2), depth=4))
        for _ in range(5):
            next(it)
        print("ready", flush=True)
    """,
    "compat-generator": """
        import itertools
        from prefetch.compat import BackgroundGenerator
        gen = BackgroundGenerator(itertools.count(), max_prefetch=3)
        next(gen)
        print("ready", flush=True)
    """,
    "sigint-while-waiting-on-a-slow-source": """
        import os, signal, time
        from prefetch import BackgroundLoader
        def slow():
            yield 0
            time.sleep(3600)
            yield 1
        it = iter(BackgroundLoader(slow(), depth=1))
        next(it)
        print("ready", flush=True)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), signal.SIGINT))
        next(it)  # blocks in the consumer's wait until SIGINT
    """,
}


def drive_exit(scenario: str) -> str:
    """Run EXIT_SCRIPTS[scenario]; check it ends within 8 s and leaves no process behind."""
    proc = start_script(EXIT_SCRIPTS[scenario])
    reader = LineReader(proc)
    try:
        assert reader.wait_for("ready", timeout=90), f"{scenario}: script did not start"
        rc, err, seconds = finish(proc, timeout=8)
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
            proc.communicate(timeout=10)
    if scenario.startswith("sigint"):
        assert rc != 0 and "KeyboardInterrupt" in err, f"{scenario}: {err[-3000:]}"
    else:
        assert rc == 0, f"{scenario}: {err[-3000:]}"
    assert seconds < 8, f"{scenario}: exit took {seconds:.1f} s"
    assert_session_empty(proc.pid, timeout=10)
    return f"{scenario}: exit {rc} after {seconds:.2f} s"


class TestInterpreterExit:
    """A process with abandoned iterators (stuck or blocked producers) exits promptly."""

    @pytest.mark.slow
    @pytest.mark.timeout(120)
    def test_process_exits(self) -> None:
        """Each scenario's script ends within 8 s after 'ready' and leaves no process behind."""
        run_concurrently(
            {name: functools.partial(drive_exit, name) for name in sorted(EXIT_SCRIPTS)},
            at_once=2,
        )


class TestHelpers:
    """The /proc helpers the leak checks rely on do see processes (no vacuous checks)."""

    @pytest.mark.timeout(30)
    def test_child_and_session_are_seen(self) -> None:
        """A live child shows up in child_pids and its session; once reaped, in neither."""
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
        )
        try:
            assert proc.pid in live_child_pids()
            assert proc.pid in child_pids()
            assert session_members(proc.pid) == [proc.pid]
        finally:
            proc.kill()
            proc.wait(timeout=10)
        assert proc.pid not in live_child_pids()
        assert session_members(proc.pid) == []
