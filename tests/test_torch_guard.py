"""torch's worker-pid map under one lock when the GIL is off (``prefetch._torch.worker_pids``).

Free-threaded, with the GIL off, a ``BackgroundLoader`` over a multi-worker
DataLoader used to die of SIGSEGV: torch's C++ map of worker pids has no lock,
and a prefetch thread and the main thread (its ``SIGCHLD`` handler, the next
epoch) used it at once. The guard locks the three functions that use it; with
the GIL on it changes nothing. Crashes are looked for in child processes, so
that one fails its test instead of ending the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils import signal_handling

from prefetch import BackgroundLoader
from prefetch._torch import worker_pids as torch_guard
from prefetch._torch.worker_pids import GUARDED, guard_worker_pids

from .gil import FREE_THREADED, gil_enabled
from .liveness import wait_for
from .subprocesses import ROOT, subprocess_env

GIL_OFF = FREE_THREADED and not gil_enabled()


class ReachedLock:
    """The guard's lock, setting ``reached`` when a call comes to take it (a spy).

    An event, not the calling thread's frames: walking a running thread's frames from
    another thread crashed 3.13t.
    """

    def __init__(self, lock: Any, reached: threading.Event) -> None:
        self.lock, self.reached = lock, reached

    def __enter__(self) -> Any:
        self.reached.set()
        return self.lock.__enter__()

    def __exit__(self, *exc_info: object) -> Any:
        return self.lock.__exit__(*exc_info)


needs_gil_off = pytest.mark.skipif(not GIL_OFF, reason="needs the GIL off (make test-ft)")
needs_gil_on = pytest.mark.skipif(GIL_OFF, reason="the GIL is off: the guard is installed")


def run_script(code: str, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python (the repository importable); return what it did."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=subprocess_env(**env),
        cwd=str(ROOT),
        timeout=timeout,
        check=False,
    )


def torchs_own() -> dict[str, object]:
    """The three functions as torch defines them (``torch._C``)."""
    return {name: getattr(torch._C, name) for name in GUARDED}


def one_multi_worker_epoch() -> None:
    loader = BackgroundLoader(DataLoader(list(range(8)), batch_size=4, num_workers=1), depth=2)
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


UNTOUCHED = """
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data._utils import signal_handling
    from prefetch import BackgroundLoader
    from prefetch._torch.worker_pids import GUARDED, guard_worker_pids

    loader = BackgroundLoader(DataLoader(list(range(8)), batch_size=4, num_workers=1))
    assert len(list(loader)) == 2
    assert not guard_worker_pids()
    for name in GUARDED:
        assert getattr(signal_handling, name) is getattr(torch._C, name), name
    print("untouched")
"""


class TestGilOn:
    """With the GIL on, torch's functions stay torch's own."""

    @needs_gil_on
    def test_an_epoch_leaves_torch_untouched(self) -> None:
        """After a multi-worker epoch the functions are still torch's own objects."""
        one_multi_worker_epoch()
        assert not guard_worker_pids()
        for name, function in torchs_own().items():
            assert getattr(signal_handling, name) is function, name

    @pytest.mark.slow
    @pytest.mark.skipif(not FREE_THREADED, reason="needs a free-threaded Python (make test-ft)")
    def test_free_threaded_with_the_gil_on(self) -> None:
        """A free-threaded interpreter started with ``PYTHON_GIL=1`` leaves them too."""
        done = run_script(UNTOUCHED, timeout=120, PYTHON_GIL="1")
        assert done.returncode == 0 and "untouched" in done.stdout, done.stdout + done.stderr


