"""A ``time.perf_counter`` that tests move by hand (for figures and pacing on a known clock)."""

from __future__ import annotations

import threading
import time
from typing import Any

START = 100.0
"""Where a :class:`FakeClock` starts."""


class FakeClock:
    """``time.perf_counter`` that moves only when told; the rest of ``time`` as it is.

    Patched in as a module's ``time``, it makes that module's clock readings
    the sums of the steps the test advanced it by.
    """

    def __init__(self) -> None:
        self.now = START
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
