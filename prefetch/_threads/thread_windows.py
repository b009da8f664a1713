"""What the thread policy measures: windows of hand-offs, and the figures it reads off them.

:class:`~prefetch._threads.thread_policy.ThreadPolicy` keeps its reports as
:class:`Window` sums and decides on the throughput, wait share and CPU share
of a window; the helpers here know nothing of its rules but
:data:`MIN_GAIN`'s bound (:func:`needed_gain`).
"""

from __future__ import annotations

import dataclasses
import os

MIN_GAIN = 0.1
"""Throughput rise a growth must bring (at most; see :func:`needed_gain`)."""


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return os.cpu_count() or 1


def needed_gain(wait_share: float) -> float:
    """Throughput rise a growth from a window with this wait share must bring.

    :data:`MIN_GAIN`, or half the most the loop allowed if that is less: a
    loop that waited a share ``w`` can take batches at most ``1 / (1 - w)``
    times as fast.

    Example:
        >>> needed_gain(0.5), round(needed_gain(0.1), 4)
        (0.1, 0.0556)
    """
    if wait_share >= 1.0:
        return MIN_GAIN
    return min(MIN_GAIN, wait_share / (1.0 - wait_share) / 2)


@dataclasses.dataclass(slots=True)
class Window:
    """Sums over a window: seconds, batches, the loop's wait, the threads' busy and CPU time.

    A report's cumulative figures are kept as a window from the clock's origin.
    """

    seconds: float
    items: int
    waited: float
    busy: float
    cpu: float

    def to(self, point: Window, carry: Window) -> Window:
        """The sums from this report to a later one, plus ``carry``."""
        return Window(
            point.seconds - self.seconds + carry.seconds,
            point.items - self.items + carry.items,
            point.waited - self.waited + carry.waited,
            point.busy - self.busy + carry.busy,
            point.cpu - self.cpu + carry.cpu,
        )

    @property
    def throughput(self) -> float:
        """Batches handed over per second."""
        return self.items / self.seconds

    @property
    def wait_share(self) -> float:
        """Share of the window the loop waited for data."""
        return min(1.0, max(0.0, self.waited / self.seconds))

    @property
    def cpu_share(self) -> float:
        """CPU seconds per busy second of the threads (0 when unknown)."""
        return self.cpu / self.busy if self.busy > 0 and self.cpu > 0 else 0.0


NOTHING = Window(0.0, 0, 0.0, 0.0, 0.0)
"""A window of nothing (what a fresh measurement carries over)."""


def figure(value: float) -> str:
    """Format a figure for a reason: three significant digits, whole from 1000 up.

    Example:
        >>> figure(0.04567), figure(12.34), figure(999.4), figure(1023.9), figure(12345.6)
        ('0.0457', '12.3', '999', '1024', '12346')
    """
    return f"{value:.3g}" if abs(value) < 999.5 else f"{value:.0f}"


def rate(window: Window) -> str:
    """Format a window's throughput for a reason: ``'12.3 batches/s'``."""
    return f"{figure(window.throughput)} batches/s"


def size(n: int) -> str:
    """Format a byte count for a reason: ``'512 bytes'``, ``'1.5 MiB'``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{figure(n / (1 << shift))} {unit}"
    return f"{n} bytes"
