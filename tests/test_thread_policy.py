"""ThreadPolicy and a fixed count: exact decisions on an injected clock, and simulated traces.

:class:`Feed` scripts the cumulative figures the engine reports after each
hand-off; every value is a binary fraction, so rates, shares and the
expected counts are exact. The simulated traces run the real policy in
:mod:`tests.thread_simulator` (simulated time, no threads).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader
from prefetch._shared.stats import LoaderStats, ThreadEvent
from prefetch._threads import thread_windows
from prefetch._threads.policy import THREADS, Control, Fixed
from prefetch._threads.reports import Reports
from prefetch._threads.thread_policy import (
    DEFAULT_MAX_THREADS,
    MAX_GROWTH,
    MIN_WINDOW_ITEMS,
    START_THREADS,
    ThreadPolicy,
)
from prefetch._threads.thread_windows import (
    Window,
    available_cores,
    figure,
    needed_gain,
    rate,
    size,
)

from . import thread_simulator as sim


class Feed:
    """Scripted hand-offs for one policy on an injected clock.

    Each :meth:`batches` call hands ``n`` batches over at a steady cadence:
    one every ``every`` seconds, the loop waiting ``wait`` seconds of each,
    each batch costing the threads ``busy`` wall seconds, ``cpu`` of them on
    the CPU. The defaults describe mostly-I/O batches the loop waits for most
    of the time: 2 batches/s, a wait share of 75%, a CPU share of 1/8.
    """

    def __init__(self, policy: ThreadPolicy | None = None) -> None:
        self.policy = policy or ThreadPolicy(cores=2)
        self.now = 0.0
        self.epoch()

    def epoch(self) -> LoaderStats:
        """Start an epoch: fresh stats and fresh cumulative figures."""
        self.stats = LoaderStats(started=self.now)
        self.items, self.waited, self.busy, self.cpu = 0, 0.0, 0.0, 0.0
        self.policy.start_epoch(self.stats)
        return self.stats

    def batches(
        self,
        n: int,
        *,
        every: float = 0.5,
        wait: float = 0.375,
        busy: float = 1.0,
        cpu: float = 0.125,
        largest: int = 0,
    ) -> list[tuple[int, int]]:
        """Hand ``n`` batches over; return each change as ``(item, new count)``."""
        changes = []
        for _ in range(n):
            self.now += every
            self.items += 1
            self.waited += wait
            self.busy += busy
            self.cpu += cpu
            self.stats.items = self.items
            new = self.policy.observe(
                now=self.now,
                items=self.items,
                waited=self.waited,
                busy_seconds=self.busy,
                cpu_seconds=self.cpu,
                largest_item=largest,
            )
            if new is not None:
                changes.append((self.items, new))
        return changes

    def events(self) -> list[tuple[int, int, int]]:
        """The epoch's thread events as ``(item, old, new)``."""
        return [(e.item, e.old, e.new) for e in self.stats.thread_events]


def grown_to_eight() -> Feed:
    """A feed whose policy grew from 2 to 8 threads at item 10 (75% wait, cap 4x)."""
    feed = Feed()
    assert feed.batches(10) == [(10, 8)]
    return feed


class TestFixedThreads:
    """A fixed count never changes, behind the Control interface."""

    def test_never_changes(self) -> None:
        """Whatever the report, observe returns None and the count stays."""
        control = Fixed(THREADS, 3)
        stats = LoaderStats(started=0.0)
        control.start_epoch(stats)
        for i in range(1, 200):
            assert (
                control.observe(
                    now=i * 0.5,
                    items=i,
                    waited=i * 0.49,
                    busy_seconds=i * 1.0,
                    cpu_seconds=i * 0.01,
                    largest_item=1 << 30,
                )
                is None
            )
        assert (control.value, control.maximum, control.adaptive) == (3, 3, False)
        assert (stats.fetch_threads, stats.peak_fetch_threads, stats.thread_events) == (3, 3, [])

    def test_start_epoch_sets_stats(self) -> None:
        """Each epoch's stats get the count, now and at peak."""
        control = Fixed(THREADS, 5)
        for _ in range(2):
            stats = LoaderStats()
            control.start_epoch(stats)
            assert (stats.fetch_threads, stats.peak_fetch_threads) == (5, 5)

    def test_is_a_thread_control(self) -> None:
        """Both classes satisfy the interface the engine is written against."""
        controls: list[Control] = [Fixed(THREADS, 1), ThreadPolicy()]
        assert [c.adaptive for c in controls] == [False, True]

    @pytest.mark.parametrize(
        ("value", "error", "text"),
        [
            (0, ValueError, "Fixed(fetch_threads=...) expects an int >= 1, got 0"),
            (2.0, TypeError, "Fixed(fetch_threads=...) expects an int >= 1, got 2.0"),
            (True, TypeError, "Fixed(fetch_threads=...) expects an int >= 1, got True"),
        ],
    )
    def test_bad_count(self, value: object, error: type[Exception], text: str) -> None:
        """A count that is not an int >= 1 is refused, naming the argument and the value."""
        with pytest.raises(error) as caught:
            Fixed(THREADS, value)  # type: ignore[arg-type]
        assert str(caught.value) == text


