"""Workarounds for torch (``prefetch._torch``): each turns itself off, with one warning.

Each class takes one workaround, makes torch look changed underneath (the
private name it needs gone, or set up elsewhere than the ``__init__`` it reads
it from) and checks that the workaround turns off, warns once across two
uses, and that the code falls back to torch's public behaviour, as the table
in ``prefetch._torch`` says. Parallel fetch, which cannot work without its
names, refuses instead. ``PREFETCH_TORCH_WORKAROUNDS=0`` is read at import:
a child Python checks it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import torch
import torch.utils.data.dataloader as torch_dataloader
from torch.autograd import profiler
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data._utils import signal_handling

import prefetch._torch
from prefetch import BackgroundLoader, TorchWorkaroundWarning
from prefetch._shared.epoch import release_source
from prefetch._shared.profiling import profiling
from prefetch._torch import WORKAROUNDS, intra_op
from prefetch._torch import worker_pids as pid_guard
from prefetch._torch.fetcher import PARALLEL_FETCH
from prefetch._torch.interrupted_start import INTERRUPTED_START, forget_interrupted_start
from prefetch._torch.intra_op import THREAD_INTRA_OP, set_thread_intra_op_threads
from prefetch._torch.profiler import PROFILER_FLAG
from prefetch._torch.sampler_start import SAMPLER_START, start_sampler_here
from prefetch._torch.workaround import Workaround
from prefetch._torch.worker_pids import WORKER_PID_GUARD
from prefetch._torch.workers import DEAD_WORKERS, WORKER_SHUTDOWN, lost_a_worker

from .processes import settle, wait_until
from .subprocesses import ROOT, subprocess_env
from .test_background import TORCH_2_12_PROFILER_WARNING
from .test_fetch_knobs import (
    CountRecorder,
    count_in_a_thread,
    count_of_a_new_thread,
    known_counts,
)


@pytest.fixture(autouse=True)
def fresh_checks() -> Iterator[None]:
    """Every workaround checks torch afresh in each test, and after it (torch restored)."""
    for workaround in WORKAROUNDS:
        workaround.recheck()
    yield
    for workaround in WORKAROUNDS:
        workaround.recheck()


def set_up_elsewhere(patch: pytest.MonkeyPatch, cls: type) -> None:
    """Make ``cls.__init__`` set its fields through a call, as if torch had moved them."""
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)

    patch.setattr(cls, "__init__", __init__)


def warnings_of(uses: Callable[[], Any], times: int = 2) -> tuple[list[Any], list[str]]:
    """Call ``uses`` ``times`` times; return its results and the workaround warnings' texts."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [uses() for _ in range(times)]
    texts = [str(w.message) for w in caught if issubclass(w.category, TorchWorkaroundWarning)]
    return results, texts


def assert_one_warning(texts: list[str], workaround: Workaround) -> None:
    """One warning that names the workaround, the torch version and what is lost."""
    assert len(texts) == 1, texts
    assert f"the {workaround.name} workaround is off" in texts[0]
    assert f"torch {torch.__version__}" in texts[0]
    assert workaround.when_off in texts[0] and "PREFETCH_TORCH_WORKAROUNDS=0" in texts[0]
    assert workaround.problem() is not None and not workaround.active()


class TestEveryWorkaround:
    """With this torch every workaround is on, and the table says what each record says."""

    @pytest.mark.parametrize("workaround", WORKAROUNDS, ids=lambda w: w.name)
    def test_on_with_this_torch(self, workaround: Workaround) -> None:
        """Every private name each needs is there (fails on a torch that changed them)."""
        assert workaround.problem() is None and workaround.active()

    @pytest.mark.parametrize("workaround", WORKAROUNDS, ids=lambda w: w.name)
    def test_the_table_matches_the_record(self, workaround: Workaround) -> None:
        """The subpackage's table names each workaround with the versions it was checked on."""
        table = " ".join((prefetch._torch.__doc__ or "").split())
        assert f"{workaround.name} (:mod:" in table
        assert ", ".join(workaround.checked_on) in table


