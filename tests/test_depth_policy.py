"""DepthPolicy on scripted hand-offs: exact decisions on an injected clock, no threads.

Each test feeds a bare :class:`~prefetch._threads.depth_policy.DepthPolicy` the
numbers ``BackgroundIterator._adapt`` would report; every value is a binary
fraction, so means, ratios and the expected depths are exact.
"""

from __future__ import annotations

from typing import Any

from prefetch._shared.stats import DepthEvent, LoaderStats
from prefetch._threads.depth_policy import (
    CUT_SAMPLES,
    DEFAULT_MAX_DEPTH,
    HANDOFF_SECONDS,
    MIN_SAMPLES,
    MIN_WAIT_STEPS,
    SHRINK_WINDOW,
    SLOWER_HEADROOM,
    START_DEPTH,
    DepthPolicy,
)

from .depth_reasons import NEVER_FULL, SLOWER


class Feed:
    """Scripted hand-offs for one ``DepthPolicy`` on an injected clock.

    Each :meth:`hand_off` is one item handed to the loop: the clock moves by
    ``step + waited`` and the producer's running totals grow by what the call
    says, as ``BackgroundIterator._adapt`` would report them. The defaults
    describe a producer that keeps up (0.25 s per item against 1 s steps) and
    sits blocked on a full buffer for the rest of each step (0.75 s). All the
    numbers are binary fractions, so every mean and ratio is exact.
    """

    def __init__(self, policy: DepthPolicy | None = None) -> None:
        self.policy = policy or DepthPolicy(maximum=DEFAULT_MAX_DEPTH, max_bytes=None)
        self.now = 0.0
        self.epoch()

    def epoch(self) -> LoaderStats:
        """Start an epoch: fresh stats and fresh producer totals (a new Engine)."""
        self.stats = LoaderStats(started=self.now)
        self.fetched, self.busy, self.blocked = 0, 0.0, 0.0
        self.policy.start_epoch(self.stats)
        return self.stats

    def hand_off(
        self,
        *,
        step: float = 1.0,
        waited: float = 0.0,
        ready: int = 2,
        fetched: int = 1,
        source: float = 0.25,
        blocked: float = 0.75,
        largest: int = 0,
    ) -> int | None:
        """Hand one item over; ``fetched`` more items took ``source`` seconds each."""
        self.now += step + waited
        self.fetched += fetched
        self.busy += source * fetched
        self.blocked += blocked
        self.stats.items += 1  # the iterator counts the item before it reports it
        return self.policy.observe(
            now=self.now,
            step=step,
            waited=waited,
            ready=ready,
            fetched=self.fetched,
            busy_seconds=self.busy,
            blocked_seconds=self.blocked,
            largest_item=largest,
        )

    def warm_up(self, n: int = 8, **kwargs: Any) -> None:
        """The epoch's first hand-off, then ``n - 1`` with two items ready: no decision."""
        for _ in range(n):
            assert self.hand_off(**kwargs) is None
        assert self.stats.depth_events == []

    def burst(self, steps: float, **kwargs: Any) -> int | None:
        """A hand-off the loop waited ``steps`` one-second steps for."""
        kwargs.setdefault("blocked", 0.0)
        return self.hand_off(waited=steps, ready=0, **kwargs)

    def ready(self, count: int, n: int) -> list[int | None]:
        """``n`` hand-offs with ``count`` items ready each time."""
        return [self.hand_off(ready=count) for _ in range(n)]


def grown_to_8() -> Feed:
    """A policy grown from 2 to 8 by a 6-step wait (see TestGrowOnWait)."""
    feed = Feed()
    feed.warm_up()
    assert feed.burst(6.0) == 8
    return feed