class TestConstruction:
    """ThreadPolicy(): defaults, caps and bad arguments."""

    def test_defaults(self) -> None:
        """Start at 2 threads, at most 32, on the cores this process may use, no byte bound."""
        policy = ThreadPolicy()
        assert (policy.value, policy.maximum, policy.max_bytes) == (2, 32, None)
        assert (START_THREADS, DEFAULT_MAX_THREADS) == (2, 32)
        assert policy.cores == available_cores() == len(os.sched_getaffinity(0))
        assert policy.adaptive is True

    def test_start_capped_by_maximum(self) -> None:
        """The first count never exceeds the maximum."""
        assert ThreadPolicy(maximum=1).value == 1
        assert ThreadPolicy(maximum=4, start=8).value == 4
        assert ThreadPolicy(start=6).value == 6

    def test_drives_the_latest_epoch(self) -> None:
        """The policy adapts the epoch it last started; a fixed count adapts none."""
        policy, fixed = ThreadPolicy(), Fixed(THREADS, 2)
        first, second = LoaderStats(), LoaderStats()
        for control in (policy, fixed):
            control.start_epoch(first)
            control.start_epoch(second)
        assert (policy.drives(first), policy.drives(second)) == (False, True)
        assert (fixed.drives(first), fixed.drives(second)) == (False, False)

    def test_start_epoch_sets_stats(self) -> None:
        """A new epoch's stats get the count, now and at peak."""
        policy = ThreadPolicy(start=3)
        stats = LoaderStats()
        policy.start_epoch(stats)
        assert (stats.fetch_threads, stats.peak_fetch_threads) == (3, 3)

    @pytest.mark.parametrize("argument", ["maximum", "cores", "max_bytes", "start"])
    def test_bad_arguments(self, argument: str) -> None:
        """Each argument must be an int >= 1; the error names it and the value."""
        with pytest.raises(ValueError, match=rf"ThreadPolicy\({argument}=\.\.\.\) .* got 0$"):
            ThreadPolicy(**{argument: 0})
        with pytest.raises(TypeError, match=rf"ThreadPolicy\({argument}=\.\.\.\) .* got '4'$"):
            ThreadPolicy(**{argument: "4"})  # type: ignore[arg-type]

    def test_needed_gain(self) -> None:
        """A growth must bring 10%, or half of what the loop's waiting allowed if less."""
        assert needed_gain(0.5) == 0.1
        assert needed_gain(0.125) == 0.125 / 0.875 / 2
        assert needed_gain(1.0) == 0.1


class TestGrowth:
    """ThreadPolicy.observe on scripted hand-offs: when and how far the count grows."""

    def test_settles_before_measuring(self) -> None:
        """The first `threads` batches and then a window of 8 pass before any decision."""
        feed = Feed()
        assert feed.batches(9) == []
        assert feed.batches(1) == [(10, 8)]  # 2 settling, then 8 = MIN_WINDOW_ITEMS
        assert MIN_WINDOW_ITEMS == 8

    def test_grows_by_what_the_loop_needs(self) -> None:
        """Waiting 25%: the loop could take 4/3 as much; with headroom 1.5, 2 -> ceil(4) = 4."""
        feed = Feed()
        assert feed.batches(10, wait=0.125) == [(10, 4)]
        event = feed.stats.thread_events[0]
        assert (event.item, event.seconds, event.old, event.new) == (10, 5.0, 2, 4)
        assert event.reason == (
            "grow: the loop waited 25% of the time at 2 threads (2 batches/s); within the CPU "
            "ceiling of 16 threads (2 cores, 12% of the threads' busy time on CPU)"
        )

    def test_grows_at_most_fourfold(self) -> None:
        """Waiting 75% would call for 12 threads; one step grows by at most 4x, to 8."""
        feed = grown_to_eight()
        assert (feed.policy.value, MAX_GROWTH) == (8, 4)
        assert (feed.stats.fetch_threads, feed.stats.peak_fetch_threads) == (8, 8)

    def test_no_growth_when_the_loop_does_not_wait(self) -> None:
        """A loop waiting under 10% of the time is not held up: nothing grows; one hold says so."""
        feed = Feed()
        assert feed.batches(500, wait=0.046875) == []  # 9.4% of each 0.5 s
        assert feed.policy.value == 2
        (hold,) = feed.stats.thread_events
        assert (hold.item, hold.old, hold.new) == (10, 2, 2)
        assert hold.reason.startswith("hold: consumer-bound: the loop waited 9% of the time")

    def test_keeps_a_growth_that_pays_and_grows_on(self) -> None:
        """8 threads deliver 4x: kept, and the loop still waits, so it grows to the ceiling, 16."""
        feed = grown_to_eight()
        # settle 8 batches (to item 18), then a window of 16: the verdict at item 34
        assert feed.batches(24, every=0.125, wait=0.09375) == [(34, 16)]
        assert feed.events() == [(10, 2, 8), (34, 8, 16)]

    def test_gain_needed_scales_with_the_wait(self) -> None:
        """At 12.5% wait (at most +14% possible), 7.1% is needed, not 10%: +8.7% pays, +6.7% not."""
        for every, verdict in ((0.46, []), (0.46875, [(66, 8)])):
            feed = Feed(ThreadPolicy(cores=2, start=8))
            # settle 8, window 16: a wait share of 1/8 -> ceil(1.5 * 8 / 0.875) = 14
            assert feed.batches(24, wait=0.0625) == [(24, 14)]
            # settle 14, window 28: the verdict at item 66
            assert feed.batches(60, every=every, wait=0.0) == verdict

    def test_no_cpu_ceiling_without_cpu_figures(self) -> None:
        """Without CPU time (0 reported), only the maximum bounds growth."""
        feed = Feed(ThreadPolicy(cores=1, start=16))
        assert feed.batches(48, cpu=0.0) == [(48, 32)]
        assert "within the maximum of 32 threads" in feed.stats.thread_events[0].reason


