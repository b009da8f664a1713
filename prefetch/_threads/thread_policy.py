"""How ``BackgroundLoader(fetch_threads="auto")`` sets its thread count: :class:`ThreadPolicy`.

The cycle it shares with the depth policy (epochs, holds, changes, events)
and the fixed count are :mod:`prefetch._threads.policy`.

The policy runs on the consumer's thread, which reports after hand-offs
(every one, or fewer) figures cumulative over the epoch (see
:meth:`ThreadPolicy.observe`). It never sleeps and never touches a thread,
so scripted traces on an injected clock test it deterministically.

It measures in *windows*. After the start of an epoch it lets ``threads``
batches pass, after a change ``max(old, new)`` (the first batch always
waits; new threads need one fetch before they deliver); a window then spans
:data:`WINDOW_ROUNDS` batches per thread (at least :data:`MIN_WINDOW_ITEMS`
and :data:`MIN_WINDOW_SECONDS`): batches arrive in sampler order, in rounds
of about one per thread, and whole rounds keep a round's phase out of the
rate. A window an epoch leaves unfinished goes on in the next epoch, so
short epochs still decide. Per window: the *throughput* (batches per
second), the *wait share* (of the window, the loop waiting) and the *CPU
share* (CPU seconds per busy second of the threads).

The rules (the guide explains them with a trace):

* **Start from the first reads.** A fresh policy at the grain of samples
  hears of each starting thread's first two reads (:meth:`ThreadPolicy.observe_reads`;
  the second, warm one counts) and jumps at once to ``cores / CPU share``
  threads (within the maximum):
  an epoch of a few batches then runs at the right count from its first
  batch, instead of growing window by window.

* **Grow only while the loop waits.** A window whose wait share is below
  :data:`MIN_WAIT_SHARE` changes nothing: the loader is already ahead, and
  more threads would only hold more batches (a *consumer-bound* hold).
* **Grow fast.** A loop that waited a share ``w`` of the time would take
  batches ``1 / (1 - w)`` times as fast; the count grows to that many times
  the threads, with :data:`HEADROOM` (scaling is rarely linear near the
  knee), by at least one thread and at most :data:`MAX_GROWTH` times.
* **Keep a growth only if it paid.** The window after a growth must show at
  least :data:`MIN_GAIN` more throughput than the window before it (or half
  of what the loop's waiting allowed, if that is less). If not, the count
  goes back to the previous one and *holds* there. It probes again only
  when conditions change: the loop waits clearly more (:data:`REPROBE_RISE`
  more of the time) than in any window at the held count so far, the one
  before the failed probe included, and not before ``2 ** failures``
  windows at the held count have passed (``failures``: probes that did not
  pay, ever). Noise in the wait share raises the bar instead of triggering
  probes, and the back-off bounds the probes of even a noisy loader by the
  logarithm of its windows: no oscillation. (A drop in throughput alone
  does not re-probe: windows of a few rounds are too noisy to tell a slower
  source from a slow stretch.)
* **Ceilings.** Never above ``maximum``, nor above the loader's ``batches``
  per epoch (a thread reads a whole batch), nor above the CPU ceiling
  ``cores / CPU share`` (about the core count when fetching is CPU-bound,
  more when the threads mostly wait on I/O), nor above ``max_bytes //
  largest batch`` (each thread holds a batch in flight). A count above the
  byte bound (a larger batch came) is cut at once.

Threads contending for the GIL or the cores are not on the CPU while they
wait, so they look I/O-bound and the CPU ceiling lets them grow; the
throughput check is what stops them, at the cost of one probe.

Every change is a :class:`~prefetch.ThreadEvent` with its reason and the
figures behind it. A window in which the count stayed is recorded once per
epoch and kind as a *hold* (``old == new``) saying why: the loop hardly
waited (consumer-bound), a ceiling, or a probe that did not pay. What the
policy learned (the count, a hold, a probe awaiting its verdict) carries
over to the next epoch of the same loader.
"""

from __future__ import annotations

import dataclasses
import math

from prefetch._shared.arguments import check_count
from prefetch._shared.stats import LoaderStats
from prefetch._threads.policy import THREADS, AdaptivePolicy
from prefetch._threads.thread_windows import (
    NOTHING,
    Window,
    available_cores,
    figure,
    needed_gain,
    rate,
    size,
)