class TestFirstItem:
    """The first item of an epoch never changes the depth: nothing could be ready before it."""

    def test_first_wait_of_a_new_policy(self) -> None:
        """A long wait on the first item, with a blocked producer, is ignored."""
        feed = Feed()
        assert feed.burst(100.0, blocked=50.0) is None
        assert feed.policy.value == START_DEPTH
        assert feed.stats.depth_events == []

    def test_first_wait_of_a_later_epoch(self) -> None:
        """After learning, the first item of the next epoch is still ignored, the second is not."""
        feed = grown_to_8()
        feed.epoch()
        assert feed.burst(6.0, blocked=50.0) is None
        assert feed.stats.depth_events == []
        assert feed.burst(6.0, blocked=50.0) == 14

    def test_first_counters_are_a_baseline(self) -> None:
        """The producer's totals at the first hand-off are not learned as one item's time."""
        feed = Feed()
        # 5 items and 100 s at the first hand-off: counted, the mean would be
        # ~8 s/item and the wait below could grow by the doubling floor only (to 4).
        feed.hand_off(fetched=5, source=20.0)
        feed.warm_up(7)
        assert feed.burst(6.0) == 8


class TestGrowOnWait:
    """A wait that a deeper buffer would have absorbed grows the depth."""

    def test_grows_by_the_steps_waited(self) -> None:
        """Waiting 6 steps grows 2 -> 8, with the wait and both means in the reason."""
        feed = Feed()
        feed.warm_up()
        assert feed.burst(6.0) == 8
        assert feed.policy.value == feed.stats.depth == feed.stats.peak_depth == 8
        (event,) = feed.stats.depth_events
        assert event == DepthEvent(
            item=9,
            seconds=15.0,
            old=2,
            new=8,
            reason=(
                "grow: waited 6.0 steps; the producer had spare time for 24.0 more items "
                "(250 ms/item vs 1 s/step)"
            ),
        )

    def test_a_loop_with_zero_step_time_grows_within_the_maximum(self) -> None:
        """Steps that take no time (infinitely many steps waited) grow the depth, never raise."""
        feed = Feed()
        feed.warm_up(step=0.0)
        new = feed.hand_off(step=0.0, waited=1.0, ready=0, blocked=0.0, source=0.0)
        assert new is not None and 2 < new <= DEFAULT_MAX_DEPTH
        assert feed.policy.value == new

    def test_partial_steps_round_up(self) -> None:
        """A wait of 4.5 steps grows by 5."""
        feed = Feed()
        feed.warm_up()
        assert feed.burst(4.5) == 7

    def test_grows_at_least_by_half(self) -> None:
        """A wait of one step still grows the depth by half: the next burst may be longer."""
        feed = grown_to_8()
        assert feed.hand_off(blocked=2.0) is None  # refilled, then blocked: room for 8 more
        assert feed.burst(1.0) == 12

    def test_capped_by_what_the_producer_could_make(self) -> None:
        """Growth by the wait is capped by the items the producer had time for while blocked."""
        feed = Feed()
        feed.warm_up(blocked=0.125)  # blocked 1 s in all: at 0.25 s/item, 4 items
        assert feed.burst(6.0) == 6

    def test_capped_by_one_spare_item(self) -> None:
        """If the producer could have made only one more item, the depth grows by one."""
        feed = Feed()
        feed.warm_up(blocked=0.03125)  # blocked 0.25 s in all: one item
        assert feed.burst(6.0) == 3

    def test_less_than_one_item_holds(self) -> None:
        """Blocked for less than one item's time is no evidence: a hold, not a grow."""
        feed = Feed()
        feed.warm_up(blocked=0.029296875)  # 0.234375 s in all: 0.9375 of an item
        assert feed.burst(6.0) is None
        assert feed.stats.depth_events[-1].reason == NEVER_FULL

    def test_capped_by_max_depth(self) -> None:
        """Growth stops at max_depth; the next wait is a hold at max_depth, once."""
        feed = Feed(DepthPolicy(maximum=5, max_bytes=None))
        feed.warm_up()
        assert feed.burst(6.0) == 5
        assert feed.hand_off() is None
        assert feed.burst(6.0) is None
        assert feed.hand_off() is None
        assert feed.burst(6.0) is None
        assert feed.policy.value == 5
        assert [(e.old, e.new, e.reason) for e in feed.stats.depth_events[1:]] == [
            (5, 5, "hold: at max_depth (5)")
        ]

    def test_capped_by_max_bytes(self) -> None:
        """Growth stops at max_bytes // largest item; the next wait is a hold saying so."""
        feed = Feed(DepthPolicy(maximum=32, max_bytes=1000))
        feed.warm_up(largest=300)
        assert feed.burst(6.0, largest=300) == 3
        assert feed.hand_off(largest=300) is None
        assert feed.burst(6.0, largest=300) is None
        assert feed.stats.depth_events[-1] == DepthEvent(
            11, 23.0, 3, 3, "hold: at max_bytes (3 items of 300 bytes)"
        )

    def test_item_larger_than_max_bytes_holds(self) -> None:
        """An item larger than max_bytes allows one item: the depth does not grow."""
        feed = Feed(DepthPolicy(maximum=32, max_bytes=1000))
        feed.warm_up(largest=5000)
        assert feed.burst(6.0, largest=5000) is None
        assert feed.policy.value == 2
        assert feed.stats.depth_events[-1].reason == "hold: at max_bytes (1 items of 5000 bytes)"

    def test_unknown_item_size_is_not_capped_by_bytes(self) -> None:
        """With the largest item unknown (0 bytes) only max_depth caps growth."""
        feed = Feed(DepthPolicy(maximum=32, max_bytes=1000))
        feed.warm_up()
        assert feed.burst(6.0, largest=0) == 8

    def test_max_bytes_looser_than_max_depth(self) -> None:
        """When max_bytes allows more items than max_depth, max_depth is the cap."""
        feed = Feed(DepthPolicy(maximum=32, max_bytes=1000))
        feed.warm_up(blocked=2.0, largest=10)  # 100 items would fit; 64 could be made
        assert feed.burst(40.0, largest=10) == 32