class TestFirstReads:
    """A fresh sample-grain policy sizes its first epoch from the first reads (scripted)."""

    def test_reads_that_wait_size_it_to_keep_the_cores_busy(self) -> None:
        """Warm reads 20 ms long, 1 ms on the CPU, 2 cores: the count goes to 2 / 5% = 40 -> 32.

        The first (cold) reads are asked for, kept, and left out of the figures.
        """
        policy = ThreadPolicy(cores=2, sample_grain=True)
        stats = LoaderStats(started=10.0)
        policy.start_epoch(stats)
        assert policy.first_reads() == START_THREADS
        # cold: 45 ms each, 9 ms on the CPU (20%: it would size 10 threads)
        assert (
            policy.observe_reads(reads=2, busy_seconds=0.090, cpu_seconds=0.018, now=10.1) is None
        )
        assert stats.thread_events == []
        assert policy.first_reads() == 2 * START_THREADS  # each thread's second read
        warm = {"reads": 4, "busy_seconds": 0.130, "cpu_seconds": 0.020}
        assert policy.observe_reads(**warm, now=10.25) == 32
        (event,) = stats.thread_events
        assert (event.old, event.new) == (START_THREADS, 32)
        assert event.seconds == pytest.approx(0.25)  # from the epoch's start, at the decision
        assert event.reason.startswith("start: 2 warm reads took 20 ms each, 5% of it on the CPU")
        assert policy.first_reads() is None  # once per policy: later epochs keep what it learned

    def test_reads_of_seconds_read_in_whole_milliseconds(self) -> None:
        """Warm reads of 1.5 s each are said as '1500 ms', not '1.5e+03 ms'."""
        policy = ThreadPolicy(cores=2, sample_grain=True)
        stats = LoaderStats(started=10.0)
        policy.start_epoch(stats)
        assert policy.observe_reads(reads=2, busy_seconds=3.0, cpu_seconds=0.03, now=13.0) is None
        assert policy.observe_reads(reads=4, busy_seconds=6.0, cpu_seconds=0.06, now=16.0) == 32
        (event,) = stats.thread_events
        assert event.reason.startswith("start: 2 warm reads took 1500 ms each, 1% of it on the CPU")

    @pytest.mark.parametrize(("cpu", "expected"), [(0.020, None), (0.004, 10)])
    def test_reads_on_the_cpu_stay_within_the_cores(self, cpu: float, expected: int | None) -> None:
        """All on the CPU: no change (2 cores, 2 threads); a fifth: 10 threads."""
        policy = ThreadPolicy(cores=2, sample_grain=True)
        policy.start_epoch(LoaderStats(started=0.0))
        assert policy.observe_reads(reads=2, busy_seconds=0.1, cpu_seconds=0.1, now=0.0) is None
        figures = {"busy_seconds": 0.1 + 0.040, "cpu_seconds": 0.1 + cpu * 2}
        assert policy.observe_reads(reads=4, **figures, now=0.0) == expected

    def test_whole_batch_reads_and_fixed_counts_ask_for_none(self) -> None:
        """At the grain of batches (a read is a batch) and for a fixed count: no start rule."""
        assert ThreadPolicy(cores=2).first_reads() is None
        assert Fixed(THREADS, 4).first_reads() is None
        assert (
            Fixed(THREADS, 4).observe_reads(reads=4, busy_seconds=1.0, cpu_seconds=0.1, now=0.0)
            is None
        )