class TestWorkerShutdown:
    """Off: a released multi-process iterator keeps its workers until it is collected."""

    def test_off_keeps_the_workers_until_collected(self, monkeypatch: pytest.MonkeyPatch) -> None:
        set_up_elsewhere(monkeypatch, torch_dataloader._BaseDataLoaderIter)
        source: Any = iter(DataLoader(list(range(4)), batch_size=2, num_workers=1))
        assert next(source).tolist() == [0, 1]
        worker = source._workers[0]
        _, texts = warnings_of(partial(release_source, source, owned=True))
        assert_one_warning(texts, WORKER_SHUTDOWN)
        assert worker.is_alive()  # torch's own: nothing stops them before the iterator goes
        del source
        assert wait_until(lambda: not worker.is_alive(), 10.0)
        assert settle(10.0) == ([], [])

    def test_on_stops_the_workers_at_release(self) -> None:
        source: Any = iter(DataLoader(list(range(4)), batch_size=2, num_workers=1))
        assert next(source).tolist() == [0, 1]
        worker = source._workers[0]
        release_source(source, owned=True)
        assert not worker.is_alive()
        del source
        assert settle(10.0) == ([], [])


class FakeWorkers:
    """A multi-process DataLoader iterator as the dead-workers workaround reads it."""

    def __init__(self, worker: Any) -> None:
        self._workers = [worker]
        self._shutdown = False


class TestDeadWorkers:
    """Off: a killed worker is not seen, so the error that reports it does not end the epoch."""

    @pytest.fixture
    def killed(self) -> Iterator[FakeWorkers]:
        """An iterator whose one worker process was killed."""
        context = multiprocessing.get_context("fork")
        worker = context.Process(target=time.sleep, args=(60,), daemon=True)
        worker.start()
        os.kill(worker.pid or 0, signal.SIGKILL)
        worker.join(timeout=10.0)
        yield FakeWorkers(worker)
        worker.close()

    def test_off_does_not_see_the_death(
        self, monkeypatch: pytest.MonkeyPatch, killed: FakeWorkers
    ) -> None:
        set_up_elsewhere(monkeypatch, torch_dataloader._MultiProcessingDataLoaderIter)
        results, texts = warnings_of(lambda: lost_a_worker(killed))
        assert results == [False, False]
        assert_one_warning(texts, DEAD_WORKERS)

    def test_on_sees_the_death(self, killed: FakeWorkers) -> None:
        assert lost_a_worker(killed)


class HalfBuilt:
    """A multi-worker iterator interrupted, as torch's, between its pid record and its flag."""

    def __init__(self) -> None:
        self._workers: list[Any] = []
        self._worker_pids_set = False
        signal_handling._set_worker_pids(id(self), (os.getpid(),))  # type: ignore[attr-defined]
        raise KeyboardInterrupt


def interrupted_start() -> tuple[KeyboardInterrupt, int]:
    """The interrupt out of a half-built iterator's ``__init__``, and that iterator's id."""
    try:
        HalfBuilt()
    except KeyboardInterrupt as error:
        frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
        return error, id(frames[-1].f_locals["self"])
    raise AssertionError("HalfBuilt() did not raise")


class TestInterruptedStart:
    """Off: the pid record of an interrupted start stays behind, as without prefetch."""

    def test_off_leaves_the_record(self, monkeypatch: pytest.MonkeyPatch) -> None:
        set_up_elsewhere(monkeypatch, torch_dataloader._MultiProcessingDataLoaderIter)
        error, key = interrupted_start()
        try:
            results, texts = warnings_of(partial(forget_interrupted_start, error))
            assert results == [0, 0]
            assert_one_warning(texts, INTERRUPTED_START)
            with pytest.raises(ValueError, match="only once"):
                signal_handling._set_worker_pids(key, (os.getpid(),))  # type: ignore[attr-defined]
        finally:
            signal_handling._remove_worker_pids(key)  # type: ignore[attr-defined]
            del error

    def test_on_removes_the_record(self) -> None:
        error, key = interrupted_start()
        assert forget_interrupted_start(error) == 1
        signal_handling._set_worker_pids(key, (os.getpid(),))  # type: ignore[attr-defined]
        signal_handling._remove_worker_pids(key)  # type: ignore[attr-defined]
        del error


