"""How ``BackgroundLoader(depth="auto")`` sets its depth: the rules of :class:`DepthPolicy`.

The cycle it shares with the thread policy (epochs, holds, changes, events)
and the fixed depth are :mod:`prefetch._threads.policy`.

The policy runs on the consumer's thread: the consumer reports each wait and
each near miss at once and quiet hand-offs in batches. It sees only numbers:
the clock, how long the loop computed (its *steps*), whether and how long it
waited, how few items were ready, and the producer's running totals (items
fetched, time spent on them, time spent blocked on a full buffer, largest
item in bytes). The producer's time per item runs from taking a slot to
handing the item over: the source, pinning, the hand-off and any wait for
the GIL. The policy never sleeps and never
touches a thread, so scripted traces test it deterministically.

The rules (the guide explains them with a trace):

* **Grow** only by what a deeper buffer would have had ready. When the loop
  waits, or takes the last ready item (a near miss), the policy looks at how
  long the producer sat blocked on a full buffer since the buffer last ran
  dry (for a near miss: ran low). Divided by the producer's mean time per
  item, that is how many more items it could have made: the most the depth
  may grow by.

  - The loop **waited** (a stall of at least :data:`MIN_WAIT_STEPS` steps):
    grow by the wait counted in steps, and at least by half — latency tails
    are heavy and the next burst may be longer.
  - A **near miss**: grow by half.

  A producer that is simply slower than the loop never gets ahead, so it
  never sits blocked on a full buffer and the depth stays where it is: no
  buffer makes up a throughput deficit. One slower *on average* whose times
  vary does get ahead now and then; for it the depth grows by at most
  :data:`SLOWER_HEADROOM` items beyond the start, a cushion for its jitter,
  and a depth grown while it looked faster is cut back to that once
  :data:`CUT_SAMPLES` items show it is slower. Items quicker than
  :data:`HANDOFF_SECONDS` never count as slower: the loop then waits for the
  hand-off between threads, which depth does amortize; by default they may
  grow up to :data:`QUICK_MAX_DEPTH`.
* **Shrink** when the buffer is never drawn down: if at least ``r >= 3`` items
  were ready at every hand-off over a window of :data:`SHRINK_WINDOW` items
  (or four times the depth, if more), ``r - 2`` slots went unused (one is kept
  as a cushion); give back half of them.
* **Bounds**: never below ``minimum`` nor above ``maximum``, and never more
  items than ``max_bytes`` holds at the largest item seen so far.

Every wait the policy does not absorb is recorded once per epoch and reason
as a *hold* (``DepthEvent`` with ``old == new``): the producer slower on
average (never ahead, or at its headroom), the buffer never full, or a bound
reached.

The first item of an epoch always waits (nothing can be ready before the
epoch starts), so it never grows the depth. What the policy learned carries
over to the next epoch of the same loader.
"""

from __future__ import annotations

import math

from prefetch._shared.stats import LoaderStats
from prefetch._threads.policy import DEPTH, AdaptivePolicy, Control, Fixed

START_DEPTH = 2
"""Depth of a new adaptive loader, and the floor it shrinks back to."""
DEFAULT_MAX_DEPTH = 32
"""Default ceiling on items buffered: a stall of more than 32 steps is not a burst."""
QUICK_MAX_DEPTH = 256
"""Default ceiling for items quicker than :data:`HANDOFF_SECONDS`: their cost is the hand-off.

A thread switch costs tens of microseconds; a run of 256 quick items spreads it
thin, and 256 such items hold little memory (``max_bytes`` still bounds it)."""
HORIZON = 256
"""Items the step and source averages remember (older ones fade by halves)."""
SHRINK_WINDOW = 128
"""Hand-offs (at least) without a draw-down before the depth shrinks."""
MIN_WAIT_STEPS = 0.1
"""Waits shorter than this many steps are wake-up noise, not a burst."""
SLOWER_HEADROOM = 2
"""Items beyond the start a producer slower than the loop on average may grow by.

Such a producer still gets ahead now and then (its times vary) and a slot or
two catches that; more would hold memory for a deficit no buffer makes up."""
HANDOFF_SECONDS = 1e-4
"""Items quicker than this never make a producer count as slower on average.

With items that quick (ints, small records), what the loop waits for is the
hand-off between the threads (a thread switch costs tens of microseconds),
which a deeper buffer does amortize: such a loader may grow to ``max_depth``
(within ``max_bytes``) like one whose producer is ahead."""
CUT_SAMPLES = 64
"""Fetches averaged before a depth above the headroom is cut for a slower producer.

A depth grown while the producer looked fast (its early items were) is cut
back once it is known to be slower on average; one slow burst early on is
not enough to tell."""
MIN_SAMPLES = 4
"""Steps and fetches to average before the policy grows anything."""
DEFICIT = "no buffer makes up a throughput deficit"
NEVER_FULL = (
    "hold: the buffer never filled since it last ran low; a deeper one would not have helped"
)


