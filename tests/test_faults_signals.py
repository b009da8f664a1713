"""Ctrl-C at any moment and interpreter exit stop cleanly, leaving no thread or worker.

Every test here has a hard timeout; "promptly" means within a few seconds,
never a speed claim.
"""

from __future__ import annotations

import functools
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prefetch import BackgroundLoader

from .liveness import engine_of, take
from .processes import child_pids, live_child_pids, session_members, wait_until
from .subprocesses import LineReader, kill_session, start_script

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
    loader = CudaPrefetcher(
        BackgroundLoader(DataLoader(DS(), batch_size=4), depth=2), device="cpu", depth=2
    )
else:
    raise SystemExit("unknown kind")

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)

def train_forever():
    # torch, not prefetch: an interrupt inside optimizer.step()'s finally block can skip
    # its set_grad_enabled(prev), leaving autograd off on this thread; a user's next loop
    # would fail in backward() as this one would.
    torch.set_grad_enabled(True)
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
    # Started threads only. CPython 3.11: a KeyboardInterrupt inside Thread.start(), after
    # it lists the thread in threading._limbo and before the OS thread exists, leaves a
    # Thread that never runs (ident None) listed for ever; it is reported, not counted.
    threads = [t for t in threading.enumerate() if t.name.startswith("prefetch-")]
    for t in threads:
        if t.ident is None:
            print("never-started", t.name, flush=True)
    return [t for t in threads if t.ident is not None]

print("ready", flush=True)
known = 0  # no interrupt, wherever it lands (thread start-up too), may leave a thread
QUEUES_PY = os.path.join("multiprocessing", "queues.py")

def give_back_queue_locks(tb):
    # CPython and torch, not prefetch (3.11 as 3.13t): a KeyboardInterrupt raised in
    # threading.Condition.__enter__ just after it took its lock, in a multiprocessing
    # queue's put() (DataLoader's iter() puts indices on this thread), leaves that lock
    # held: the with-block that would release it never started. The half-built
    # iterator's __del__, run when the traceback goes, puts on the same queue and waits
    # for ever. The queue's feeder thread holds the lock only for moments: still held a
    # second later, it was left behind. Give it back, as the with-block would have.
    given = 0
    for frame, _ in traceback.walk_tb(tb):
        if frame.f_code.co_name == "put" and frame.f_code.co_filename.endswith(QUEUES_PY):
            lock = frame.f_locals["self"]._notempty._lock
            if lock.locked():
                time.sleep(1)
                if lock.locked():
                    lock.release()
                    given += 1
    return given

for round in range(ROUNDS):
    queue_locks = 0
    try:
        train_forever()
    except KeyboardInterrupt as error:
        print("interrupted", round, flush=True)  # the driver stops re-sending SIGINT
        frames = traceback.extract_tb(error.__traceback__)
        where = " > ".join(
            f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}" for f in frames[-4:]
        )
        queue_locks = give_back_queue_locks(error.__traceback__)
        del error, frames
    # outside the handler the traceback no longer holds the loop's iterator
    # CPython, not prefetch: a KeyboardInterrupt inside os.fork()'s at-fork hooks (the
    # DataLoader starting its workers) is printed as "Exception ignored in _releaseLock"
    # and leaves logging's module lock held by this thread. It is an RLock, so this
    # thread never notices, but any other thread's logging.getLogger() then blocks
    # forever: the producer thread does when torch.profiler lazily imports a module that
    # makes a logger. Give the lock back, as the interrupted hook would have.
    repaired = queue_locks
    while logging._lock._is_owned():
        logging._lock.release()
        repaired += 1
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
    print("caught", round, len(prefetch_threads()), known, repaired, flush=True)