class TestWorkerPidGuard:
    """Off: with the GIL off too, torch's worker-pid functions are left as they are."""

    def test_off_installs_nothing(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delattr(signal_handling, "_error_if_any_worker_fails")
        monkeypatch.setattr(pid_guard, "gil_enabled", lambda: False)  # as on 3.13t, GIL off
        monkeypatch.setattr(pid_guard, "_installed", False)
        before = {name: getattr(signal_handling, name, None) for name in pid_guard.GUARDED}
        results, texts = warnings_of(pid_guard.guard_worker_pids)
        assert results == [False, False]
        assert_one_warning(texts, WORKER_PID_GUARD)
        assert {name: getattr(signal_handling, name, None) for name in pid_guard.GUARDED} == before

    def test_with_the_gil_on_it_is_not_even_checked(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With the GIL on nothing is changed, so a changed torch costs no warning."""
        monkeypatch.delattr(signal_handling, "_error_if_any_worker_fails")
        monkeypatch.setattr(pid_guard, "gil_enabled", lambda: True)
        monkeypatch.setattr(pid_guard, "_installed", False)
        results, texts = warnings_of(pid_guard.guard_worker_pids)
        assert results == [False, False] and texts == []


def draws_after_start(start: bool) -> float:
    """torch's next global draw after ``iter()`` of a shuffled DataLoader (started or not)."""
    torch.manual_seed(0)
    source = iter(DataLoader(list(range(8)), sampler=RandomSampler(list(range(8)))))
    if start:
        start_sampler_here(source)
    return float(torch.rand(()))


class TestSamplerStart:
    """Off: the sampler draws its seed at the first next(), not on the caller's thread."""

    def test_off_leaves_the_sampler_unstarted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        set_up_elsewhere(monkeypatch, torch_dataloader._BaseDataLoaderIter)
        results, texts = warnings_of(lambda: draws_after_start(True))
        assert_one_warning(texts, SAMPLER_START)
        assert results == [draws_after_start(False)] * 2  # no seed drawn by the start

    def test_on_draws_the_seed_at_iter(self) -> None:
        assert draws_after_start(True) != draws_after_start(False)


def slow(count: int) -> Iterator[int]:
    """``count`` items, 10 ms each: the loop waits for each."""
    for item in range(count):
        time.sleep(0.01)
        yield item


class TestProfilerFlag:
    """Off: nothing is marked, so a profile shows no prefetch ranges."""

    @pytest.mark.filterwarnings(TORCH_2_12_PROFILER_WARNING)  # torch 2.12's, see test_background
    def test_off_marks_nothing(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as start_profile

        monkeypatch.setattr(profiler, "_is_profiler_enabled", 0)  # not a bool any more
        results, texts = warnings_of(profiling)
        assert results == [False, False]
        assert_one_warning(texts, PROFILER_FLAG)
        with start_profile(activities=[ProfilerActivity.CPU]) as prof:
            assert not profiling()
            assert list(BackgroundLoader(slow(3))) == [0, 1, 2]
        assert not {event.name for event in prof.events()} & {"prefetch.wait", "prefetch.fetch"}


class TestThreadIntraOp:
    """Off (no OpenMP runtime found): fetch threads keep torch's count, num_threads= is torch's."""

    def test_off_falls_back_to_torch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        with known_counts() as before:
            monkeypatch.setattr(intra_op, "_runtime", lambda: None)
            results, texts = warnings_of(
                lambda: count_in_a_thread(partial(set_thread_intra_op_threads, 1))
            )
            assert results == [(False, before), (False, before)]
            assert_one_warning(texts, THREAD_INTRA_OP)
            dataset = CountRecorder(4)
            loader = BackgroundLoader(DataLoader(dataset, batch_size=2), fetch_threads=2)
            assert len(list(loader)) == 2
            assert set(dataset.counts) == {before}  # torch's default, not one
            loader = BackgroundLoader(DataLoader(dataset, batch_size=2), num_threads=before + 1)
            assert len(list(loader)) == 2
            assert count_of_a_new_thread() == before + 1  # torch.set_num_threads: process-wide

    def test_on_sets_the_thread_alone(self) -> None:
        with known_counts() as before:
            assert count_in_a_thread(partial(set_thread_intra_op_threads, before + 1)) == (
                True,
                before + 1,
            )
            assert torch.get_num_threads() == before and count_of_a_new_thread() == before


class TestParallelFetch:
    """Required by fetch_threads: with its names gone, fetch_threads refuses; nothing warns."""

    def test_fetch_threads_refuses(self, monkeypatch: pytest.MonkeyPatch) -> None:
        set_up_elsewhere(monkeypatch, torch_dataloader._SingleProcessDataLoaderIter)
        data = DataLoader(list(range(8)), batch_size=2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                with pytest.raises(RuntimeError) as info:
                    BackgroundLoader(data, fetch_threads=2)
                message = str(info.value)
                assert message.startswith("BackgroundLoader(fetch_threads=...) needs the internals")
                assert f"torch {torch.__version__} changed them" in message
                assert "_dataset_fetcher" in message and "Leave fetch_threads unset" in message
        assert [w for w in caught if issubclass(w.category, TorchWorkaroundWarning)] == []
        assert not PARALLEL_FETCH.active()

    def test_one_thread_still_works_and_is_not_advised(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        set_up_elsewhere(monkeypatch, torch_dataloader._SingleProcessDataLoaderIter)
        loader = BackgroundLoader(DataLoader(list(range(8)), batch_size=2))
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert loader.stats.parallel_fetch_available is False

    def test_on_it_is_advised(self) -> None:
        loader = BackgroundLoader(DataLoader(list(range(8)), batch_size=2))
        assert len(list(loader)) == 4
        assert loader.stats.parallel_fetch_available is True


SWITCH = """
    import warnings
    warnings.simplefilter("error")  # no warning at all
    import torch
    from torch.utils.data import DataLoader, RandomSampler
    from prefetch import BackgroundLoader
    from prefetch._torch import WORKAROUNDS
    from prefetch._torch.sampler_start import start_sampler_here
    from prefetch._torch.workers import shut_down_workers

    def shuffled():
        torch.manual_seed(0)
        return iter(DataLoader(list(range(8)), sampler=RandomSampler(list(range(8)))))

    print(sorted({w.active() for w in WORKAROUNDS}))
    data = DataLoader(list(range(8)), batch_size=2)
    try:
        print([batch.tolist() for batch in BackgroundLoader(data, fetch_threads=2)])
    except RuntimeError as error:
        print(error)
    print([batch.tolist() for batch in BackgroundLoader(data)])
    start_sampler_here(shuffled())
    after_start = float(torch.rand(()))
    shuffled()
    print(after_start == float(torch.rand(())))  # True: the start drew nothing
    print(shut_down_workers(iter(DataLoader(list(range(4)), num_workers=1))))
"""


class TestSwitch:
    """PREFETCH_TORCH_WORKAROUNDS=0 turns every workaround off, without a warning."""

    def run(self, value: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SWITCH)],
            capture_output=True,
            text=True,
            env=subprocess_env(PREFETCH_TORCH_WORKAROUNDS=value),
            cwd=str(ROOT),
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    @pytest.mark.slow
    def test_zero_turns_all_off(self) -> None:
        """Every workaround off, fetch_threads refuses, the rest falls back; no warning."""
        off, refusal, batches, unstarted, shut = self.run("0")
        assert off == "[False]"
        assert refusal.startswith("BackgroundLoader(fetch_threads=...) needs the internals")
        assert "PREFETCH_TORCH_WORKAROUNDS=0 turned it off" in refusal
        assert batches == "[[0, 1], [2, 3], [4, 5], [6, 7]]"
        assert unstarted == "True" and shut == "False"

    @pytest.mark.slow
    def test_one_leaves_them_on(self) -> None:
        """The control: any other value leaves every workaround on."""
        on, fetched, _, unstarted, shut = self.run("1")
        assert on == "[True]" and fetched == "[[0, 1], [2, 3], [4, 5], [6, 7]]"
        assert unstarted == "False" and shut == "True"
