"""JPEG epochs with storage latency, one per fresh process, and their physical limit.

What the ``readbound`` and ``autostart`` workloads share.
:func:`fresh_runner` runs one loader's epoch in a fresh process
(:mod:`benchmarks.parallel_child`) without the memory sampler (these
workloads time, and a sampling thread would take a share of a core from what
it measures), and keeps the ``thread_events`` of a ``fetch_threads`` run
aside. :func:`decode_runner` measures, in this process, the CPU time one
image's decoding takes, once per repeat, so that each repeat has its own
:class:`Limit`: an epoch of ``images`` reads of ``latency`` seconds cannot
end before ``images x latency / threads`` (every thread always waiting on a
read) nor before ``images x decode CPU / cores`` (every core always
decoding), whichever is later.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import Column, Measure, Samples, median, values_of
from benchmarks.jpeg_files import decode
from benchmarks.jpeg_variants import LATENCY
from benchmarks.memory import run_child

__all__ = [
    "DECODE_FILES",
    "LATENCY",
    "Limit",
    "cores",
    "decode_runner",
    "epoch_columns",
    "fresh_runner",
    "jpeg_spec",
    "limits",
    "median_limit",
]

DECODE_FILES = 16
"""Files whose decoding :func:`decode_runner` times (the median is the estimate)."""

Events = list[dict[str, Any]]
"""The ``thread_events`` of one run, each a dict (item, seconds, old, new, reason)."""


def epoch_columns(against: str) -> list[Column]:
    """The columns both workloads open with: epoch, speed, first batch, ratios to ``against``.

    The ratios' keys are ``speed_ratio`` and ``first_ratio``.
    """
    return [
        Column("seconds", "epoch s", "{:.3f}"),
        Column("items_per_second", "images/s", "{:.0f}"),
        Column("speed_ratio", f"vs {against}", "{:.2f}x"),
        Column("first_batch_seconds", "first batch s", "{:.3f}"),
        Column("first_ratio", f"first batch vs {against}", "{:.2f}x"),
    ]


def cores() -> int:
    """Return the cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def jpeg_spec(
    folder: str, images: int, side: int, batch: int, method: str, concurrency: int | str
) -> dict[str, Any]:
    """The :mod:`benchmarks.parallel_child` spec of one epoch with :data:`LATENCY` per read.

    A ``fetch_threads`` epoch also reports its ``thread_events``.
    """
    return {
        "workload": "jpeg",
        "method": method,
        "concurrency": concurrency,
        "batch_size": batch,
        "folder": folder,
        "count": images,
        "side": side,
        "latency": LATENCY,
        "trace": method == "threads",
    }


def fresh_runner(spec: dict[str, Any], traces: list[Events]) -> Callable[[], Measure]:
    """A callable that runs ``spec`` in a fresh process and returns its figures.

    Each run's ``thread_events`` (empty for other methods) is appended to
    ``traces``, in run order.
    """

    def run_once() -> Measure:
        report = run_child(spec, sample=False)
        traces.append(report.pop("thread_events", []))
        return {
            key: float(value) for key, value in report.items() if isinstance(value, int | float)
        }

    return run_once


def decode_runner(folder: Path, side: int, files: int = DECODE_FILES) -> Callable[[], Measure]:
    """A callable that times decoding ``files`` of ``folder``'s JPEGs to ``side`` in this thread.

    Returns ``{"decode_seconds": median CPU seconds of one decode}``.
    """
    blobs = [path.read_bytes() for path in sorted(folder.glob("*.jpg"))[:files]]

    def run_once() -> Measure:
        costs = []
        for blob in blobs:
            started = time.thread_time()
            decode(blob, side)
            costs.append(time.thread_time() - started)
        return {"decode_seconds": median(costs)}

    return run_once


@dataclasses.dataclass(frozen=True)
class Limit:
    """The physical limit of one epoch: reads in flight at ``threads``, decoding on ``cores``.

    Example:
        >>> limit = Limit(images=512, threads=16, decode_seconds=0.002, cores=2)
        >>> round(limit.reads, 2), round(limit.cpu, 3), limit.bound
        (0.64, 0.512, 'reads')
    """

    images: int
    threads: int
    decode_seconds: float
    cores: int
    latency: float = LATENCY

    @property
    def reads(self) -> float:
        """Seconds the reads alone take: ``images x latency / threads``."""
        return self.images * self.latency / self.threads

    @property
    def cpu(self) -> float:
        """Seconds the decoding alone takes: ``images x decode CPU / cores``."""
        return self.images * self.decode_seconds / self.cores

    @property
    def seconds(self) -> float:
        """The later of the two: no loader can finish the epoch sooner."""
        return max(self.reads, self.cpu)

    @property
    def bound(self) -> str:
        """Which of the two is the limit: ``"reads"`` or ``"CPU"``."""
        return "reads" if self.reads >= self.cpu else "CPU"

    def describe(self) -> str:
        """The limit in words, with both of its terms."""
        return (
            f"{self.seconds:.2f} s, the later of reads {self.images} x "
            f"{self.latency * 1e3:.0f} ms / {self.threads} threads = {self.reads:.2f} s and "
            f"decoding {self.images} x {self.decode_seconds * 1e3:.1f} ms CPU / {self.cores} "
            f"cores = {self.cpu:.2f} s: {self.bound} the limit"
        )


def limits(samples: Samples, decode_name: str, images: int, threads: int) -> list[Limit]:
    """Each repeat's :class:`Limit`, from that repeat's decode timing (``decode_name``)."""
    count = cores()
    return [
        Limit(images, threads, cost, count)
        for cost in values_of(samples, decode_name, "decode_seconds")
    ]


def median_limit(repeats: list[Limit]) -> Limit:
    """The limit at the median decode cost of ``repeats`` (for the reports' words)."""
    first = repeats[0]
    cost = median([limit.decode_seconds for limit in repeats])
    return dataclasses.replace(first, decode_seconds=cost)
