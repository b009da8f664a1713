"""``Reports``: what an epoch's consumer end tells the depth and thread policies, and when.

The consumer end (:mod:`prefetch._threads.iterator`) calls
:meth:`Reports.hand_over` at each hand-over its slow path makes and
:meth:`Reports.waited` when the loop waited for a run; its fast path stops
:meth:`Reports.due` hand-offs ahead, so no report is late.

Invariants:

* **Reports are exact.** A report goes to the policies at once when the loop
  waited or nearly did, and otherwise after exactly
  ``max(REPORT_EVERY, depth)`` quiet hand-offs.
* Only the latest epoch reports: once a newer ``iter()`` drives the policies,
  this epoch stops reporting and keeps the depth and threads it had.
* Fixed settings hear nothing (:attr:`Reports.active` is false from the start).
"""

from __future__ import annotations

import time

from prefetch._shared.stats import LoaderStats
from prefetch._threads.engine import Engine
from prefetch._threads.policy import Control

MORE_THAN_EVER_READY = 1 << 62
"""The fewest items ready after a report, until a hand-over counts them."""
REPORT_EVERY = 16
"""Quiet hand-offs reported to the policies at once (or the depth's worth, if more)."""


class Reports:
    """An epoch's reports to its depth and thread policies; see the module.

    Args:
        depth: The depth's control (fixed or adaptive).
        threads: The thread count's control.
    """

    __slots__ = (
        "_fewest",
        "_handed_over",
        "_reported_items",
        "_waited",
        "active",
        "depth",
        "threads",
    )

    def __init__(self, depth: Control, threads: Control) -> None:
        self.depth, self.threads = depth, threads
        self.active = depth.adaptive or threads.adaptive  # fixed ones hear nothing
        self._waited = 0.0  # seconds the last exchange waited
        self._handed_over = 0.0  # perf_counter() at the last report
        self._reported_items = 0  # stats.items at the last report
        self._fewest = 0  # the fewest items ready at a report point since (0: report at once)

    def start(self, engine: Engine) -> None:
        """Ask the engine to say when the reads the thread policy wants to hear of are done."""
        engine.tell_after(self.threads.first_reads() if self.active else None)

    def reads_done(self, engine: Engine) -> None:
        """The reads asked for are done: the thread policy may size the epoch from them.

        It may ask to hear of more reads (its next :meth:`~ThreadPolicy.first_reads`).
        """
        figures = engine.snapshot()
        wanted = self.threads.observe_reads(
            reads=figures.reads,
            busy_seconds=figures.busy_seconds,
            cpu_seconds=figures.cpu_seconds,
            now=time.perf_counter(),
        )
        if wanted is not None:
            engine.set_threads(wanted)
        engine.tell_after(self.threads.first_reads())

    def waited(self, seconds: float) -> None:
        """The loop waited ``seconds`` for a run: reported with the next hand-over."""
        self._waited = seconds
        self._fewest = 0

    def due(self, items: int) -> int:
        """Hand-offs from the one that made ``items`` to the next quiet report."""
        return self._reported_items + max(REPORT_EVERY, self.depth.value) - items

    def hand_over(self, ready: int, stats: LoaderStats, engine: Engine) -> bool:
        """Report now if the loop waited or nearly did, else every few items.

        ``ready`` items were ready at this hand-over (it included). Returns
        whether the depth changed.
        """
        if ready < self._fewest:
            self._fewest = ready
        fewest, depth = self._fewest, self.depth
        # A near miss at the ceiling changes nothing a wait or the next report would not.
        urgent = fewest == 0 or (fewest == 1 and depth.value < depth.maximum)
        if urgent or self.due(stats.items) <= 0:
            return self._adapt(stats, engine)
        return False

    def _adapt(self, stats: LoaderStats, engine: Engine) -> bool:
        """Report the hand-offs since the last report; apply the policies' decisions."""
        items = stats.items
        adapts_depth, adapts_threads = self.depth.drives(stats), self.threads.drives(stats)
        if not adapts_depth and not adapts_threads:
            self.active = False  # a newer iter() adapts them now; this epoch keeps its own
            return False
        now = time.perf_counter()
        figures = engine.snapshot()
        changed = False
        if adapts_depth:
            fewest = self._fewest
            waited = self._waited  # 0.0 unless the loop waited since the last report
            threads = max(figures.threads, 1)  # N threads make an item N times as often
            new = self.depth.observe(
                now=now,
                step=now - self._handed_over - waited,
                waited=waited,
                ready=fewest,
                fetched=figures.fetched,
                busy_seconds=figures.busy_seconds / threads,
                blocked_seconds=figures.blocked_seconds,
                largest_item=figures.largest_item,
                count=max(1, items - self._reported_items),
            )
            if new is not None:
                engine.set_depth(new)
                changed = True
        if adapts_threads:
            wanted = self.threads.observe(
                now=now,
                items=items,
                waited=stats.wait_seconds,
                busy_seconds=figures.busy_seconds,
                cpu_seconds=figures.cpu_seconds,
                largest_item=figures.largest_item,
            )
            if wanted is not None:
                engine.set_threads(wanted)
        self._handed_over, self._reported_items = now, items
        self._fewest, self._waited = MORE_THAN_EVER_READY, 0.0
        return changed