class TestRevert:
    """ThreadPolicy.observe: a growth that does not pay is undone, and the count holds."""

    def test_reverts_when_throughput_does_not_rise(self) -> None:
        """8 threads give the same 2 batches/s as 2: back to 2, with the figures."""
        feed = grown_to_eight()
        assert feed.batches(24) == [(34, 2)]
        event = feed.stats.thread_events[-1]
        assert (event.item, event.old, event.new) == (34, 8, 2)
        assert event.reason == (
            "revert: 8 threads gave 2 batches/s, +0% on 2 threads (2 batches/s; 10% needed); "
            "back to 2, held until the loop waits more"
        )

    def test_small_rise_reverts(self) -> None:
        """A rise under the 10% needed (+6.7%) is not worth the threads."""
        feed = grown_to_eight()
        assert feed.batches(24, every=0.46875, wait=0.34375) == [(34, 2)]

    def test_holds_without_oscillating(self) -> None:
        """After a revert, steady conditions never probe again, and the hold is said once."""
        feed = grown_to_eight()
        feed.batches(24)
        assert feed.batches(2000) == []
        assert feed.events() == [(10, 2, 8), (34, 8, 2)]  # the revert says why; no hold event
        for _ in range(3):
            stats = feed.epoch()
            assert feed.batches(300) == []
            assert [(e.old, e.new) for e in stats.thread_events] == [(2, 2)]
        assert stats.thread_events[0].reason == (
            "hold: 8 threads gave no more throughput than 2 (2 batches/s, the loop waiting 75%); "
            "now 2 batches/s, waiting 75%"
        )

    def test_reprobes_when_the_loop_waits_more(self) -> None:
        """A wait share 10 points above the one before the failed probe tries again."""
        feed = grown_to_eight()
        feed.batches(24 + 8)  # the revert at item 34, 8 batches settle
        assert feed.batches(8) == []  # the first window at the held count: backing off
        assert feed.batches(8, wait=0.4375) == [(58, 8)]  # 87.5%: 12.5 points more
        assert "more than the 75% seen since 8 did not pay" in feed.stats.thread_events[-1].reason

    def test_backs_off_after_a_failed_probe(self) -> None:
        """After the first failed probe, 2 windows at the held count pass before a re-probe."""
        feed = grown_to_eight()
        feed.batches(24 + 8)
        assert feed.batches(8, wait=0.4375) == []  # window 1: the rise is not yet evidence
        assert feed.batches(8, wait=0.4375) == [(58, 8)]  # window 2

    def test_noise_raises_the_bar(self) -> None:
        """The bar is the highest wait share seen at the held count: a rise must clear it by 10."""
        for last, verdict in ((0.453125, []), (0.46875, [(74, 8)])):
            feed = grown_to_eight()
            feed.batches(24 + 8 + 8)  # the revert at item 34 from 75%, settling, back-off
            assert feed.batches(8, wait=0.40625) == []  # 81.25%: the bar
            assert feed.batches(8, wait=0.375) == []  # 75%: the bar stays
            # 90.6% (15.6 points above 75%, but 9.4 above the bar) holds; 93.75% probes
            assert feed.batches(8, wait=last) == verdict

    def test_no_reprobe_on_a_throughput_drop(self) -> None:
        """A slow stretch at the held count (half the rate, same wait share) does not re-probe."""
        feed = grown_to_eight()
        feed.batches(24 + 8)
        assert feed.batches(100, every=1.0, wait=0.75) == []

    def test_a_failed_reprobe_raises_the_bar(self) -> None:
        """A re-probe that fails again holds from the higher wait, and backs off 4 windows."""
        feed = grown_to_eight()
        feed.batches(24 + 8 + 8)
        assert feed.batches(8, wait=0.4375) == [(58, 8)]  # 87.5%: re-probe
        assert feed.batches(24, wait=0.4375) == [(82, 2)]  # no gain: revert again
        assert feed.batches(400, wait=0.4375) == []  # 87.5% is the bar now
        feed = grown_to_eight()
        feed.batches(24 + 8 + 8)
        feed.batches(8 + 24, wait=0.4375)  # the same two probes
        assert feed.batches(8 + 3 * 8, wait=0.5) == []  # 100%, but windows 1-3: backing off
        assert feed.batches(8, wait=0.5) == [(122, 8)]  # window 4

    def test_pending_probe_carries_over(self) -> None:
        """An epoch that ends before the verdict leaves it to the next epoch's first window."""
        feed = grown_to_eight()
        feed.batches(5)
        stats = feed.epoch()
        assert stats.fetch_threads == 8
        assert feed.batches(24) == [(24, 2)]  # settle 8, window 16: 2 batches/s, no gain
        assert [(e.old, e.new) for e in stats.thread_events] == [(8, 2)]


