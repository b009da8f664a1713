"""How many threads fetch in parallel: fixed, or ``"auto"`` (placeholder until merged)."""

from __future__ import annotations

from typing import Protocol

from prefetch._stats import LoaderStats

DEFAULT_MAX_THREADS = 32


class ThreadControl(Protocol):
    """What the consumer of one loader asks of its thread count."""

    threads: int
    maximum: int
    adaptive: bool

    def start_epoch(self, stats: LoaderStats) -> None:
        """Begin an epoch whose stats receive the count (and its changes)."""

    def drives(self, stats: LoaderStats) -> bool:
        """Whether ``stats`` belong to the epoch this control adapts."""

    def observe(
        self,
        *,
        now: float,
        items: int,
        waited: float,
        busy_seconds: float,
        cpu_seconds: float,
        largest_item: int,
    ) -> int | None:
        """Take the epoch's totals into account; return the new count if it changed."""


class FixedThreads:
    """A thread count that never changes, behind :class:`ThreadControl`."""

    adaptive = False

    def __init__(self, threads: int) -> None:
        self.threads = self.maximum = threads

    def start_epoch(self, stats: LoaderStats) -> None:
        """Nothing to record for a fixed count."""

    def drives(self, stats: LoaderStats) -> bool:
        """Never: a fixed count is not adapted."""
        return False

    def observe(self, **report: float) -> int | None:
        """Ignore the report: the count stays."""
        return None


class ThreadPolicy(FixedThreads):
    """Placeholder for the adaptive policy (being written): a fixed count."""

    def __init__(self, *, max_bytes: int | None = None) -> None:
        super().__init__(2)