class TestNearMiss:
    """Taking the last ready item grows the depth by half, once per draw-down."""

    def test_grows_by_half(self) -> None:
        """2 -> 3 -> 5 -> 8: each near miss after a refill adds half, rounded up."""
        feed = Feed()
        feed.warm_up()
        assert feed.hand_off(ready=1) == 3
        assert feed.hand_off(ready=1) == 5
        assert feed.hand_off(ready=1) == 8
        assert feed.stats.depth_events[0].reason == (
            "grow: took the last ready item; the producer had spare time for 27.0 more items "
            "(250 ms/item vs 1 s/step)"
        )

    def test_capped_by_max_depth(self) -> None:
        """Half of 3 is 2, but max_depth=4 caps the growth at 4."""
        feed = Feed(DepthPolicy(maximum=4, max_bytes=None))
        feed.warm_up()
        assert feed.hand_off(ready=1) == 3
        assert feed.hand_off(ready=1) == 4

    def test_once_per_draw_down(self) -> None:
        """A second near miss with no blocked time since the first is a hold, not a grow."""
        feed = Feed()
        feed.warm_up()
        assert feed.hand_off(ready=1) == 3
        assert feed.hand_off(ready=1, blocked=0.0) is None
        assert feed.hand_off(ready=1, blocked=0.0) is None
        assert [(e.old, e.new, e.reason) for e in feed.stats.depth_events[1:]] == [
            (3, 3, NEVER_FULL)
        ]
        assert feed.hand_off(ready=1, blocked=0.5) == 5