class TestBounds:
    """ThreadPolicy.observe: the CPU ceiling, the maximum and max_bytes."""

    def test_cpu_ceiling_holds_once_per_epoch(self) -> None:
        """CPU-bound batches on 2 cores: 2 threads is the ceiling; the hold is said once an epoch"""
        feed = Feed()
        for _ in range(3):
            assert feed.batches(500, cpu=1.0) == []
            assert [(e.old, e.new) for e in feed.stats.thread_events] == [(2, 2)]
            assert feed.stats.thread_events[0].reason == (
                "hold: the loop waited 75% of the time; at the CPU ceiling of 2 threads "
                "(2 cores, 100% of the threads' busy time on CPU)"
            )
            feed.epoch()

    def test_cpu_ceiling_caps_growth(self) -> None:
        """Threads on the CPU half their busy time on 3 cores: at most 6 threads."""
        feed = Feed(ThreadPolicy(cores=3))
        assert feed.batches(10, cpu=0.5) == [(10, 6)]

    def test_maximum(self) -> None:
        """Growth stops at the maximum, and the hold names it."""
        feed = Feed(ThreadPolicy(cores=2, maximum=3))
        assert feed.batches(10) == [(10, 3)]
        assert feed.batches(3 + 8, every=0.375, wait=0.25) == []  # +33%: kept
        assert feed.events()[-1] == (21, 3, 3)
        assert feed.stats.thread_events[-1].reason == (
            "hold: the loop waited 67% of the time; at the maximum of 3 threads"
        )

    def test_max_bytes_caps_growth(self) -> None:
        """Each thread holds a batch in flight: 1 KiB of 256-byte batches allows 4 threads."""
        feed = Feed(ThreadPolicy(cores=2, max_bytes=1024))
        assert feed.batches(10, largest=256) == [(10, 4)]
        assert feed.stats.thread_events[0].reason.endswith(
            "within max_bytes (1 KiB) holds 4 batches of 256 bytes in flight"
        )

    def test_larger_batch_cuts_at_once(self) -> None:
        """A batch too large for the threads' share of max_bytes cuts the count at that hand-off."""
        feed = Feed(ThreadPolicy(cores=2, max_bytes=1024, start=4))
        assert feed.batches(3, largest=256) == []
        assert feed.batches(1, largest=1000) == [(4, 1)]
        assert feed.stats.thread_events[-1].reason == (
            "cut: max_bytes (1 KiB) holds 1 batch of 1000 bytes in flight"
        )
        assert feed.batches(500, largest=1000) == []  # hold at max_bytes, never above
        assert feed.events()[-1] == (16, 1, 1)  # settle 4 (to item 8), a window of 8


class TestEpochs:
    """ThreadPolicy.start_epoch: what carries over to the next epoch of the same loader."""

    def test_count_carries_over(self) -> None:
        """The next epoch starts at the count learned, and its stats say so."""
        feed = grown_to_eight()
        feed.batches(24, every=0.125, wait=0.0)  # kept; the loop no longer waits
        stats = feed.epoch()
        assert (stats.fetch_threads, stats.peak_fetch_threads, stats.thread_events) == (8, 8, [])
        assert feed.batches(100, every=0.125, wait=0.0) == []

    def test_events_go_to_the_current_epoch(self) -> None:
        """Events land in the stats of the epoch they happen in, timed from its start."""
        feed = Feed()
        first = feed.stats
        feed.batches(4)  # settle 2, then 2 of a window
        second = feed.epoch()
        assert feed.batches(8) == [(8, 8)]  # settle 2, then the 6 the window lacked
        assert first.thread_events == []
        assert second.thread_events[0] == ThreadEvent(8, 4.0, 2, 8, second.thread_events[0].reason)

    def test_window_spans_epochs(self) -> None:
        """A window an epoch leaves unfinished goes on after the next epoch settles."""
        feed = Feed()
        assert feed.batches(6) == []  # settle 2, then 4 of a window of 8
        feed.epoch()
        assert feed.batches(5) == []  # settle 2, then 3 more
        assert feed.batches(1) == [(6, 8)]  # 4 + 4: the window is full

    def test_short_epochs_still_decide(self) -> None:
        """Epochs of 5 batches, shorter than any window, still grow the count."""
        feed = Feed()
        for _ in range(4):
            feed.epoch()
            feed.batches(5)
        assert feed.policy.value == 8


def fixed_best(workload: sim.Workload, step: float) -> float:
    """The best steady rate of any fixed count from 1 to the maximum (after item 100)."""
    return max(sim.simulate(workload, step, n).rate(100) for n in range(1, DEFAULT_MAX_THREADS + 1))


