"""Faults: killed, failing or persistent DataLoader workers never hang, leak or lose batches.

Every test here has a hard timeout; "promptly" means within a few seconds,
never a speed claim.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from typing import Any

import pytest
from torch.utils.data import DataLoader
from torch.utils.data._utils import signal_handling

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._shared.epoch import release_source

from .processes import live_child_pids, settle, wait_until
from .sources import SlowDataset, drain


class Recording(DataLoader[Any]):
    """A DataLoader that keeps each iterator it makes (``iterators``), to reach its workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.iterators: list[Any] = []

    def __iter__(self) -> Any:
        self.iterators.append(super().__iter__())
        return self.iterators[-1]


class TestDataLoaderWorkers:
    """Multi-process DataLoader faults: killed workers, worker errors, persistent workers."""

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    # torch's SIGCHLD handler raises wherever the main thread is, here between open() and
    # the `with` of a file a wrapper reads (/proc/thread-self/schedstat, for the loop's
    # clock) at times: Python then closes the file as it drops it, with a ResourceWarning.
    @pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <_io.FileIO name='/proc/thread-self/schedstat'"
        ":pytest.PytestUnraisableExceptionWarning"
    )
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
    def test_release_after_a_worker_died_holding_the_done_events_lock(self) -> None:
        """A worker killed while it held the done event's lock cannot hang the release."""
        # What a prefetch thread does after a worker's death: release the source off the main
        # thread, where torch's SIGCHLD handler cannot break a hang. This test holds the lock
        # itself, as a worker killed inside done_event.is_set() would hold it for good.
        source: Any = iter(DataLoader(SlowDataset(100), batch_size=2, num_workers=2))
        next(source)
        workers = list(source._workers)
        lock = source._workers_done_event._cond._lock
        assert lock.acquire(timeout=5.0)
        try:
            os.kill(workers[0].pid, signal.SIGKILL)
            with pytest.raises(RuntimeError, match="killed by signal"):
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline:
                    time.sleep(0.01)  # torch's SIGCHLD handler raises here
            releaser = threading.Thread(target=release_source, args=(source, True), daemon=True)
            releaser.start()
            releaser.join(timeout=20.0)
            assert not releaser.is_alive(), "the release hung on the dead worker's lock"
            assert not any(worker.is_alive() for worker in workers)
        finally:
            lock.release()  # without the fix: lets the hung release finish
        del source
        threads, children = settle(10.0)
        assert threads == [] and children == []

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("wrapper", ["background", "device"])
    def test_a_worker_dead_holding_the_results_lock_ends_the_epoch(self, wrapper: str) -> None:
        """The lost worker's error ends the epoch: nothing reads ahead into batches never sent."""
        # A worker killed while it sent a batch holds the results queue's write lock for good;
        # the test holds it itself. DataLoader reports the death once and, asked again, waits
        # for the survivor, who can never send. SIGCHLD is blocked so that DataLoader's own
        # check (every 5 s) reports the death where the wrapper draws, not torch's handler.
        data = Recording(SlowDataset(10_000, delay=0.002), batch_size=2, num_workers=2)
        iterators = data.iterators
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        lock: Any = None
        try:
            loader: Any = (
                BackgroundLoader(data, depth=4)
                if wrapper == "background"
                else CudaPrefetcher(data, device="cpu", depth=4)
            )
            iterator = iter(loader)
            assert [int(x) for _ in range(3) for x in next(iterator)] == list(range(6))
            lock = iterators[0]._worker_result_queue._wlock
            assert lock.acquire(timeout=5.0)
            # The mask holds only for this thread's own signals: when another thread takes
            # SIGCHLD, torch's handler raises in this thread wherever it is, and drain()
            # counts that as one of the errors. A worker killed inside its read of the done
            # event (rare) holds that lock for good and the draws, which read it to report
            # the death, wait for good: the test then fails at its timeout, which drain()
            # hands back, instead of hanging.
            os.kill(iterators[0]._workers[0].pid, signal.SIGKILL)
            errors = []  # DataLoader's error, after the EOFError or ConnectionError of a
            while len(errors) < 3:  # batch in transfer when the worker died, if one was
                _items, raised = drain(iterator)
                if raised is None:
                    break  # the epoch ended with the error
                if not isinstance(raised, Exception):
                    raise raised  # pytest-timeout's, a KeyboardInterrupt: not the loader's
                errors.append(raised)
            assert raised is None and 1 <= len(errors) <= 2, errors
            assert all(isinstance(e, (RuntimeError, EOFError, ConnectionError)) for e in errors)
            assert not isinstance(errors[-1], RuntimeError) or "worker" in str(errors[-1])
            del iterator, errors, raised
            threads, children = settle(15.0)
            assert threads == [] and children == []
        finally:
            if lock is not None:
                lock.release()  # without the fix: lets the thread stuck in DataLoader go
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

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
        assert raised.__traceback__ is not None  # the error and its frames were held meanwhile
        threads, children = settle(10.0)
        assert threads == [] and children == []

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    def test_persistent_workers_break_then_new_epoch_without_holding_the_iterator(self) -> None:
        """With persistent_workers, `break` then a new epoch gives a full, exact epoch."""
        # Regression test for a core bug this suite found: BackgroundLoader kept
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


class TestInterruptedWorkerStart:
    """Ctrl-C while DataLoader starts its workers leaves nothing that stops the next epoch."""

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("stacked", [False, True])
    def test_interrupt_after_torch_records_the_pids(self, stacked: bool) -> None:
        """An interrupt between torch's pid record and its flag: the record goes, the loop restarts.

        torch records the new iterator's worker pids under its ``id()``, then sets the
        flag its shutdown reads; a KeyboardInterrupt in between (here raised where
        ``_set_SIGCHLD_handler`` runs) used to leave the record, and the next iterator
        at the same address failed with ValueError ("called only once"): found by
        ``make stress-ft`` in the Ctrl-C test.
        """
        recorded: list[int] = []
        record = signal_handling._set_worker_pids

        def spy(key: int, pids: tuple[int, ...]) -> None:
            recorded.append(key)
            record(key, pids)

        def interrupted() -> None:
            raise KeyboardInterrupt

        unraisable: list[Any] = []
        data = DataLoader(list(range(8)), batch_size=2, num_workers=2)
        background = BackgroundLoader(data, depth=2)
        loader = CudaPrefetcher(background, device="cpu") if stacked else background
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "unraisablehook", unraisable.append)
            patch.setattr(signal_handling, "_set_worker_pids", spy)
            patch.setattr(signal_handling, "_set_SIGCHLD_handler", interrupted)
            with pytest.raises(KeyboardInterrupt):
                next(iter(loader))
            gc.collect()
        # torch's own: the half-built iterator's __del__ reads a field __init__ never set.
        assert all("_workers_status" in str(u.exc_value) for u in unraisable), unraisable
        assert len(recorded) == 1
        # No record is left under the dead iterator's id: recording it again works.
        signal_handling._set_worker_pids(recorded[0], (os.getpid(),))
        signal_handling._remove_worker_pids(recorded[0])
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        threads, children = settle(15.0)
        assert threads == [] and children == []
