"""Process state seen through ``os`` and ``/proc`` (psutil is not installed).

Live ``prefetch-*`` threads, child processes, processes left in a session,
resident memory, and polling until they settle.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path


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


def wait_until(
    condition: Callable[[], bool], timeout: float, interval: float = 0.02, *, collect: bool = True
) -> bool:
    """Poll ``condition`` until true or ``timeout``; return the last value.

    The one polling loop of the tests (``liveness.wait_for`` fails through
    it). With ``collect`` it runs the garbage collector between polls; leave
    it off where what is checked must happen without the collector's help.
    """
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        if collect:
            gc.collect()
        time.sleep(interval)


def settle(timeout: float = 10.0) -> tuple[list[str], list[int]]:
    """Wait for prefetch threads and child processes to end; return those still alive.

    A child counts as ended once multiprocessing can reap it too: a DataLoader
    worker whose main thread has exited shows as a zombie while its other
    threads are still exiting (seconds, for a process that mapped torch's
    CUDA build), and until then ``multiprocessing.active_children()`` lists it.
    """
    multiprocessing.active_children()  # reaps finished multiprocessing children
    wait_until(
        lambda: (
            not prefetch_threads()
            and not live_child_pids()
            and not multiprocessing.active_children()
        ),
        timeout,
    )
    multiprocessing.active_children()
    return [t.name for t in prefetch_threads()], live_child_pids()