class TestSimulator:
    """The simulator itself, on cases worked out by hand."""

    def test_rates_follow_the_knee(self) -> None:
        """Fixed counts: throughput grows with threads up to the knee, then stays."""
        workload = sim.Workload([0.125] * 400, cpu=1.0, cores=4)
        rates = [sim.simulate(workload, 0.0, n).rate(100) for n in (1, 2, 4, 8)]
        assert rates == pytest.approx([8.0, 16.0, 32.0, 32.0], rel=0.02)

    def test_loop_bound(self) -> None:
        """A loop slower than the loader sets the pace and never waits after the start."""
        run = sim.simulate(sim.Workload([0.125] * 100, cpu=0.0), 0.25, 2)
        assert run.rate(10) == 4.0
        assert run.waited == 0.125

    def test_reports_cumulative_figures(self) -> None:
        """The first report: 4 threads on a 2-thread knee take 1 s (stretched 2x) per batch."""
        workload = sim.Workload([0.5] * 64, cpu=0.5, cores=1)
        assert (workload.knee, workload.stretch(4), workload.rate(4)) == (2.0, 2.0, 4.0)
        reports: list[dict[str, float]] = []

        class Recorder(ThreadPolicy):
            def observe(self, **report: float) -> int | None:
                reports.append(report)
                return None

        sim.simulate(workload, 0.0, Recorder(start=4))
        assert reports[0] == {
            "now": 1.0,
            "items": 1,
            "waited": 1.0,
            "busy_seconds": 4.0,  # the first four batches, 1 s each
            "cpu_seconds": 1.0,  # 0.25 s each: half of 0.5 s
            "largest_item": 0,
        }
        assert len(reports) == 64
        assert reports[-1]["items"] == 64


class TestSimulatedTraces:
    """The real policy on simulated loaders whose throughput rises with threads up to a knee."""

    @pytest.mark.parametrize(
        ("cpu", "cores", "io_limit", "knee"),
        [
            (1.0, 2, math.inf, 2),  # CPU-bound on 2 cores
            (1.0, 16, math.inf, 16),  # CPU-bound on 16 cores
            (1 / 12, 2, math.inf, 24),  # mostly I/O: 12x the cores
            (0.05, 2, 6, 6),  # storage serves 6 reads at a time
            (0.05, 2, math.inf, 40),  # beyond the maximum of 32
        ],
    )
    def test_reaches_the_knee(self, cpu: float, cores: int, io_limit: float, knee: int) -> None:
        """From batch 100 on auto gives >= 0.9x the best fixed count; never above the ceiling."""
        for spread in (0.0, 0.5):
            workload = sim.Workload(sim.jittered(600, 0.1, spread, 7), cpu, cores, io_limit)
            assert workload.knee == knee
            run = sim.simulate(workload, 0.001, ThreadPolicy(cores=cores))
            assert run.rate(100) >= 0.9 * fixed_best(workload, 0.001)
            ceiling = min(DEFAULT_MAX_THREADS, round(cores / cpu))
            assert max(run.counts) <= ceiling
            assert max(run.counts[100:]) >= min(knee, DEFAULT_MAX_THREADS)

    def test_gil_bound_reverts(self) -> None:
        """Pure-Python batches (one thread runs at a time) look I/O-bound; the probe reverts."""
        workload = sim.Workload([0.1] * 300, cpu=1.0, cores=1)  # the GIL: one core
        run = sim.simulate(workload, 0.001, ThreadPolicy(cores=2))
        assert [(e.old, e.new) for e in run.stats.thread_events] == [(2, 4), (4, 2)]
        assert run.counts[-1] == 2

    def test_loop_bound_does_not_grow(self) -> None:
        """A loop slower than two threads deliver never waits, so the count stays at 2."""
        workload = sim.Workload(sim.jittered(400, 0.1, 0.5, 3), cpu=0.05)
        run = sim.simulate(workload, 0.2, ThreadPolicy(cores=2))
        assert run.counts == [2] * 400
        assert [(e.old, e.new) for e in run.stats.thread_events] == [(2, 2)]
        assert run.stats.thread_events[0].reason.startswith("hold: consumer-bound")

    def test_grows_only_to_what_the_loop_takes(self) -> None:
        """A loop taking 50 batches/s: 2 threads give 20, so auto grows once and stops waiting."""
        workload = sim.Workload([0.1] * 400, cpu=0.05)
        run = sim.simulate(workload, 0.02, ThreadPolicy(cores=2))
        events = run.stats.thread_events
        assert [(e.old, e.new) for e in events] == [(2, 8), (8, 8)]  # then the loop is the limit
        assert events[1].reason.startswith("hold: consumer-bound")
        assert run.rate(100) == pytest.approx(50.0)

    def test_carries_over_across_epochs(self) -> None:
        """A short first epoch learns the count; the next epochs start there and stay."""
        workload = sim.Workload([0.1] * 60, cpu=1 / 12)
        policy = ThreadPolicy(cores=2)
        first = sim.simulate(workload, 0.001, policy)
        assert first.counts[-1] == 24
        holds = []
        for _ in range(4):
            run = sim.simulate(workload, 0.001, policy)
            assert run.counts == [24] * 60
            holds += [(e.old, e.new) for e in run.stats.thread_events]
        assert holds == [(24, 24)] * len(holds) != []  # at the CPU ceiling

    def test_max_bytes_bounds_the_count(self) -> None:
        """Batches of 64 MiB under a 1 GiB max_bytes: never more than 16 threads."""
        workload = sim.Workload([0.1] * 300, cpu=0.05)
        policy = ThreadPolicy(cores=2, max_bytes=1 << 30)
        run = sim.simulate(workload, 0.001, policy, largest_item=64 << 20)
        assert max(run.counts) == 16

    def test_guide_trace(self) -> None:
        """The trace and the figures the guide shows are what this simulation gives."""
        workload = sim.Workload(sim.jittered(400, 0.1, 0.5, 5), cpu=0.05, cores=2, io_limit=6)
        run = sim.simulate(workload, 0.005, ThreadPolicy(cores=2))
        guide = (Path(__file__).parent.parent / "docs" / "guide.rst").read_text()
        for e in run.stats.thread_events:
            line = f"item {e.item} ({e.seconds:.2f} s): {e.old} -> {e.new}, {e.reason}"
            assert f"   {line}\n" in guide
        assert [(e.old, e.new) for e in run.stats.thread_events] == [(2, 8), (8, 32), (32, 8)]
        rates = [f"{sim.simulate(workload, 0.005, n).rate(100):.1f}" for n in (2, 4, 6, 8, 32)]
        figures = "{} (2 threads), {} (4), {} (6), {} (8) and {} (32)".format(*rates)
        assert figures in " ".join(guide.split())
        cpu_bound = sim.Workload(workload.seconds, cpu=1.0, cores=2)
        (hold,) = sim.simulate(cpu_bound, 0.005, ThreadPolicy(cores=2)).stats.thread_events
        assert (hold.item, hold.old, hold.new) == (10, 2, 2)
        assert hold.reason.split("; ")[1] in " ".join(guide.split())

    def test_steady_loader_settles(self) -> None:
        """Over a long epoch of a loader with a knee, the count changes a few times, then never."""
        workload = sim.Workload(sim.jittered(5000, 0.1, 0.5, 11), cpu=0.05, io_limit=6)
        run = sim.simulate(workload, 0.001, ThreadPolicy(cores=2))
        changes = [e for e in run.stats.thread_events if e.old != e.new]
        assert len(changes) <= 4
        assert changes[-1].item < 200