START_THREADS = 2
"""Threads of a new adaptive loader: parallel from the start, cheap if the loader is ahead."""
DEFAULT_MAX_THREADS = 32
"""Default ceiling: past this, storage that needs more concurrency wants another design."""
MIN_WAIT_SHARE = 0.1
"""Share of a window the loop must wait before the count grows."""
HEADROOM = 1.5
"""Threads beyond the linear estimate of what the loop needs, as a factor."""
MAX_GROWTH = 4
"""Most a count grows by in one step, as a factor."""
REPROBE_RISE = 0.1
"""Rise in wait share (absolute) that makes a held count probe again."""
WINDOW_ROUNDS = 2
"""Batches per thread in a window."""
MIN_WINDOW_ITEMS = 8
"""Fewest batches in a window."""
SAMPLE_WINDOW_ITEMS = 2
"""Batches in a window at the grain of samples: every thread works on each batch, so
there are no rounds to fill, and a fresh loader ramps within its first 20 batches."""
MIN_WINDOW_SECONDS = 0.05
"""Shortest window: switch intervals and timer noise are milliseconds."""


@dataclasses.dataclass
class _Hold:
    threads: int  # the count held
    tried: int  # the count that did not pay
    before: Window  # the window at the held count before the failed probe
    most: float  # the highest wait share seen at the held count since (the bar)
    windows: int = 0  # windows at the held count since


