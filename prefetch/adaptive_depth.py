"""``DepthPolicy``: how ``BackgroundLoader(depth="auto")`` chooses its depth.

The policy runs on the consumer's thread, once per item handed over, and
sees only numbers: the clock, how long the loop computed since the last item
(its *step*), whether and how long it waited, how many items were ready, and
the producer's running totals (items fetched, time spent on them, time spent
blocked on a full buffer, largest item in bytes). The producer's time per
item runs from taking a slot to handing the item over: the source, pinning,
the hand-off and any wait for the GIL. The policy never sleeps and never
touches a thread, so scripted traces test it deterministically.

The rules (the guide explains them with a trace):

* **Grow** only when a deeper buffer would have helped: the producer keeps up
  *on average* (its mean time per item at most the loop's mean step, over
  the last :data:`HORIZON` items; judged once :data:`JUDGE_SAMPLES` items are
  in) *and* it sat blocked on a full buffer since the buffer last ran low (it
  had spare time that more slots would have turned into ready items).

  - The loop **waited** (a stall of at least :data:`MIN_WAIT_STEPS` steps):
    grow by the wait counted in steps (at most by the items the producer could
    have made while blocked), and at least double — latency tails are heavy
    and the next burst may be longer.
  - The loop took the **last ready item** (a near miss): grow by half.

  A producer slower than the loop on average is held where it is: no buffer
  makes up a throughput deficit, and such a producer rarely fills a buffer
  anyway.
* **Shrink** when the buffer is never drawn down: if at least ``r >= 3`` items
  were ready at every hand-off over a window of :data:`SHRINK_WINDOW` items
  (or four times the depth, if more), ``r - 2`` slots went unused (one is kept
  as a cushion); give back half of them.
* **Bounds**: never below ``minimum`` nor above ``maximum``, and never more
  items than ``max_bytes`` holds at the largest item seen so far.

The first item of an epoch always waits (nothing can be ready before the
epoch starts), so it never grows the depth. What the policy learned carries
over to the next epoch of the same loader.
"""

from __future__ import annotations

import math

from prefetch.stats import DepthEvent, LoaderStats

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "HORIZON",
    "JUDGE_SAMPLES",
    "MIN_SAMPLES",
    "MIN_WAIT_STEPS",
    "SHRINK_WINDOW",
    "START_DEPTH",
    "DepthPolicy",
]

START_DEPTH = 2
"""Depth of a new adaptive loader, and the floor it shrinks back to."""
DEFAULT_MAX_DEPTH = 32
"""Default ceiling on items buffered: a stall of more than 32 steps is not a burst."""
DEFAULT_MAX_BYTES = 1 << 30
"""Default ceiling on tensor bytes buffered (1 GiB)."""
HORIZON = 256
"""Items the step and source averages remember (older ones fade by halves)."""
SHRINK_WINDOW = 128
"""Hand-offs (at least) without a draw-down before the depth shrinks."""
MIN_WAIT_STEPS = 0.1
"""Waits shorter than this many steps are wake-up noise, not a burst."""
MIN_SAMPLES = 4
"""Steps and fetches to average before the policy grows anything."""
JUDGE_SAMPLES = 32
"""Fetches to average before a producer is judged slower than the loop.

Before that one slow item weighs too much (a burst in the first ten items
looks like a slow producer); growth rests on the producer having blocked on
a full buffer alone."""