@st.composite
def workloads(draw: st.DrawFn) -> tuple[sim.Workload, float]:
    """A loader with a knee, and a loop step from nothing to slower than the loader."""
    n = draw(st.integers(30, 300))
    seconds = draw(st.floats(0.01, 1.0))
    spread = draw(st.floats(0.0, 0.9))
    cpu = draw(st.floats(0.02, 1.0))
    cores = draw(st.integers(1, 16))
    io_limit = draw(st.one_of(st.just(math.inf), st.floats(1.0, 64.0)))
    step = draw(st.floats(0.0, 2.0)) * seconds
    workload = sim.Workload(
        sim.jittered(n, seconds, spread, draw(st.integers(0, 99))), cpu, cores, io_limit
    )
    return workload, step


class Reads(Dataset[torch.Tensor]):
    """Samples that take 5 ms each, like reads from storage (the sleep releases the GIL)."""

    def __len__(self) -> int:
        return 160

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.005)
        return torch.full((2,), float(index))


class TestWithBackgroundLoader:
    """BackgroundLoader(fetch_threads="auto") runs the policy on real threads."""

    def test_auto_grows_for_a_waiting_loop(self) -> None:
        """A loop that only waits for I/O-bound batches gets more threads, the same batches."""
        torch.manual_seed(0)
        plain = [batch.tolist() for batch in DataLoader(Reads(), batch_size=4, shuffle=True)]
        torch.manual_seed(0)
        loader = BackgroundLoader(
            DataLoader(Reads(), batch_size=4, shuffle=True), fetch_threads="auto"
        )
        assert [batch.tolist() for batch in loader] == plain
        stats = loader.stats
        events = stats.thread_events
        assert events and events[0].old == 2 < events[0].new
        assert events[0].reason.startswith("start: 2 warm reads took")  # sized by the reads
        assert 0.0 <= events[0].seconds <= stats.elapsed_seconds  # within the epoch
        for before, after in itertools.pairwise(events):
            assert after.old == before.new
        assert stats.fetch_threads == events[-1].new
        assert stats.peak_fetch_threads == max(e.new for e in events)

    def test_the_policy_hears_of_the_first_reads_as_they_end(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The first two reads (one a thread) reach the policy before any other read ends,
        although a thread adds its reads to the figures only every eight otherwise."""
        heard, release = threading.Event(), threading.Event()
        waits: list[bool] = []
        reads_done = Reports.reads_done

        def spy(self: Reports, engine: Any) -> None:
            heard.set()
            release.set()
            reads_done(self, engine)

        monkeypatch.setattr(Reports, "reads_done", spy)

        class Held(Dataset[int]):
            def __len__(self) -> int:
                return 8

            def __getitem__(self, index: int) -> int:
                if index >= 2:
                    waits.append(release.wait(10.0))  # until the policy heard of reads 0 and 1
                return index

        loader = BackgroundLoader(DataLoader(Held(), batch_size=4), fetch_threads="auto")
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert heard.is_set() and waits == [True] * 6


def hold_kind(reason: str) -> str:
    """Which bound or verdict a hold's reason names."""
    kinds = (
        "CPU ceiling",
        "the maximum",
        "max_bytes",
        "gave no more throughput",
        "consumer-bound",
        "batches of an epoch",
    )
    (kind,) = [kind for kind in kinds if kind in reason]
    return kind


class TestProperties:
    """Invariants of the policy on random simulated loaders (Hypothesis)."""

    @settings(max_examples=60, deadline=None)
    @given(workloads(), st.integers(1, DEFAULT_MAX_THREADS), st.integers(1, 3))
    def test_invariants(self, case: tuple[sim.Workload, float], maximum: int, epochs: int) -> None:
        """Counts within bounds, events explain every change, holds said once, probes back off."""
        workload, step = case
        policy = ThreadPolicy(cores=workload.cores, maximum=maximum)
        count = policy.value
        reverts = 0
        for _ in range(epochs):
            start = policy.value
            run = sim.simulate(workload, step, policy)
            assert all(1 <= c <= maximum for c in run.counts)
            if workload.io_limit == math.inf:  # no I/O contention: the CPU share is exact
                ceiling = max(START_THREADS, math.floor(workload.cores / workload.cpu + 0.5))
                assert max(run.counts) <= min(maximum, ceiling)
            events = run.stats.thread_events
            changes = [e for e in events if e.old != e.new]
            holds = [hold_kind(e.reason) for e in events if e.old == e.new]
            assert len(holds) == len(set(holds))
            for event in changes:
                assert event.old == count
                count = event.new
            assert count == run.counts[-1] == run.stats.fetch_threads == policy.value
            assert run.stats.peak_fetch_threads == max([start, *run.counts])
            reverts += sum(e.reason.startswith("revert") for e in changes)
        # after the k-th failed probe the next one waits 2**k windows: k <= log2(windows + 2)
        windows = epochs * len(workload.seconds) / MIN_WINDOW_ITEMS
        assert reverts <= math.log2(windows + 2)


class TestAvailableCores:
    """The cores the policies size for: the CPU affinity where the OS has one, else the count."""

    def test_the_affinity_where_there_is_one(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """One core in the affinity of a machine of 8: 1."""
        fake = types.SimpleNamespace(sched_getaffinity=lambda pid: {pid + 5}, cpu_count=lambda: 8)
        monkeypatch.setattr(thread_windows, "os", fake)
        assert available_cores() == 1

    @pytest.mark.parametrize(("count", "cores"), [(3, 3), (None, 1)])
    def test_else_the_cpu_count_or_one(
        self, monkeypatch: pytest.MonkeyPatch, count: int | None, cores: int
    ) -> None:
        """Without an affinity call: ``os.cpu_count()``, or 1 where it is unknown."""
        monkeypatch.setattr(thread_windows, "os", types.SimpleNamespace(cpu_count=lambda: count))
        assert available_cores() == cores


class TestSizeInReasons:
    """Byte counts in the events' reasons: the largest binary unit that fits, 3 digits."""

    @pytest.mark.parametrize(
        ("nbytes", "text"),
        [
            (512, "512 bytes"),
            (1 << 10, "1 KiB"),
            (3 << 19, "1.5 MiB"),
            (5 << 30, "5 GiB"),
            ((1 << 20) - 1, "1024 KiB"),
            (1000 << 10, "1000 KiB"),
            (2000 << 30, "2000 GiB"),
        ],
    )
    def test_unit_and_digits(self, nbytes: int, text: str) -> None:
        """Each unit from its power of two up; below 1 KiB, bytes; never an exponent."""
        assert size(nbytes) == text

    @pytest.mark.parametrize(
        ("value", "text"),
        [(0.04567, "0.0457"), (12.34, "12.3"), (999.4, "999"), (999.5, "1000"), (2.5e6, "2500000")],
    )
    def test_figures_have_three_digits_and_no_exponent(self, value: float, text: str) -> None:
        """Rates and times in reasons: three significant digits, whole numbers from 1000 up."""
        assert figure(value) == text

    def test_a_fast_window_reads_in_batches_per_second(self) -> None:
        """A window of 5000 batches in a second is '5000 batches/s', not '5e+03 batches/s'."""
        assert rate(Window(1.0, 5000, 0.0, 0.0, 0.0)) == "5000 batches/s"