class ThreadPolicy(AdaptivePolicy):
    """Chooses the fetch thread count of one loader from what the hand-offs report.

    Args:
        maximum: Most threads ever (default :data:`DEFAULT_MAX_THREADS`).
        cores: Cores the threads may use (default: this process's CPU affinity).
        max_bytes: Most bytes of batches in flight, or ``None`` for no byte bound.
        start: First count, capped by ``maximum`` (default :data:`START_THREADS`).
        batches: The loader's batches per epoch, a ceiling too (``None``: unknown).

    Example:
        >>> policy = ThreadPolicy(cores=2)
        >>> stats = LoaderStats(started=0.0)
        >>> policy.start_epoch(stats)
        >>> policy.value
        2
        >>> # A batch every 0.5 s, the loop waiting 0.375 s of it; each batch
        >>> # took a thread 1 s, 0.125 s of it on the CPU (mostly I/O).
        >>> for i in range(1, 10):
        ...     _ = policy.observe(now=0.5 * i, items=i, waited=0.375 * i,
        ...                        busy_seconds=1.0 * i, cpu_seconds=0.125 * i,
        ...                        largest_item=0)
        >>> policy.observe(now=5.0, items=10, waited=3.75, busy_seconds=10.0,
        ...                cpu_seconds=1.25, largest_item=0)
        8
        >>> print(stats.thread_events[-1].reason)  # doctest: +NORMALIZE_WHITESPACE
        grow: the loop waited 75% of the time at 2 threads (2 batches/s); within
        the CPU ceiling of 16 threads (2 cores, 12% of the threads' busy time on CPU)
    """

    setting = THREADS

    def __init__(
        self,
        *,
        maximum: int | None = None,
        cores: int | None = None,
        max_bytes: int | None = None,
        start: int | None = None,
        batches: int | None = None,
        sample_grain: bool = False,
    ) -> None:
        owner = "ThreadPolicy"
        self._rounds = not sample_grain  # a thread reads a whole batch: windows in rounds
        most = check_count(DEFAULT_MAX_THREADS if maximum is None else maximum, "maximum", owner)
        first = START_THREADS if start is None else check_count(start, "start", owner)
        self.batches = None if batches is None else check_count(batches, "batches", owner)
        super().__init__(min(first, most, batches or most), most)
        self.cores = available_cores() if cores is None else check_count(cores, "cores", owner)
        self.max_bytes = None if max_bytes is None else check_count(max_bytes, "max_bytes", owner)
        self._probe: tuple[int, Window] | None = None  # (count before a growth, its window)
        self._held_count: _Hold | None = None  # the count held after a probe that did not pay
        self._failures = 0  # probes that did not pay, ever: the back-off
        self._carry = NOTHING  # a partial window from the previous epoch
        self._sized = False  # the first reads sized it (sample grain; once per policy)
        self._cold: tuple[int, float, float] | None = None  # the first reads' totals
        self._start_epoch_marks()

    def first_reads(self) -> int | None:
        """A fresh policy at the grain of samples: hear of each starting thread's first two reads.

        Before any batch reaches the loop, the reads say how long a read
        takes and how much of it is on the CPU: enough to size the first
        epoch (:meth:`observe_reads`), instead of growing window by window
        through an epoch that may have only a few batches. A thread's first
        read is cold (the source's first decode, its imports, the engine's
        start), so the figures are those of each thread's second read: the
        policy asks for ``threads`` reads, then for ``threads`` more.
        """
        if self._rounds or self._sized:
            return None
        if self._cold is None:
            return self.value
        return self._cold[0] + self.value

    def observe_reads(
        self, *, reads: int, busy_seconds: float, cpu_seconds: float, now: float
    ) -> int | None:
        """Size a fresh loader from its warm reads: as many threads as keep the cores busy.

        The first call keeps the cold reads' totals; the second sizes from
        what the reads since took. A read that waits (storage, network) for
        most of its time leaves the cores idle: ``cores / CPU share`` threads
        keep them busy, within the maximum (at this grain threads share each
        batch, so more threads hold no more batches). Then the windows go on
        as usual.
        """
        if self._rounds or self._sized:
            return None
        if self._cold is None:
            self._cold = (reads, busy_seconds, cpu_seconds)
            return None
        self._sized = True
        self._now, self._items = now, self._stats.items
        cold_reads, cold_busy, cold_cpu = self._cold
        reads, busy_seconds = reads - cold_reads, busy_seconds - cold_busy
        cpu_seconds -= cold_cpu
        if reads <= 0 or busy_seconds <= 0.0:
            return None
        share = min(1.0, cpu_seconds / busy_seconds) if cpu_seconds > 0.0 else 0.0
        ceiling = self.maximum if share <= 0.0 else math.floor(self.cores / share + 0.5)
        new = max(self.value, min(self.maximum, ceiling))
        if new == self.value:
            return None
        per_read = busy_seconds / reads
        self._reason = (
            f"start: {reads} warm reads took {figure(per_read * 1000)} ms each, {share:.0%} "
            f"of it on the CPU; {new} threads keep {self.cores} cores busy"
            + (f" (the maximum of {self.maximum})" if new == self.maximum else "")
        )
        return self._change(new, self._reason)

    def _start_epoch_marks(self) -> None:
        self._mark: Window | None = None  # the report the window began at (None: settling)
        self._last: Window | None = None
        self._settle_until = self.value if self._rounds else 1  # the first batch always waits

    def start_epoch(self, stats: LoaderStats) -> None:
        """Begin an epoch whose stats receive the count and its changes.

        A window the last epoch left unfinished carries over: after this
        epoch's first batches settle, it goes on where it stopped, so epochs
        shorter than a window still decide.
        """
        if self._mark is not None and self._last is not None:
            self._carry = self._mark.to(self._last, self._carry)
        super().start_epoch(stats)
        self._start_epoch_marks()

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
        """Take hand-offs into account; return the new count if it changed.

        All figures are cumulative over the current epoch.

        Args:
            now: The clock (``time.perf_counter``) at the last hand-off.
            items: Batches handed to the loop so far.
            waited: Seconds the loop spent waiting for data so far.
            busy_seconds: Wall seconds the fetch threads spent fetching and
                collating, summed over threads.
            cpu_seconds: CPU seconds those threads used for it (summed
                ``time.thread_time`` deltas).
            largest_item: Bytes of the largest batch so far (0 if unknown).
        """
        self._now, self._items = now, items
        by_bytes = self._byte_bound(largest_item)
        if by_bytes is not None and self.value > by_bytes:
            self._reason = f"cut: {self._bytes_text(by_bytes, largest_item)}"
            self._probe = self._held_count = None
            return self._change(by_bytes, self._reason)
        point = self._last = Window(now, items, waited, busy_seconds, cpu_seconds)
        mark = self._mark
        if mark is None:
            if items >= self._settle_until:
                self._mark = point
            return None
        window = mark.to(point, self._carry)
        if self._rounds:
            enough = max(MIN_WINDOW_ITEMS, WINDOW_ROUNDS * self.value)
        else:
            enough = SAMPLE_WINDOW_ITEMS
        if window.items < enough or window.seconds < MIN_WINDOW_SECONDS:
            return None
        self._mark, self._carry = point, NOTHING
        new = self._decide(window, largest_item)
        if new is None or new == self.value:
            return None
        return self._change(new, self._reason)

    def _decide(self, window: Window, largest_item: int) -> int | None:
        """Decide on one full window: a verdict on a probe, a growth, or a hold."""
        n, w = self.value, window.wait_share
        if self._held_count is not None:
            self._held_count.windows += 1
        if self._probe is not None:
            previous, before = self._probe
            self._probe = None
            gain = window.throughput / before.throughput - 1.0
            needed = needed_gain(before.wait_share)
            if gain < needed:
                self._failures += 1
                self._held_count = _Hold(previous, n, before, before.wait_share)
                self._holds_recorded.add("tried")  # the revert says it; no hold event this epoch
                self._reason = (
                    f"revert: {n} threads gave {rate(window)}, {gain:+.0%} on "
                    f"{previous} threads ({rate(before)}; {needed:.0%} needed); "
                    f"back to {previous}, held until the loop waits more"
                )
                return previous
        if w < MIN_WAIT_SHARE:
            self._record_hold(
                "consumer",
                f"hold: consumer-bound: the loop waited {w:.0%} of the time at {n} threads "
                f"(under {MIN_WAIT_SHARE:.0%}); loading keeps up, more threads would only "
                "hold more batches",
            )
            return None
        again = ""
        hold = self._held_count
        if hold is not None:
            then = hold.before
            backing_off = hold.windows < 2**self._failures
            if not backing_off and w >= hold.most + REPROBE_RISE:
                again = f", more than the {hold.most:.0%} seen since {hold.tried} did not pay"
            else:
                if not backing_off:
                    hold.most = max(hold.most, w)
                self._record_hold(
                    "tried",
                    f"hold: {hold.tried} threads gave no more throughput than {hold.threads} "
                    f"({rate(then)}, the loop waiting {then.wait_share:.0%}); "
                    f"now {rate(window)}, waiting {w:.0%}",
                )
                return None
            self._held_count = None
        limit, kind, text = self._limit(window, largest_item)
        if n >= limit:
            self._record_hold(kind, f"hold: the loop waited {w:.0%} of the time; at {text}")
            return None
        wanted = math.ceil(HEADROOM * n / (1.0 - w)) if w < 1.0 else MAX_GROWTH * n
        new = min(limit, max(n + 1, min(wanted, MAX_GROWTH * n)))
        self._probe = (n, window)
        self._reason = (
            f"grow: the loop waited {w:.0%} of the time at {n} threads "
            f"({rate(window)}){again}; within {text}"
        )
        return new

    def _limit(self, window: Window, largest_item: int) -> tuple[int, str, str]:
        """Return the count the bounds allow, which bound, and how to say it."""
        bounds = [(self.maximum, "maximum", f"the maximum of {self.maximum} threads")]
        if self.batches is not None:
            text = f"the {self.batches} batches of an epoch (a thread reads a whole batch)"
            bounds.append((self.batches, "batches", text))
        share = window.cpu_share
        if share > 0.0:
            ceiling = max(1, math.floor(self.cores / share + 0.5))
            text = (
                f"the CPU ceiling of {ceiling} threads ({self.cores} cores, "
                f"{share:.0%} of the threads' busy time on CPU)"
            )
            bounds.append((ceiling, "cpu", text))
        by_bytes = self._byte_bound(largest_item)
        if by_bytes is not None:
            bounds.append((by_bytes, "max_bytes", self._bytes_text(by_bytes, largest_item)))
        return min(bounds, key=lambda bound: bound[0])

    def _byte_bound(self, largest_item: int) -> int | None:
        if self.max_bytes is None or largest_item <= 0 or not self._rounds:
            return None
        return max(1, self.max_bytes // largest_item)

    def _bytes_text(self, by_bytes: int, largest_item: int) -> str:
        batches = "1 batch" if by_bytes == 1 else f"{by_bytes} batches"
        return (
            f"max_bytes ({size(self.max_bytes or 0)}) holds {batches} "
            f"of {size(largest_item)} in flight"
        )

    def _change(self, new: int, reason: str) -> int:
        old = self.value
        super()._change(new, reason)
        self._mark, self._carry = None, NOTHING  # measure afresh once the new count settled
        self._settle_until = self._items + (max(old, new) if self._rounds else 1)
        return new
