"""``Reports``: when the adaptive depth hears of the hand-offs, and what it hears.

The invariant of :mod:`prefetch._threads.reports`: a report goes to the
policies at once when the loop waited or nearly did (took the last ready item
below the ceiling), and otherwise after exactly ``max(REPORT_EVERY, depth)``
quiet hand-offs. Checked here on the consumer's calls alone, with a depth
policy that records what it is told and an engine that only answers
``snapshot()``: no thread, and no clock but one the test moves.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefetch._shared.stats import LoaderStats
from prefetch._threads import reports as reports_module
from prefetch._threads.messages import Snapshot
from prefetch._threads.policy import DEPTH, THREADS, AdaptivePolicy, Fixed
from prefetch._threads.reports import REPORT_EVERY, Reports

from .clocks import START, FakeClock


class Listening(AdaptivePolicy):
    """An adaptive depth that records each report (the hand-offs it counts, the ready)."""

    setting = DEPTH

    def __init__(self, value: int, maximum: int, answer: int | None = None) -> None:
        super().__init__(value, maximum)
        self.heard: list[dict[str, Any]] = []
        self.answer = answer  # what observe() returns: a new value, or None

    def observe(self, **report: Any) -> int | None:
        self.heard.append(report)
        return self.answer


class ListeningThreads(Listening):
    """An adaptive thread count that records each report."""

    setting = THREADS


class Figures:
    """An engine as Reports sees it: figures read together; the changes it is told."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.changes: list[tuple[str, int]] = []

    def set_depth(self, depth: int) -> None:
        self.changes.append(("depth", depth))

    def set_threads(self, count: int) -> None:
        self.changes.append(("threads", count))

    def snapshot(self) -> Snapshot:
        return Snapshot(
            depth=4,
            threads=self.threads,
            in_flight=0,
            ready=0,
            posted=0,
            waiting_threads=0,
            free=0,
            fetched=40,
            max_bytes=None,
            buffered_bytes=0,
            largest_item=1000,
            busy_seconds=3.0,
            blocked_seconds=0.25,
            cpu_seconds=1.5,
            reads=0,
        )


def hand_overs(
    depth: Listening,
    ready: list[int],
    waits: frozenset[int] = frozenset(),
    threads: Listening | None = None,
) -> None:
    """Hand over one item per entry of ``ready`` (items ready then); the loop waited before
    the items numbered in ``waits`` (from 1)."""
    stats = LoaderStats()
    depth.start_epoch(stats)
    if threads is not None:
        threads.start_epoch(stats)
    reports = Reports(depth, threads if threads is not None else Fixed(THREADS, 1))
    engine: Any = Figures()
    for items, now_ready in enumerate(ready, start=1):
        if items in waits:
            reports.waited(0.5)
        stats.items = items
        reports.hand_over(now_ready, stats, engine)