class DepthPolicy(AdaptivePolicy):
    """Chooses the depth of one adaptive loader from what each hand-off reports.

    Args:
        maximum: Most items ever buffered.
        max_bytes: Most tensor bytes buffered, or ``None`` for no byte limit.
        start: First depth (and the floor when shrinking), capped by ``maximum``.
        quick_maximum: Most items for a producer quicker than
            :data:`HANDOFF_SECONDS` per item (the default ceiling lets such
            items, whose cost is the hand-off, reach :data:`QUICK_MAX_DEPTH`);
            ``None``: ``maximum``.

    Example:
        >>> policy = DepthPolicy(maximum=32, max_bytes=None)
        >>> stats = LoaderStats(started=0.0)
        >>> policy.start_epoch(stats)
        >>> policy.value
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
        >>> print(stats.depth_events[-1].reason)  # doctest: +NORMALIZE_WHITESPACE
        grow: waited 6.0 steps; the producer had spare time for 11.7 more items
        (690 ms/item vs 1 s/step)
    """

    setting = DEPTH

    def __init__(
        self,
        *,
        maximum: int,
        max_bytes: int | None,
        start: int = START_DEPTH,
        quick_maximum: int | None = None,
    ) -> None:
        super().__init__(min(start, maximum), maximum)
        self.max_bytes = max_bytes
        self.quick_maximum = max(maximum, quick_maximum or maximum)
        self.minimum = self.value
        self._step_sum = self._step_n = 0.0
        self._source_sum = self._source_n = 0.0
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

    def start_epoch(self, stats: LoaderStats) -> None:
        """Begin an epoch whose stats receive the depth and its changes."""
        super().start_epoch(stats)
        self._start_epoch_marks()

    def observe(
        self,
        *,
        now: float,
        step: float,
        waited: float,
        ready: int,
        fetched: int,
        busy_seconds: float,
        blocked_seconds: float,
        largest_item: int,
        count: int = 1,
    ) -> int | None:
        """Take hand-offs into account; return the new depth if it changed.

        The consumer reports each wait and near miss at once and quiet
        hand-offs in batches (``count`` of them, the last one at ``now``).

        Args:
            now: The clock (``time.perf_counter``) at the (last) hand-off.
            step: Seconds the loop computed over the ``count`` steps since the
                previous report.
            waited: Seconds the loop waited for the last item (0 if it was ready).
            ready: Fewest items ready when the loop asked (0 if it waited).
            fetched: Items the producer has taken from the source, in all.
            busy_seconds: Seconds the producer spent on those items, in all
                (from taking a slot to handing the item over).
            blocked_seconds: Seconds the producer spent blocked on a full buffer, in all.
            largest_item: Bytes of the largest item produced so far (0 if unknown).
            count: Hand-offs this report covers.
        """
        self._now, self._items = now, self._stats.items
        if self._first:  # nothing could be ready: the epoch had just begun
            self._first = False
            self._fetched, self._busy = fetched, busy_seconds
            return None
        self._learn(step, count, fetched, busy_seconds)
        if waited > 0.0 or ready == 1:  # ran dry, or took the last ready item
            new = self._grow(waited, blocked_seconds, largest_item)
            self._low_mark = blocked_seconds
            if waited > 0.0:
                self._dry_mark = blocked_seconds
            self._low_water, self._window = math.inf, 0
        else:
            new = self._shrink(ready, count)
        if new is None or new == self.value:
            return None
        return self._change(new, self._reason)

    def _learn(self, step: float, count: int, fetched: int, busy_seconds: float) -> None:
        """Add to the running means: the loop's step, the producer's time per item."""
        self._step_sum += step
        self._step_n += count
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
        rates = f"{_ms(source)}/item vs {_ms(step)}/step"
        slower = ""
        if source > step and source >= HANDOFF_SECONDS:
            slower = f"the producer is slower on average ({rates})"
        headroom = self.minimum + SLOWER_HEADROOM
        if slower and self._source_n >= CUT_SAMPLES and self.value > headroom:
            self._reason = f"shrink: {slower}; {DEFICIT}"  # grown while it looked faster
            return headroom
        # Spare: how long the producer sat blocked on a full buffer since the buffer
        # last ran dry (for a wait) or low (so a near miss counts once per draw-down).
        # A deeper buffer would have turned that time into ready items, no more.
        spare = blocked_seconds - (self._dry_mark if waited > 0.0 else self._low_mark)
        could_make = spare / source if source > 0 else math.inf
        if could_make < 1.0:
            if slower:
                self._record_hold("slower", f"hold: {slower} and never got ahead; {DEFICIT}")
            else:
                self._record_hold("never full", NEVER_FULL)
            return None
        limit, kind, limited_by = self._limit(largest_item, source)
        if slower and headroom < limit:
            limit, kind, limited_by = headroom, "slower", f"{headroom} items: {slower}; {DEFICIT}"
        if self.value >= limit:
            self._record_hold(kind, f"hold: at {limited_by}")
            return None
        spare_items = f"the producer had spare time for {could_make:.1f} more items ({rates})"
        if waited == 0.0:  # a near miss: half again as much cushion
            wanted = (self.value + 1) // 2
            self._reason = f"grow: took the last ready item; {spare_items}"
        else:  # the items missing; at least half again: the next burst may be longer
            # min(..., limit): a loop whose steps take no time waits infinitely many steps
            wanted = max((self.value + 1) // 2, math.ceil(min(steps_waited, limit)))
            self._reason = f"grow: waited {steps_waited:.1f} steps; {spare_items}"
        return min(self.value + max(1, min(wanted, math.floor(min(could_make, limit)))), limit)

    def _limit(self, largest_item: int, source: float) -> tuple[int, str, str]:
        """Return the depth the bounds allow, which bound, and how to say it."""
        maximum, text = self.maximum, f"max_depth ({self.maximum})"
        if self.quick_maximum > maximum and source < HANDOFF_SECONDS:
            maximum = self.quick_maximum
            text = f"the ceiling for items quicker than {_ms(HANDOFF_SECONDS)} ({maximum})"
        if self.max_bytes is not None and largest_item > 0:
            by_bytes = max(1, self.max_bytes // largest_item)
            if by_bytes < maximum:
                text = f"max_bytes ({by_bytes} items of {largest_item} bytes)"
                return by_bytes, "max_bytes", text
        return maximum, "max_depth", text

    def _shrink(self, ready: int, count: int) -> int | None:
        self._low_water = min(self._low_water, ready)
        self._window += count
        if self._window < max(SHRINK_WINDOW, 4 * self.value):
            return None
        low_water, window = self._low_water, self._window
        self._low_water, self._window = math.inf, 0
        if low_water < 3 or self.value <= self.minimum:
            return None
        unused = int(low_water) - 2  # keep one item of cushion above a near miss
        self._reason = f"shrink: at least {int(low_water)} items stayed ready over {window} items"
        return max(self.minimum, self.value - math.ceil(unused / 2))


def _ms(seconds: float) -> str:
    """Format a duration for a reason: ``'4.2 ms'``, ``'1.5 s'``."""
    return f"{seconds:.4g} s" if seconds >= 0.9995 else f"{seconds * 1e3:.3g} ms"


def depth_control(fixed: int | None, max_depth: int | None, max_bytes: int | None) -> Control:
    """The depth of a loader: ``Fixed`` at ``fixed``, or, for ``None``, a :class:`DepthPolicy`.

    A ceiling the user set (``max_depth``) holds for every item; the default
    one rises to :data:`QUICK_MAX_DEPTH` for quick items.
    """
    if fixed is not None:
        return Fixed(DEPTH, fixed)
    maximum = max_depth if max_depth is not None else DEFAULT_MAX_DEPTH
    quick = QUICK_MAX_DEPTH if max_depth is None else None
    return DepthPolicy(maximum=maximum, max_bytes=max_bytes, quick_maximum=quick)
