"""Peak memory of a process and its worker processes, as summed PSS.

PSS (proportional set size, from ``/proc/<pid>/smaps_rollup``) counts a page
shared by k processes as 1/k in each, so the sum over a process tree is the
memory the tree really holds. RSS counts a shared page in every process and
would charge forked DataLoader workers for the parent's pages they merely
share. Linux only; elsewhere the figures are ``nan``.

:func:`run_child` runs one benchmark variant in a fresh Python process
(``python -m benchmarks.parallel_child SPEC``), samples the summed PSS of it
and its descendants every ~20 ms from a thread of this process, and returns
the child's JSON report with ``peak_pss_mib`` added.

Invariants: the sampler thread only reads ``/proc``; it stops when the child
has exited (and is joined before :func:`run_child` returns); a process that
exits between listing and reading is skipped, never an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["INTERVAL", "PssSampler", "pss_kib", "run_child", "tree_of"]

INTERVAL = 0.02
"""Seconds between samples (at least the time one sample took: under half a core)."""
ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 300.0


def pss_kib(pid: int) -> int | None:
    """Return the PSS of ``pid`` in KiB, or ``None`` if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as file:
            for line in file:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _parents(newer_than: int = 0) -> dict[int, int]:
    """Map visible pids above ``newer_than`` to their parent pid (from ``/proc/<pid>/stat``)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) <= newer_than:
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as file:
                stat = file.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # the name may hold spaces
        parents[int(entry)] = int(fields[1])
    return parents


def tree_of(pid: int) -> list[int]:
    """Return ``pid`` and all its descendants.

    Only processes with a larger pid are read (descendants started after
    ``pid``; Linux hands out pids in increasing order until they wrap), so a
    sample reads a few files, not every process's.
    """
    children: dict[int, list[int]] = {}
    for child, parent in _parents(newer_than=pid).items():
        children.setdefault(parent, []).append(child)
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


class PssSampler:
    """Sample the summed PSS of a process tree in a thread until :meth:`stop`.

    Attributes:
        peak_kib: Highest sum seen (0 before the first sample).
        samples: Samples taken.
        processes: Most processes seen in one sample.
        cpu_seconds: CPU time the sampling thread used (it shares the cores
            with what it measures).
    """

    def __init__(self, pid: int, interval: float = INTERVAL) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.samples = 0
        self.processes = 0
        self.cpu_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-pss", daemon=True)

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and join the thread."""
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        """Take one sample now."""
        values = [pss_kib(pid) for pid in tree_of(self.pid)]
        present = [value for value in values if value is not None]
        if present:
            self.samples += 1
            self.peak_kib = max(self.peak_kib, sum(present))
            self.processes = max(self.processes, len(present))

    def _run(self) -> None:
        started = time.thread_time()
        while True:
            before = time.perf_counter()
            self.sample()
            took = time.perf_counter() - before
            if self._stop.wait(max(self.interval, took)):
                break
        self.cpu_seconds = time.thread_time() - started


def run_child(
    spec: dict[str, Any],
    timeout: float = CHILD_TIMEOUT,
    python: str | None = None,
    env: dict[str, str] | None = None,
    sample: bool = True,
) -> dict[str, Any]:
    """Run ``python -m benchmarks.parallel_child SPEC`` and return its report plus peak PSS.

    ``python`` is the interpreter (default: this one), ``env`` variables added
    to this process's environment for the child. With ``sample`` false no
    thread samples the child's memory (it would take a share of a core from a
    timing that is all that matters): the PSS figures are then ``nan``.

    The report is the JSON object on the child's last line of output; this
    adds ``peak_pss_mib`` (summed over the child and its descendants),
    ``pss_processes`` (most processes seen at once), ``pss_samples``,
    ``sampler_cpu_share`` (CPU time of the sampling thread over the child's
    life: the share of one core it took from what it measured) and
    ``child_seconds`` (the child's life, interpreter start-up included).

    Raises:
        RuntimeError: The child failed; the message holds its output.
    """
    command = [python or sys.executable, "-m", "benchmarks.parallel_child", json.dumps(spec)]
    environ = {**os.environ, **env} if env else None
    started = time.perf_counter()
    with subprocess.Popen(
        command, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        sampler = PssSampler(child.pid)
        if sample:
            sampler.start()
        try:
            out, err = child.communicate(timeout=timeout)
            lifetime = time.perf_counter() - started
        finally:
            if sample:
                sampler.stop()
            if child.poll() is None:
                child.kill()
                child.wait()
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        msg = f"benchmark child {spec} exited with {child.returncode}:\n{out}\n{err}"
        raise RuntimeError(msg)
    report: dict[str, Any] = json.loads(lines[-1])
    report["peak_pss_mib"] = sampler.peak_kib / 1024 if sampler.samples else float("nan")
    report["pss_processes"] = float(sampler.processes)
    report["pss_samples"] = float(sampler.samples)
    report["sampler_cpu_share"] = sampler.cpu_seconds / lifetime
    report["child_seconds"] = lifetime
    return report