class TestReports:
    @pytest.mark.parametrize("value", [4, 40])
    def test_quiet_hand_offs_are_reported_every_max_report_every_depth(self, value: int) -> None:
        """With items always to spare, the first hand-off (nothing could be ready before it)
        and then every ``max(REPORT_EVERY, depth)``-th are reported, each counting the
        hand-offs since the last."""
        depth = Listening(value, 64)
        every = max(REPORT_EVERY, value)
        hand_overs(depth, [5] * (1 + 3 * every))
        assert [report["count"] for report in depth.heard] == [1, every, every, every]
        assert [report["ready"] for report in depth.heard] == [0, 5, 5, 5]
        assert {report["busy_seconds"] for report in depth.heard} == {3.0}  # one thread

    def test_a_wait_is_reported_at_once(self) -> None:
        """The hand-off after a wait is reported there, with the wait and nothing ready."""
        depth = Listening(4, 64)
        hand_overs(depth, [5, 5, 5, 5, 0, 5], waits=frozenset({5}))
        assert [report["count"] for report in depth.heard] == [1, 4]
        assert (depth.heard[1]["waited"], depth.heard[1]["ready"]) == (0.5, 0)

    def test_a_near_miss_is_reported_at_once_below_the_ceiling(self) -> None:
        """Taking the last ready item is reported at once while the depth may still grow,
        with the fewest ready since the last report; at the ceiling it waits its turn."""
        below = Listening(4, 64)
        hand_overs(below, [5, 3, 2, 1, 5])
        assert [(report["count"], report["ready"]) for report in below.heard] == [(1, 0), (3, 1)]
        at_ceiling = Listening(64, 64)
        hand_overs(at_ceiling, [5, 3, 2, 1, 5])
        assert [report["count"] for report in at_ceiling.heard] == [1]

    def test_the_fewest_ready_since_the_last_report_is_what_it_hears(self) -> None:
        """A quiet report carries the fewest items ready at any hand-off it covers."""
        depth = Listening(4, 64)
        hand_overs(depth, [9] + [9] * 7 + [2] + [9] * 8)
        assert [(report["count"], report["ready"]) for report in depth.heard] == [(1, 0), (16, 2)]

    def test_both_policies_hear_each_report(self) -> None:
        """An adaptive thread count hears the same reports as the depth, with the items."""
        depth, threads = Listening(4, 64), ListeningThreads(2, 32)
        hand_overs(depth, [5] * 33, threads=threads)
        assert len(depth.heard) == len(threads.heard) == 3
        assert [report["items"] for report in threads.heard] == [1, 17, 33]

    def test_the_figures_and_the_answers_go_where_they_belong(self) -> None:
        """The depth hears the busy time per thread (N threads make an item N times as
        often); the thread count the totals; each new value goes to the engine, and a
        changed depth is what ``hand_over`` returns."""
        depth, threads = Listening(4, 64, answer=8), ListeningThreads(2, 32, answer=3)
        stats = LoaderStats(wait_seconds=0.75)
        depth.start_epoch(stats)
        threads.start_epoch(stats)
        reports = Reports(depth, threads)
        engine: Any = Figures(threads=2)
        stats.items = 1
        assert reports.hand_over(5, stats, engine) is True
        heard = depth.heard[0]
        assert (heard["busy_seconds"], heard["blocked_seconds"]) == (1.5, 0.25)
        assert (heard["fetched"], heard["largest_item"]) == (40, 1000)
        told = threads.heard[0]
        assert (told["busy_seconds"], told["cpu_seconds"], told["waited"]) == (3.0, 1.5, 0.75)
        assert told["largest_item"] == 1000
        assert engine.changes == [("depth", 8), ("threads", 3)]
        depth.answer = None
        stats.items = 2
        assert reports.hand_over(5, stats, engine) is False  # not due, nothing changed
        reports.waited(0.5)
        stats.items = 3
        assert reports.hand_over(0, stats, engine) is False  # heard, the depth stays
        assert len(depth.heard) == 2

    def test_the_step_is_the_time_since_the_last_report_less_the_wait(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On a clock the test moves: a report after a wait hears the seconds since the last
        report less that wait; a quiet report hears no wait and all the seconds."""
        clock = FakeClock()
        monkeypatch.setattr(reports_module, "time", clock)
        depth = Listening(4, 64)
        stats = LoaderStats()
        depth.start_epoch(stats)
        reports = Reports(depth, Fixed(THREADS, 1))
        engine: Any = Figures()
        stats.items = 1
        reports.hand_over(5, stats, engine)  # the first: reported at once
        clock.advance(2.0)
        reports.waited(0.5)
        stats.items = 2
        reports.hand_over(0, stats, engine)  # after a wait: at once
        for items in range(3, 3 + REPORT_EVERY):
            clock.advance(0.25)
            stats.items = items
            reports.hand_over(5, stats, engine)
        assert len(depth.heard) == 3
        after_wait, quiet = depth.heard[1], depth.heard[2]
        assert (after_wait["waited"], after_wait["step"]) == (0.5, pytest.approx(1.5))
        assert (quiet["waited"], quiet["ready"]) == (0.0, 5)
        assert quiet["step"] == pytest.approx(0.25 * REPORT_EVERY)
        assert quiet["now"] == pytest.approx(START + 2.0 + 0.25 * REPORT_EVERY)

    def test_an_older_epoch_stops_reporting(self) -> None:
        """Once a newer epoch drives the policies, an older one's reports reach nobody."""
        depth = Listening(4, 64)
        stats = LoaderStats()
        depth.start_epoch(stats)
        reports = Reports(depth, Fixed(THREADS, 1))
        depth.start_epoch(LoaderStats())  # a newer iter()
        engine: Any = Figures()
        stats.items = 1
        assert reports.hand_over(0, stats, engine) is False
        assert depth.heard == [] and reports.active is False
