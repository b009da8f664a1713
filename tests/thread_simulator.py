"""A discrete-event simulation of one parallel-fetch epoch in simulated time.

It drives the *real* :class:`~prefetch._threads.thread_policy.ThreadPolicy` with the
numbers the engine reports after each hand-off, on an injected clock
(simulated seconds, no sleeping, no threads), so an epoch of thousands of
batches runs in milliseconds and gives the same result every time.

The model:

* A :class:`Workload` batch ``i`` takes ``seconds[i]`` of wall time on an idle
  machine, a share ``cpu`` of it on the CPU. With ``n`` fetch threads, a
  batch's wall time stretches by ``max(1, n * cpu / cores, n / io_limit)``:
  the threads' CPU work shares ``cores`` cores, and their reads share storage
  that serves ``io_limit`` reads at full speed. Its CPU time stays
  ``seconds[i] * cpu``. So ``n`` threads deliver ``min(n, knee) / seconds``
  batches per second, where ``knee = min(cores / cpu, io_limit)``. The stretch
  is fixed when the batch starts, from the thread count then.
* Threads take batch indices in order; at most ``depth + threads - 1``
  batches are being fetched or are waiting and not yet consumed, as the
  engine's tickets allow (:mod:`prefetch._threads.engine`; the consumer returns a
  ticket when it takes the batch).
* Batches are handed over in order: the consumer asks for batch ``k`` when its
  step ends, waits until it is done, takes it, reports, then computes for
  ``step`` seconds.
* The report after each hand-off is cumulative: batches handed over, the
  consumer's wait, and the wall and CPU seconds of the batches *finished*
  so far (a thread adds its figures when it finishes a batch).
* A change of count takes effect at once: more threads start fetching at the
  hand-off; with fewer, threads stop taking batches (those in flight finish).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Sequence

from prefetch._shared.stats import LoaderStats
from prefetch._threads.thread_policy import ThreadPolicy

__all__ = ["Run", "Workload", "jittered", "simulate"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A loader's batches: wall seconds each on an idle machine, and what limits them."""

    seconds: Sequence[float]
    cpu: float = 1.0  # share of a batch's idle-machine time on the CPU
    cores: int = 2
    io_limit: float = math.inf  # concurrent reads the storage serves at full speed

    @property
    def knee(self) -> float:
        """Threads beyond which a batch takes longer: throughput stops rising there."""
        by_cpu = self.cores / self.cpu if self.cpu > 0 else math.inf
        return min(by_cpu, self.io_limit)

    def stretch(self, threads: int) -> float:
        """How much longer a batch takes with ``threads`` threads fetching."""
        return max(1.0, threads * self.cpu / self.cores, threads / self.io_limit)

    def rate(self, threads: int) -> float:
        """Batches per second ``threads`` threads deliver in steady state (for a mean batch)."""
        mean = sum(self.seconds) / len(self.seconds)
        return threads / (mean * self.stretch(threads))


def jittered(n: int, seconds: float, spread: float, seed: int) -> list[float]:
    """``n`` batch times, uniform within ``seconds * (1 ± spread)``, reproducible by seed."""
    rng = random.Random(seed)
    return [seconds * (1.0 + spread * (2.0 * rng.random() - 1.0)) for _ in range(n)]


@dataclasses.dataclass
class Run:
    """What one simulated epoch did."""

    handed: list[float]  # the time of each hand-off
    waited: float  # the consumer's total wait
    counts: list[int]  # the thread count after each hand-off
    stats: LoaderStats  # the epoch's stats, as the policy filled them

    def rate(self, first: int) -> float:
        """Batches per second from hand-off ``first`` to the last one."""
        return (len(self.handed) - 1 - first) / (self.handed[-1] - self.handed[first])


def simulate(
    workload: Workload,
    step: float,
    threads: int | ThreadPolicy,
    *,
    depth: int = 2,
    largest_item: int = 0,
) -> Run:
    """Run one epoch of ``workload`` with a fixed thread count or a policy."""
    stats = LoaderStats(started=0.0)
    policy: ThreadPolicy | None = None
    if isinstance(threads, ThreadPolicy):
        policy = threads
        policy.start_epoch(stats)
        count = policy.value
    else:
        count = threads
    seconds = workload.seconds
    total = len(seconds)
    done = [math.inf] * total
    flying: list[tuple[float, int, float, float]] = []  # (finish, index, wall, cpu)
    now = ask = waited = busy = cpu = 0.0
    started = consumed = 0
    run = Run([], 0.0, [], stats)
    while consumed < total:
        while len(flying) < count and started < total and started - consumed < depth + count - 1:
            wall = seconds[started] * workload.stretch(count)
            heapq.heappush(flying, (now + wall, started, wall, seconds[started] * workload.cpu))
            started += 1
        ready = done[consumed]
        hand_off = max(ask, ready)
        if flying and flying[0][0] <= hand_off:  # a batch finishes first (or together)
            now, index, wall, used = heapq.heappop(flying)
            done[index] = now
            busy += wall
            cpu += used
            continue
        now = hand_off
        waited += max(0.0, ready - ask)
        consumed += 1
        stats.items = consumed
        if policy is not None:
            new = policy.observe(
                now=now,
                items=consumed,
                waited=waited,
                busy_seconds=busy,
                cpu_seconds=cpu,
                largest_item=largest_item,
            )
            if new is not None:
                count = new
        run.handed.append(now)
        run.counts.append(count)
        ask = now + step
    run.waited = waited
    return run
