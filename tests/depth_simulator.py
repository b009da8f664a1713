"""A discrete-event simulation of one ``BackgroundLoader`` epoch in simulated time.

It drives the *real* :class:`~prefetch._threads.depth_policy.DepthPolicy` with the
numbers :meth:`BackgroundIterator._adapt` would pass, on a clock that is
injected (simulated seconds, no sleeping), so a latency trace of thousands of
items runs in milliseconds and gives the same result every time.

It mimics :class:`~prefetch._threads.engine.Engine`:

* the producer takes a slot (``produced += 1``) before each fetch and blocks
  while ``produced - consumed >= depth``; item ``i`` takes ``source[i]``
  seconds from taking its slot to being posted (its *busy* time);
* the consumer asks for an item, waits if none is posted yet, takes it (which
  frees its slot), reports the hand-off to the policy, then computes for
  ``step`` seconds before asking again;
* the end of the data is a message too: once the source is exhausted the
  producer takes one more slot and posts ``END`` at once, and the consumer
  counts it among the messages ready (``len(messages)``), as the real one does;
* a blocked producer resumes at the hand-off that frees a slot (or grows the
  depth). That hand-off's report does not yet include the block it ends: in
  the real loader the consumer reports right after releasing the slot, before
  the producer thread wakes and adds its blocked time.

Byte budgets are not simulated (``largest_item`` is reported as 0).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
from collections.abc import Sequence

from prefetch._shared.stats import LoaderStats
from prefetch._threads.depth_policy import DepthPolicy

__all__ = ["Run", "bursty", "ideal", "lognormal", "simulate"]


@dataclasses.dataclass
class Run:
    """What one simulated epoch did."""

    elapsed: float  # from the start of the epoch to the end of the last step
    waited: float  # the consumer's total wait
    peak_items: int  # most slots taken at once (produced - consumed): items buffered or in flight
    depths: list[int]  # the depth after each hand-off
    stats: LoaderStats  # the epoch's stats, as the policy filled them


def simulate(source: Sequence[float], step: float, depth: int | DepthPolicy) -> Run:
    """Run one epoch of ``len(source)`` items with a fixed depth or a policy."""
    policy = depth if isinstance(depth, DepthPolicy) else None
    stats = LoaderStats(started=0.0)
    if policy is not None:
        policy.start_epoch(stats)
        current = policy.value
    else:
        current = depth
        stats.depth = stats.peak_depth = depth
    n = len(source)
    busy_upto = [0.0, *itertools.accumulate(source)]  # busy_upto[k]: busy time of items < k
    posts: list[float] = []  # when each message whose slot was taken is (or will be) posted
    free = 0.0  # when the producer next tries to take a slot
    blocked_since: float | None = None
    blocked = 0.0  # completed blocks, summed (Engine.blocked_seconds)
    consumed = peak = 0

    def run_producer(until: float) -> None:
        """Let the producer take every slot it can take up to time ``until``."""
        nonlocal free, blocked_since, peak
        while blocked_since is None and len(posts) <= n and free <= until:
            if len(posts) - consumed >= current:
                blocked_since = free
                return
            posts.append(free + (source[len(posts)] if len(posts) < n else 0.0))  # n: END
            free = posts[-1]
            peak = max(peak, min(len(posts), n) - consumed)

    ask = handed_over = waited_total = 0.0
    depths: list[int] = []
    for _ in range(n):
        run_producer(ask)
        ready = bisect.bisect_right(posts, ask, lo=consumed) - consumed
        if ready:
            now, waited = ask, 0.0
        else:  # the next item is in flight: the producer never blocks with nothing buffered
            now = posts[consumed]
            waited = now - ask
            run_producer(now)
        consumed += 1
        stats.items += 1
        waited_total += waited
        if policy is not None:
            fetched = min(bisect.bisect_right(posts, now), n)  # items posted by now
            new = policy.observe(
                now=now,
                step=now - handed_over - waited,
                waited=waited,
                ready=ready,
                fetched=fetched,
                busy_seconds=busy_upto[fetched],
                blocked_seconds=blocked,
                largest_item=0,
            )
            if new is not None:
                current = new
        depths.append(current)
        if blocked_since is not None and len(posts) - consumed < current:
            blocked += now - blocked_since
            blocked_since, free = None, now
        handed_over = now
        ask = now + step
    return Run(ask, waited_total, peak, depths, stats)


def ideal(source: Sequence[float], step: float) -> float:
    """The shortest possible epoch: the slower of the two sides, run flat out."""
    return max(sum(source), step * len(source))


def bursty(n: int, burst: float = 8.0, fast: float = 0.1, every: int = 10) -> list[float]:
    """Source times: ``burst`` for every ``every``-th item (index % every == every - 1)."""
    return [burst if i % every == every - 1 else fast for i in range(n)]


def lognormal(n: int, mean: float, sigma: float, seed: int) -> list[float]:
    """Seeded log-normal source times with the given mean (heavy right tail)."""
    rng = random.Random(seed)
    mu = math.log(mean) - sigma**2 / 2
    return [rng.lognormvariate(mu, sigma) for _ in range(n)]