train_forever()
"""


SIGINT_ATTEMPTS = 6
"""SIGINTs sent, 5 s apart, until one is not lost: the dl2 loop forks workers so often
that three in a row can land in os.fork()'s at-fork hooks, which drop them."""


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
        # Diagnostics of a test that already failed: the dump goes to the stderr pipe that
        # communicate() reads only after the kill, so there is no line to wait for here.
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
    repeats = repaired = 0
    known = leaked = "0"
    try:
        assert reader.wait_for("ready", timeout=90), f"{kind}: script did not start"
        for round_index in range(rounds):
            time.sleep(rng.uniform(0.0, 0.3))  # a random moment of the loop: the point of the test
            interrupted = None
            for _attempt in range(SIGINT_ATTEMPTS):
                proc.send_signal(signal.SIGINT)
                interrupted = reader.wait_for("interrupted", timeout=5)
                if interrupted is not None:
                    break
                # Python drops a KeyboardInterrupt raised inside an at-fork hook or a
                # __del__ ('Exception ignored in ...'), e.g. while DataLoader forks its
                # workers; a user presses Ctrl-C again. Only then: a SIGINT sent while
                # the script checks for leaks would interrupt the check itself.
                repeats += 1
            assert interrupted is not None, (
                f"{kind}: no KeyboardInterrupt after {SIGINT_ATTEMPTS} SIGINTs"
            )
            # The leak check waits up to 3 s for the interrupted epoch's thread; a loaded
            # machine may take longer to report it.
            line = reader.wait_for("caught", timeout=30)
            assert line is not None, f"{kind}: interrupted, but no report within 30 s"
            _, got_round, leaked, known, locks = line.split()
            repaired += int(locks)
            # No interrupt may leave a thread behind, wherever it landed.
            assert int(got_round) == round_index and int(leaked) <= int(known), (
                f"{kind}: {line} {''.join(reader.other[-6:])}"
            )
        time.sleep(rng.uniform(0.0, 0.3))  # as above: a random moment, not a wait for a state
        started = time.monotonic()
        exited = False
        for _attempt in range(SIGINT_ATTEMPTS):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=5)
                exited = True
                break
            except subprocess.TimeoutExpired:
                repeats += 1  # swallowed by an at-fork hook or a __del__, as above
        seconds = time.monotonic() - started
        assert exited, f"{kind}: still running {seconds:.1f} s after {SIGINT_ATTEMPTS} SIGINTs"
        # The script has ended. Its stdout/stderr reach EOF once every process that
        # inherited them has ended too: a SIGINT inside DataLoader's own worker start-up
        # (iter(loader), before prefetch has the iterator) leaves forked workers that
        # exit when they see their parent gone, within ~5 s. Same bound as the
        # no-process-left check below.
        rc, err, _ = finish(proc, timeout=10)
    except AssertionError as failure:
        # Whether the script was still running says which failure this is: a dead one
        # (a return code) lost every later SIGINT; a live one dumps its threads' stacks.
        state = "running" if proc.poll() is None else f"exited with {proc.returncode}"
        raise AssertionError(
            f"{failure}\n{kind} ({state}) stderr:\n{dump_and_kill(proc)}"
        ) from None
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
            proc.communicate(timeout=10)
    assert rc != 0, f"{kind}: rc {rc}"
    assert "KeyboardInterrupt" in err, f"{kind}: {err[-3000:]}"
    assert_session_empty(proc.pid, timeout=10)
    return (
        f"{kind}: {rounds + 1} SIGINTs, {repeats} re-sent, {repaired} lock(s) left held "
        f"by an interrupted at-fork hook or queue put, {leaked} threads leaked, "
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


def free_for_a_thread(lock: Any) -> bool:
    """Whether another thread can take ``lock`` (an RLock this thread held would not say)."""
    taken: list[bool] = []

    def take_the_lock() -> None:
        taken.append(lock.acquire(timeout=5))
        if taken[-1]:
            lock.release()

    taker = threading.Thread(target=take_the_lock)
    taker.start()
    taker.join(10)
    return taken == [True]


class TestInterruptInsideTheWait:
    """Ctrl-C landing inside ``Condition.wait``, after it let the lock go, is still Ctrl-C."""

    @pytest.mark.timeout(30)
    def test_the_loop_sees_the_interrupt_and_the_lock_is_free(self) -> None:
        """The wait's lock release, then the interrupt: KeyboardInterrupt reaches the loop,
        the lock is free for the threads, and the epoch closes and leaves no thread."""
        release = threading.Event()

        def held_back() -> Iterator[int]:
            yield 0
            release.wait(10)
            yield 1

        iterator = iter(BackgroundLoader(held_back(), depth=2))
        try:
            assert take(iterator, 5.0) == 0
            shared = engine_of(iterator).shared
            data = shared.data
            let_go = data._release_save

            def let_go_then_interrupt() -> Any:
                let_go()  # the lock is released: now the signal handler raises
                raise KeyboardInterrupt

            data._release_save = let_go_then_interrupt
            with pytest.raises(KeyboardInterrupt):
                next(iterator)
            data._release_save = let_go
            assert free_for_a_thread(shared.lock), "the interrupted wait kept the lock"
            assert not data._waiters, "the interrupted wait left its waiter behind"
        finally:
            release.set()
            iterator.close()

    @pytest.mark.timeout(30)
    def test_a_second_interrupt_while_it_takes_the_lock_back(self) -> None:
        """A second Ctrl-C lands while the interrupted wait takes the lock back: it tries
        again, the first interrupt reaches the loop, and the lock is free afterwards."""
        release = threading.Event()

        def held_back() -> Iterator[int]:
            yield 0
            release.wait(10)
            yield 1

        class SecondInterrupt:
            """The engine's lock, whose first ``acquire()`` is interrupted (a second Ctrl-C)."""

            def __init__(self, lock: Any) -> None:
                self.lock, self.tries = lock, 0

            def acquire(self, *args: Any, **kwargs: Any) -> bool:
                self.tries += 1
                if self.tries == 1:
                    raise KeyboardInterrupt
                return bool(self.lock.acquire(*args, **kwargs))

            def __enter__(self) -> Any:
                return self.lock.__enter__()

            def __exit__(self, *exc_info: object) -> Any:
                return self.lock.__exit__(*exc_info)

        iterator = iter(BackgroundLoader(held_back(), depth=2))
        try:
            assert take(iterator, 5.0) == 0
            shared = engine_of(iterator).shared
            data, lock = shared.data, shared.lock
            let_go = data._release_save
            first = KeyboardInterrupt()

            def let_go_then_interrupt() -> Any:
                let_go()
                raise first

            data._release_save = let_go_then_interrupt
            shared.lock = SecondInterrupt(lock)
            try:
                with pytest.raises(KeyboardInterrupt) as raised:
                    next(iterator)
                tries = shared.lock.tries
            finally:
                data._release_save, shared.lock = let_go, lock
            assert raised.value is first
            assert tries == 2
            assert free_for_a_thread(lock), "the interrupted wait kept the lock"
            assert not data._waiters, "the interrupted wait left its waiter behind"
        finally:
            release.set()
            iterator.close()


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