class TestNoGrowth:
    """Waits that a deeper buffer would not have absorbed leave the depth alone."""

    def test_short_wait_is_noise(self) -> None:
        """A wait under MIN_WAIT_STEPS does nothing; one of exactly MIN_WAIT_STEPS grows."""
        feed = Feed()
        feed.warm_up()
        assert feed.burst(MIN_WAIT_STEPS * 0.9, blocked=0.75) is None
        assert feed.policy.value == 2
        assert feed.stats.depth_events == []
        assert feed.burst(MIN_WAIT_STEPS, blocked=0.75) == 3

    def test_too_few_steps(self) -> None:
        """Before MIN_SAMPLES steps are averaged, a wait does nothing; at MIN_SAMPLES it grows."""
        early = Feed()  # two items fetched per step: enough fetches, too few steps
        early.warm_up(MIN_SAMPLES - 1, fetched=2)  # the first hand-off is not a step
        assert early.burst(6.0, fetched=2) is None
        assert early.stats.depth_events == []
        enough = Feed()
        enough.warm_up(MIN_SAMPLES, fetched=2)
        assert enough.burst(6.0, fetched=2) == 8

    def test_too_few_fetches(self) -> None:
        """With steps averaged but under MIN_SAMPLES items fetched, a wait does nothing."""
        feed = Feed()
        feed.warm_up(fetched=0)
        assert feed.burst(6.0, fetched=MIN_SAMPLES - 1) is None
        assert feed.policy.value == 2

    def test_slower_producer_holds(self) -> None:
        """A producer slower on average that never got ahead holds, with the means in the reason."""
        feed = Feed()
        feed.warm_up(source=1.25, blocked=0.0)
        assert feed.burst(6.0, source=1.25) is None
        assert feed.policy.value == 2
        assert feed.stats.depth_events == [DepthEvent(9, 15.0, 2, 2, SLOWER)]

    def test_slower_producer_that_got_ahead_grows_by_the_headroom(self) -> None:
        """Slower on average but sometimes ahead: the depth grows by SLOWER_HEADROOM at most.

        Blocked 6 s in all at 1.25 s per item, 4.8 more items could have been
        ready; the 6-step wait would grow the depth by 4, but a producer slower
        on average gets 2 items of headroom, and the next wait is a hold.
        """
        feed = Feed()
        feed.warm_up(source=1.25)
        assert feed.burst(6.0, source=1.25) == START_DEPTH + SLOWER_HEADROOM == 4
        assert feed.hand_off(source=1.25, blocked=2.0) is None
        assert feed.burst(6.0, source=1.25) is None
        assert feed.stats.depth_events[-1] == DepthEvent(
            11,
            23.0,
            4,
            4,
            "hold: at 4 items: the producer is slower on average (1.25 s/item vs 1 s/step); "
            "no buffer makes up a throughput deficit",
        )

    def test_depth_grown_while_fast_is_cut_back(self) -> None:
        """Grown to 8 while the producer was fast; once it is slower on average, cut to 4."""
        feed = grown_to_8()
        for _ in range(CUT_SAMPLES):
            assert feed.hand_off(source=2.0, blocked=0.0) is None
        assert feed.burst(2.0, source=2.0) == START_DEPTH + SLOWER_HEADROOM
        assert feed.stats.depth_events[-1] == DepthEvent(
            74,
            82.0,
            8,
            4,
            "shrink: the producer is slower on average (1.808 s/item vs 1 s/step); "
            "no buffer makes up a throughput deficit",
        )

    def test_slower_hold_recorded_once_per_epoch(self) -> None:
        """The hold for a slower producer is recorded once per epoch, again in the next."""
        feed = Feed()
        feed.warm_up(source=1.25, blocked=0.0)
        for _ in range(3):
            assert feed.burst(6.0, source=1.25) is None
            assert feed.hand_off(source=1.25, blocked=0.0) is None
        assert [e.reason for e in feed.stats.depth_events] == [SLOWER]
        stats = feed.epoch()
        feed.hand_off(source=1.25, blocked=0.0)
        for _ in range(2):
            assert feed.burst(6.0, source=1.25) is None
        assert [(e.old, e.new, e.reason) for e in stats.depth_events] == [(2, 2, SLOWER)]

    def test_never_full_holds(self) -> None:
        """A producer that never blocked since the buffer last ran dry holds, recorded once."""
        feed = Feed()
        feed.warm_up(blocked=0.0)
        assert feed.burst(6.0) is None
        assert feed.hand_off(blocked=0.0) is None
        assert feed.burst(6.0) is None
        assert feed.policy.value == 2
        assert feed.stats.depth_events == [DepthEvent(9, 15.0, 2, 2, NEVER_FULL)]

    def test_blocked_before_the_last_wait_does_not_count(self) -> None:
        """Blocked time before the buffer last ran dry is spent: only newer blocking grows."""
        feed = grown_to_8()  # the warm-up's 6 s of blocking went into this growth
        assert feed.burst(6.0) is None
        assert feed.policy.value == 8
        assert feed.stats.depth_events[-1].reason == NEVER_FULL
        assert feed.hand_off(blocked=2.0) is None
        assert feed.burst(6.0) == 14


