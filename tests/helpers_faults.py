"""Shared helpers for the fault, stress, model-based, resume and DDP tests (issue 6).

Everything here inspects the process through ``os`` and ``/proc`` only
(psutil is not installed): live ``prefetch-*`` threads, child processes,
processes left in a session, resident memory.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- process state


def prefetch_threads() -> list[threading.Thread]:
    """Return the live threads this package started."""
    return [t for t in threading.enumerate() if t.name.startswith("prefetch-")]


def os_thread_count() -> int:
    """Return how many OS threads this process has (``/proc/self/task``)."""
    return len(os.listdir("/proc/self/task"))


def child_pids(pid: int | None = None) -> list[int]:
    """Return the direct children of ``pid`` (default: this process), from ``/proc``."""
    pid = os.getpid() if pid is None else pid
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    for task in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        children.extend(int(word) for word in text.split())
    return sorted(set(children))


def live_child_pids() -> list[int]:
    """Return this process's children that are not zombies."""
    alive = []
    for child in child_pids():
        state = process_state(child)
        if state is not None and state != "Z":
            alive.append(child)
    return alive


def process_state(pid: int) -> str | None:
    """Return the one-letter state of ``pid`` (``R``, ``S``, ``Z``...), or ``None`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def session_members(session_id: int) -> list[int]:
    """Return the live (non-zombie) processes whose session id is ``session_id``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # fields: state ppid pgrp session ...
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(int(entry))
    return members


def rss_mb() -> float:
    """Return this process's resident set size in MB (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``condition`` (collecting garbage) until true or ``timeout``; return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        gc.collect()
        time.sleep(interval)


def settle(timeout: float = 10.0) -> tuple[list[str], list[int]]:
    """Wait for prefetch threads and child processes to end; return those still alive."""
    multiprocessing.active_children()  # reaps finished multiprocessing children
    wait_until(lambda: not prefetch_threads() and not live_child_pids(), timeout)
    multiprocessing.active_children()
    return [t.name for t in prefetch_threads()], live_child_pids()


# --------------------------------------------------------------------------- exceptions


class KwOnlyError(Exception):
    """An exception whose constructor needs a keyword-only argument."""

    def __init__(self, *, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class NoSuperError(Exception):
    """An exception whose ``__init__`` never calls ``super().__init__``."""

    def __init__(self, a: int, b: int) -> None:
        self.total = a + b


class CustomBaseError(BaseException):
    """A ``BaseException`` that is not an ``Exception``."""


def make_errors() -> dict[str, BaseException]:
    """Return one fresh instance of every exception kind the fault tests inject."""
    return {
        "ValueError": ValueError("boom"),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "SystemExit": SystemExit(3),
        "CustomBaseError": CustomBaseError("custom"),
        "KwOnlyError": KwOnlyError(code=7),
        "NoSuperError": NoSuperError(1, 2),
        "StopIteration-in-RuntimeError": RuntimeError("wraps", StopIteration()),
    }


# --------------------------------------------------------------------------- sources


def failing_gen(
    items: list[Any], fail_at: int | None, error: BaseException | None
) -> Iterator[Any]:
    """Yield ``items``, raising ``error`` instead of item ``fail_at`` (if given)."""
    for index, item in enumerate(items):
        if fail_at is not None and index == fail_at:
            assert error is not None
            raise error
        yield item
    if fail_at is not None and fail_at >= len(items):
        assert error is not None
        raise error


class FailingIterable:
    """A re-iterable source that raises ``error`` at item ``fail_at`` of each epoch."""

    def __init__(
        self, items: list[Any], fail_at: int | None = None, error: BaseException | None = None
    ) -> None:
        self.items = items
        self.fail_at = fail_at
        self.error = error

    def __iter__(self) -> Iterator[Any]:
        return failing_gen(self.items, self.fail_at, self.error)

    def __len__(self) -> int:
        return len(self.items)


class ListSource:
    """A stateful list-backed source: the reference for checkpoint semantics.

    ``state_dict()`` is ``{"pos": p, "epoch": e}``: ``p`` items of epoch ``e``
    (the epoch being iterated) have been produced. ``load_state_dict`` makes
    the next ``iter()`` start at ``p`` of epoch ``e``; a position at the end
    means "start a new epoch". ``set_epoch`` picks the epoch the next
    ``iter()`` uses. Items are ``(epoch, index, value)`` in an order that is a
    permutation seeded by the epoch. ``fail_at`` (read at ``iter()``) makes the
    epoch raise ``error`` instead of producing that index.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.pos = 0
        self.epoch = 0  # used by the next iter()
        self.active_epoch = 0  # the epoch being iterated
        self.fail_at: int | None = None
        self.error: BaseException | None = None

    @staticmethod
    def order(epoch: int, size: int) -> list[int]:
        """Return the item order of ``epoch`` (a seeded permutation of ``range(size)``)."""
        import random

        values = list(range(size))
        random.Random(epoch).shuffle(values)
        return values

    def __len__(self) -> int:
        return self.size

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation the next ``iter()`` uses."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, int]:
        """Return the position after the last produced item, and its epoch."""
        return {"pos": self.pos, "epoch": self.active_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from ``state`` at the next ``iter()``."""
        self.pos = state["pos"]
        self.epoch = self.active_epoch = state["epoch"]

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        if self.pos >= self.size:
            self.pos = 0
        self.active_epoch = self.epoch
        return self._run(self.pos, self.epoch, self.fail_at, self.error)

    def _run(
        self, start: int, epoch: int, fail_at: int | None, error: BaseException | None
    ) -> Iterator[tuple[int, int, int]]:
        order = self.order(epoch, self.size)
        for index in range(start, self.size):
            if fail_at is not None and index == fail_at:
                assert error is not None
                raise error
            self.pos = index + 1
            yield (epoch, index, order[index])


class Tracked:
    """A batch object that can be weak-referenced, to count live batches."""

    __slots__ = ("__weakref__", "index", "payload")

    def __init__(self, index: int) -> None:
        self.index = index
        self.payload = bytearray(16)


# --------------------------------------------------------------------------- subprocesses


def free_port() -> int:
    """Return a TCP port on the loopback interface that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def subprocess_env(**extra: str) -> dict[str, str]:
    """Return an environment for child Pythons: the repo importable, one intra-op thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def start_script(code: str) -> subprocess.Popen[str]:
    """Start ``code`` in a new Python process in its own session (stdout/stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=str(ROOT),
        start_new_session=True,
    )


class LineReader:
    """Collect a subprocess's stdout lines in a background thread; wait for one by prefix."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import queue

        self.proc = proc
        self.other: list[str] = []
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._read, name="test-line-reader", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, marker: str, timeout: float) -> str | None:
        """Return the next line starting with ``marker``, or ``None`` after ``timeout`` or EOF."""
        import queue

        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(marker):
                return line
            self.other.append(line)


def kill_session(session_id: int) -> None:
    """SIGKILL every process left in ``session_id`` (cleanup after a failed test)."""
    import signal

    for pid in session_members(session_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


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
        # The loop stops at the error and drops the iterator (an iterator still held
        # could go on after an error, so its thread would rightly keep running); this
        # frame stays in the error's traceback, so the name must go.
        del iterator
        return items, error
    return items, None