@needs_gil_off
class TestGilOff:
    """With the GIL off, the first epoch puts them under one lock, once."""

    def test_installed_once_when_an_epoch_opens(self) -> None:
        """Each function is wrapped around torch's own; a second install changes nothing."""
        assert len(list(BackgroundLoader(range(3)))) == 3
        guarded = {name: getattr(signal_handling, name) for name in GUARDED}
        for name, function in torchs_own().items():
            assert guarded[name] is not function
            assert guarded[name].__wrapped__ is function  # type: ignore[attr-defined]
        assert guard_worker_pids()
        assert {name: getattr(signal_handling, name) for name in GUARDED} == guarded

    def test_calls_are_torchs_own(self) -> None:
        """The wrappers return and raise what torch does."""
        guard_worker_pids()
        key = id(object())
        assert signal_handling._set_worker_pids(key, (os.getpid(),)) is None
        assert signal_handling._error_if_any_worker_fails() is None
        with pytest.raises(ValueError, match="only once"):
            signal_handling._set_worker_pids(key, (os.getpid(),))
        assert signal_handling._remove_worker_pids(key) is None
        with pytest.raises(ValueError, match=f"Cannot find worker information .* {key}"):
            signal_handling._remove_worker_pids(key)
        with pytest.raises(TypeError, match="expects a tuple"):
            signal_handling._set_worker_pids(key, 5)

    def test_a_call_waits_for_the_lock(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A call from one thread waits while another thread holds the lock."""
        guard_worker_pids()
        done, reached = threading.Event(), threading.Event()
        lock = torch_guard._LOCK
        monkeypatch.setattr(torch_guard, "_LOCK", ReachedLock(lock, reached))

        def check() -> None:
            signal_handling._error_if_any_worker_fails()
            done.set()

        with lock:
            thread = threading.Thread(target=check, name="test-guarded-call")
            thread.start()
            wait_for(
                lambda: reached.is_set() or done.is_set(),
                "the call to reach the guard's lock",
                collect=False,
            )
            assert not done.is_set(), "the call did not wait for the lock"
        assert done.wait(10)
        thread.join(10)

    def test_a_call_inside_a_call_on_one_thread(self) -> None:
        """The signal handler's call nests in its own thread's call instead of deadlocking."""
        guard_worker_pids()
        with torch_guard._LOCK:
            assert signal_handling._error_if_any_worker_fails() is None

    @pytest.mark.slow
    def test_a_forked_child_has_a_free_lock(self) -> None:
        """A child forked while another thread holds the lock can still call them."""
        done = run_script(
            """
            import os, signal, threading, warnings
            from torch.utils.data._utils import signal_handling
            from prefetch._torch import worker_pids as torch_guard
            assert torch_guard.guard_worker_pids()
            held, release = threading.Event(), threading.Event()
            def hold():
                with torch_guard._LOCK:
                    held.set()
                    release.wait()
            thread = threading.Thread(target=hold)
            thread.start()
            held.wait()
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
            pid = os.fork()
            if pid == 0:
                signal.alarm(20)  # a deadlock ends as SIGALRM
                signal_handling._error_if_any_worker_fails()
                os._exit(7)
            _, status = os.waitpid(pid, 0)
            release.set()
            thread.join()
            print("child", os.waitstatus_to_exitcode(status))
            """,
            timeout=120,
        )
        assert "child 7" in done.stdout, done.stdout + done.stderr

    @pytest.mark.slow
    @pytest.mark.timeout(120)
    def test_threads_using_the_map_at_once(self) -> None:
        """Two threads adding and removing pids while a third walks the map: no crash.

        Without the lock this kills torch 2.12 on 3.13t with SIGSEGV within seconds.
        """
        done = run_script(
            """
            import os, threading, time
            from torch.utils.data._utils import signal_handling as sh
            from prefetch._torch.worker_pids import guard_worker_pids
            assert guard_worker_pids()
            stop = time.monotonic() + 4
            def churn(base):
                i = 0
                while time.monotonic() < stop:
                    sh._set_worker_pids(base + i % 64, (os.getpid(),))
                    sh._remove_worker_pids(base + i % 64)
                    i += 1
            def walk():
                while time.monotonic() < stop:
                    sh._error_if_any_worker_fails()
            threads = [threading.Thread(target=churn, args=(b,)) for b in (1000, 2000)]
            threads.append(threading.Thread(target=walk))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print("survived")
            """,
            timeout=100,
        )
        assert done.returncode == 0 and "survived" in done.stdout, (
            f"rc {done.returncode}\n{done.stdout}{done.stderr}"
        )


CONCURRENT_EPOCHS = """
    import threading, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from prefetch import BackgroundLoader

    torch.set_num_threads(1)
    EPOCHS = 6

    class DS(Dataset):
        def __len__(self):
            return 24
        def __getitem__(self, i):
            time.sleep(0.001)
            return torch.tensor(i)

    loader = BackgroundLoader(DataLoader(DS(), batch_size=4, num_workers=2), depth=2)
    expected = [list(range(i, i + 4)) for i in range(0, 24, 4)]
    errors = []

    def other_thread():
        try:
            for _ in range(EPOCHS):
                assert [b.tolist() for b in loader] == expected
        except BaseException as error:
            errors.append(error)

    # One epoch alone first. Its first batches import modules for the first time (hmac,
    # for the file descriptors tensors come through); a worker forked while another
    # thread is inside such an import inherits that module's lock held and waits for
    # it for ever (CPython's fork with threads, not torch's map).
    assert [b.tolist() for b in loader] == expected
    thread = threading.Thread(target=other_thread)
    thread.start()
    for epoch in range(EPOCHS):  # two iterators at once here, a third on the other thread
        pairs = [(a.tolist(), b.tolist()) for a, b in zip(loader, loader)]
        assert pairs == [(batch, batch) for batch in expected], (epoch, pairs)
    thread.join()
    assert not errors, errors
    print("epochs", EPOCHS)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_multi_worker_epochs_with_concurrent_iterators() -> None:
    """Six epochs of three iterators at once over a 2-worker DataLoader, on two threads.

    Each iterator's workers start on its thread, stop on a prefetch thread and
    are reaped by the main thread's SIGCHLD handler: every use of torch's map
    at once that the guard orders. Runs on every interpreter; free-threaded
    with the GIL off it crashed without the guard.
    """
    done = run_script(CONCURRENT_EPOCHS, timeout=200)
    assert done.returncode == 0 and "epochs 6" in done.stdout, (
        f"rc {done.returncode}\n{done.stdout}{done.stderr[-3000:]}"
    )