class TestShrink:
    """A buffer never drawn down over a window gives back half its unused slots."""

    def test_shrinks_after_a_full_window(self) -> None:
        """Five ready at every hand-off at depth 8: 3 slots unused, half (rounded up) given back."""
        feed = grown_to_8()
        assert feed.ready(5, SHRINK_WINDOW - 1) == [None] * (SHRINK_WINDOW - 1)
        assert feed.hand_off(ready=5) == 6
        assert feed.stats.depth_events[-1].reason == (
            f"shrink: at least 5 items stayed ready over {SHRINK_WINDOW} items"
        )
        assert (feed.stats.depth, feed.stats.peak_depth) == (6, 8)

    def test_low_water_is_the_least_ready(self) -> None:
        """One hand-off with fewer ready in the window sets how much is given back."""
        feed = grown_to_8()
        feed.ready(8, 60)
        feed.ready(4, 1)
        assert feed.ready(8, SHRINK_WINDOW - 61)[-1] == 7

    def test_two_ready_is_not_unused(self) -> None:
        """A window where only two items were ready at some point does not shrink."""
        feed = grown_to_8()
        feed.ready(8, 60)
        feed.ready(2, 1)
        assert feed.ready(8, SHRINK_WINDOW - 61) == [None] * (SHRINK_WINDOW - 61)
        assert feed.policy.value == 8
        assert feed.ready(8, SHRINK_WINDOW)[-1] == 5  # the next window, full throughout, does

    def test_a_wait_restarts_the_window(self) -> None:
        """A near miss in the window restarts it: no shrink until a full window after it."""
        feed = grown_to_8()
        feed.ready(5, 100)
        assert feed.hand_off(ready=1) == 12
        assert feed.ready(5, SHRINK_WINDOW - 1) == [None] * (SHRINK_WINDOW - 1)
        assert feed.hand_off(ready=5) == 10

    def test_never_below_the_minimum(self) -> None:
        """Shrinking stops at the start depth, however many slots were unused."""
        feed = Feed()
        feed.warm_up()
        assert feed.hand_off(ready=1) == 3
        assert feed.ready(10, SHRINK_WINDOW)[-1] == START_DEPTH
        assert feed.ready(10, 3 * SHRINK_WINDOW) == [None] * (3 * SHRINK_WINDOW)
        assert feed.policy.value == START_DEPTH

    def test_window_is_four_times_a_large_depth(self) -> None:
        """Above depth 32 the window is 4 * depth hand-offs, not SHRINK_WINDOW."""
        feed = Feed(DepthPolicy(maximum=64, max_bytes=None))
        feed.warm_up(blocked=2.0)
        assert feed.burst(38.0) == 40
        assert feed.ready(10, 4 * 40 - 1) == [None] * (4 * 40 - 1)
        assert feed.hand_off(ready=10) == 36

    def test_small_maximum_is_the_minimum(self) -> None:
        """With max_depth below the start depth, the depth starts (and stays) at max_depth."""
        feed = Feed(DepthPolicy(maximum=1, max_bytes=None))
        assert feed.stats.depth == feed.policy.value == 1
        feed.warm_up()
        assert feed.burst(6.0) is None
        assert feed.stats.depth_events[-1].reason == "hold: at max_depth (1)"


class TestCarryOver:
    """What the policy learned carries over to the next epoch of the same loader."""

    def test_depth_carries_over(self) -> None:
        """The next epoch starts at the depth the last one reached, with fresh events."""
        feed = grown_to_8()
        stats = feed.epoch()
        assert (stats.depth, stats.peak_depth, stats.depth_events) == (8, 8, [])

    def test_means_carry_over(self) -> None:
        """The second item of a later epoch can grow; in a fresh policy it cannot."""
        feed = grown_to_8()
        feed.epoch()
        feed.hand_off()
        assert feed.burst(6.0, blocked=1.75) == 14
        fresh = Feed()
        fresh.hand_off()
        assert fresh.burst(6.0, blocked=1.75) is None