class DepthPolicy:
    """Chooses the depth of one adaptive loader from what each hand-off reports.

    Args:
        maximum: Most items ever buffered.
        max_bytes: Most tensor bytes buffered, or ``None`` for no byte limit.
        start: First depth (and the floor when shrinking), capped by ``maximum``.

    Example:
        >>> policy = DepthPolicy(maximum=32, max_bytes=None)
        >>> stats = LoaderStats(started=0.0)
        >>> policy.start_epoch(stats)
        >>> policy.depth
        2
        >>> # Ten hand-offs one second apart, two items ready each time; the
        >>> # producer spends 0.1 s per item and is blocked on the full buffer.
        >>> for i in range(10):
        ...     _ = policy.observe(now=i + 1.0, step=1.0, waited=0.0, ready=2, fetched=i + 1,
        ...                        busy_seconds=0.1 * (i + 1), blocked_seconds=0.9 * i,
        ...                        largest_item=0)
        >>> # Then one slow item: the loop waits 6 s, six steps.
        >>> policy.observe(now=17.0, step=1.0, waited=6.0, ready=0, fetched=11,
        ...                busy_seconds=7.0, blocked_seconds=8.1, largest_item=0)
        8
        >>> stats.depth_events[-1].reason
        'grow: waited 6.0 steps while the producer keeps up (690 ms/item vs 1 s/step)'
    """

    def __init__(self, *, maximum: int, max_bytes: int | None, start: int = START_DEPTH) -> None:
        self.maximum = maximum
        self.max_bytes = max_bytes
        self.minimum = min(start, maximum)
        self.depth = self.minimum
        self._step_sum = self._step_n = 0.0
        self._source_sum = self._source_n = 0.0
        self._stats = LoaderStats()
        self._now = 0.0
        self._reason = ""
        self._start_epoch_marks()

    def _start_epoch_marks(self) -> None:
        self._first = True
        self._fetched = 0
        self._busy = 0.0
        self._dry_mark = 0.0  # the producer's blocked time when the buffer last ran dry
        self._low_mark = 0.0  # ... when it last ran dry or low
        self._low_water = math.inf
        self._window = 0
        self._held: set[str] = set()

    def start_epoch(self, stats: LoaderStats) -> None:
        """Begin an epoch whose stats receive the depth and its changes."""
        self._stats = stats
        stats.depth = stats.peak_depth = self.depth
        self._start_epoch_marks()

    def observe(
        self,
        now: float,
        step: float,
        waited: float,
        ready: int,
        fetched: int,
        busy_seconds: float,
        blocked_seconds: float,
        largest_item: int,
    ) -> int | None:
        """Take one hand-off into account; return the new depth if it changed.

        Args:
            now: The clock (``time.perf_counter``) at the hand-off.
            step: Seconds the loop computed since the previous hand-off.
            waited: Seconds the loop waited for this item (0 if it was ready).
            ready: Items ready when the loop asked (0 if it waited).
            fetched: Items the producer has taken from the source, in all.
            busy_seconds: Seconds the producer spent on those items, in all
                (from taking a slot to handing the item over).
            blocked_seconds: Seconds the producer spent blocked on a full buffer, in all.
            largest_item: Bytes of the largest item produced so far (0 if unknown).
        """
        self._now = now
        if self._first:  # nothing could be ready: the epoch had just begun
            self._first = False
            self._fetched, self._busy = fetched, busy_seconds
            return None
        self._learn(step, fetched, busy_seconds)
        if waited > 0.0 or ready == 1:  # ran dry, or took the last ready item
            new = self._grow(waited, blocked_seconds, largest_item)
            self._low_mark = blocked_seconds
            if waited > 0.0:
                self._dry_mark = blocked_seconds
            self._low_water, self._window = math.inf, 0
        else:
            new = self._shrink(ready)
        if new is None or new == self.depth:
            return None
        return self._change(new)

    def _learn(self, step: float, fetched: int, busy_seconds: float) -> None:
        """Add to the running means: the loop's step, the producer's time per item."""
        self._step_sum += step
        self._step_n += 1
        self._source_sum += busy_seconds - self._busy
        self._source_n += fetched - self._fetched
        self._fetched, self._busy = fetched, busy_seconds
        if self._step_n > HORIZON:  # fade the past by halves: a cheap sliding window
            self._step_sum, self._step_n = self._step_sum / 2, self._step_n / 2
            self._source_sum, self._source_n = self._source_sum / 2, self._source_n / 2

    def _grow(self, waited: float, blocked_seconds: float, largest_item: int) -> int | None:
        """Decide on a wait (``waited > 0``) or a near miss (the last ready item taken)."""
        if self._step_n < MIN_SAMPLES or self._source_n < MIN_SAMPLES:
            return None
        step = self._step_sum / self._step_n
        source = self._source_sum / self._source_n
        steps_waited = waited / step if step > 0 else math.inf
        if waited > 0.0 and steps_waited < MIN_WAIT_STEPS:
            return None
        if source > step and self._source_n >= JUDGE_SAMPLES:
            return self._hold(
                "slower",
                f"hold: the producer is slower on average ({_ms(source)}/item vs "
                f"{_ms(step)}/step); no buffer makes up a throughput deficit",
            )
        # A near miss counts once per draw-down: the buffer must have refilled since.
        mark = self._dry_mark if waited > 0.0 else self._low_mark
        spare = blocked_seconds - mark
        if spare <= 0.0:
            return self._hold(
                "never full",
                "hold: the buffer never filled since it last ran low; a deeper one would not have",
            )
        limit, limited_by = self._limit(largest_item)
        if self.depth >= limit:
            return self._hold(limited_by, f"hold: at {limited_by}")
        keeps_up = f"while the producer keeps up ({_ms(source)}/item vs {_ms(step)}/step)"
        if waited == 0.0:  # a near miss: one more item of cushion
            self._reason = f"grow: took the last ready item {keeps_up}"
            return min(self.depth + (self.depth + 1) // 2, limit)
        # The wait says how many items were missing (at most what the producer could
        # have made while blocked); the next burst may be longer (latency tails are
        # heavy), so grow at least by doubling.
        could_make = spare / source if source > 0 else math.inf
        grow = max(self.depth, math.ceil(min(steps_waited, could_make)))
        self._reason = f"grow: waited {steps_waited:.1f} steps {keeps_up}"
        return min(self.depth + grow, limit)

    def _limit(self, largest_item: int) -> tuple[int, str]:
        if self.max_bytes is not None and largest_item > 0:
            by_bytes = max(1, self.max_bytes // largest_item)
            if by_bytes < self.maximum:
                return by_bytes, f"max_bytes ({by_bytes} items of {largest_item} bytes)"
        return self.maximum, f"max_depth={self.maximum}"

    def _shrink(self, ready: int) -> int | None:
        self._low_water = min(self._low_water, ready)
        self._window += 1
        if self._window < max(SHRINK_WINDOW, 4 * self.depth):
            return None
        low_water, window = self._low_water, self._window
        self._low_water, self._window = math.inf, 0
        if low_water < 3 or self.depth <= self.minimum:
            return None
        unused = int(low_water) - 2  # keep one item of cushion above a near miss
        self._reason = f"shrink: at least {int(low_water)} items stayed ready over {window} items"
        return max(self.minimum, self.depth - math.ceil(unused / 2))

    def _hold(self, kind: str, reason: str) -> int | None:
        """Record, once per epoch and kind, why a wait did not grow the depth."""
        if kind not in self._held:
            self._held.add(kind)
            self._stats.depth_events.append(
                DepthEvent(self._stats.items, self._since_start(), self.depth, self.depth, reason)
            )
        return None

    def _since_start(self) -> float:
        started = self._stats.started
        return self._now - started if started is not None else 0.0

    def _change(self, new: int) -> int:
        stats = self._stats
        stats.depth_events.append(
            DepthEvent(stats.items, self._since_start(), self.depth, new, self._reason)
        )
        self.depth = stats.depth = new
        stats.peak_depth = max(stats.peak_depth or 0, new)
        return new


def _ms(seconds: float) -> str:
    """Format a duration for a reason: ``'4.2 ms'``, ``'1.5 s'``."""
    return f"{seconds:.3g} s" if seconds >= 1.0 else f"{seconds * 1e3:.3g} ms"