class TestStatsAndReasons:
    """Stats hold the depth, its peak and each decision, in words."""

    def test_depth_and_peak(self) -> None:
        """stats.depth follows the policy; peak_depth keeps the highest of the epoch."""
        feed = grown_to_8()
        feed.ready(8, SHRINK_WINDOW)
        assert (feed.stats.depth, feed.stats.peak_depth, feed.policy.value) == (5, 8, 5)
        assert [(e.old, e.new) for e in feed.stats.depth_events] == [(2, 8), (8, 5)]

    def test_event_position(self) -> None:
        """An event records the item count and the seconds since the epoch started."""
        feed = Feed()
        feed.now = 100.0
        feed.epoch()
        feed.warm_up()
        feed.burst(6.0)
        (event,) = feed.stats.depth_events
        assert (event.item, event.seconds) == (9, 15.0)

    def test_no_start_time(self) -> None:
        """Stats without a start time record events at 0 seconds."""
        feed = Feed()
        feed.stats.started = None
        feed.warm_up()
        feed.burst(6.0)
        assert feed.stats.depth_events[0].seconds == 0.0

    def test_reasons_are_readable(self) -> None:
        """Every decision says grow, shrink or hold, with formatted durations."""
        feed = Feed(DepthPolicy(maximum=16, max_bytes=None))
        feed.warm_up(source=0.0042)
        assert feed.hand_off(ready=1, source=0.0042) == 3  # near miss
        assert feed.burst(2.0, blocked=0.75) == 5  # wait, by the steps
        assert feed.burst(2.0, blocked=0.0) is None  # never full
        feed.hand_off(blocked=0.75)
        assert feed.burst(9.0) == 13  # wait, capped by the 8.7 items the producer could make
        assert feed.burst(9.0, blocked=1.0) == 16  # capped by max_depth
        assert feed.burst(9.0, blocked=1.0) is None  # at max_depth
        assert feed.ready(12, SHRINK_WINDOW)[-1] == 11
        reasons = [e.reason for e in feed.stats.depth_events]
        assert [r.split(":")[0] for r in reasons] == [
            "grow",
            "grow",
            "hold",
            "grow",
            "grow",
            "hold",
            "shrink",
        ]
        assert "(4.2 ms/item vs 1 s/step)" in reasons[0]
        assert all(isinstance(r, str) and "{" not in r for r in reasons)


class TestQuickItems:
    """Items quicker than HANDOFF_SECONDS: the hand-off is the cost, so depth may grow."""

    STEP, SOURCE = 2**-17, 2**-16  # about 8 and 15 µs: the producer slower, both quick

    def quick_feed(self, quick_maximum: int | None) -> Feed:
        policy = DepthPolicy(maximum=32, max_bytes=None, quick_maximum=quick_maximum)
        feed = Feed(policy)
        feed.warm_up(step=self.STEP, source=self.SOURCE, blocked=self.STEP)
        return feed

    def grow(self, feed: Feed, waits: int) -> None:
        for _ in range(waits):
            feed.burst(4000.0 * self.STEP, step=self.STEP, source=self.SOURCE, blocked=1.0)

    def test_not_slower_and_up_to_the_quick_ceiling(self) -> None:
        """A quick producer slower than the loop still grows, past 32, to the quick ceiling."""
        feed = self.quick_feed(256)
        self.grow(feed, 12)
        assert feed.policy.value == 256
        reasons = [event.reason for event in feed.stats.depth_events]
        assert not any("slower" in reason for reason in reasons)
        assert reasons[-1] == "hold: at the ceiling for items quicker than 0.1 ms (256)"

    def test_a_ceiling_you_set_holds(self) -> None:
        """Without quick_maximum (max_depth given) the same waits stop at max_depth."""
        feed = self.quick_feed(None)
        self.grow(feed, 12)
        assert feed.policy.value == 32
        assert feed.stats.depth_events[-1].reason == "hold: at max_depth (32)"

    def test_slow_items_keep_the_ceiling(self) -> None:
        """Items over HANDOFF_SECONDS never pass max_depth, whatever quick_maximum says."""
        feed = Feed(DepthPolicy(maximum=32, max_bytes=None, quick_maximum=256))
        feed.warm_up()
        for _ in range(12):
            feed.burst(64.0, blocked=64.0)
        assert feed.policy.value == 32
        assert HANDOFF_SECONDS < 0.25  # the default Feed's producer: 0.25 s per item
