"""ThreadPolicy says why ``fetch_threads="auto"`` holds, and never grows past an epoch (issue 24).

Driven as in ``test_thread_policy.py``: :class:`~tests.test_thread_policy.Feed`
scripts the cumulative figures on an injected clock, so each decision is
exact. A hold is an event with ``old == new``, said once per epoch and kind:
the loop hardly waits (consumer-bound), a ceiling (the maximum, the CPU, the
batches of an epoch, ``max_bytes``), or a probe that did not pay.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader
from prefetch._threads.thread_policy import ThreadPolicy

from .test_thread_policy import Feed

IDLE = {"wait": 0.0}
"""A loop that never waits: 2 batches/s, all of each step computing."""
CPU_BOUND = {"cpu": 1.0}
"""Batches all on the CPU: 2 cores hold 2 threads, the loop waiting 75%."""


def reasons(feed: Feed) -> list[str]:
    """The epoch's events as ``'old->new reason'`` strings."""
    return [f"{e.old}->{e.new} {e.reason}" for e in feed.stats.thread_events]


class TestConsumerBound:
    """A loop that does not wait holds the count, and one event per epoch says so."""

    def test_hold_says_the_loop_does_not_wait(self) -> None:
        """At item 10 (the first window) the hold names the wait share and the count."""
        feed = Feed()
        assert feed.batches(200, **IDLE) == []
        assert reasons(feed) == [
            "2->2 hold: consumer-bound: the loop waited 0% of the time at 2 threads "
            "(under 10%); loading keeps up, more threads would only hold more batches"
        ]
        assert feed.stats.thread_events[0].item == 10

    def test_said_again_each_epoch(self) -> None:
        """Each epoch's stats explain its own count: the hold comes once in each."""
        feed = Feed()
        feed.batches(50, **IDLE)
        feed.epoch()
        feed.batches(50, **IDLE)
        assert [(e.old, e.new) for e in feed.stats.thread_events] == [(2, 2)]
        assert feed.stats.thread_events[0].reason.startswith("hold: consumer-bound")

    def test_after_a_growth_that_made_the_loop_the_limit(self) -> None:
        """8 threads outpace the loop: the count stays at 8, and the hold says why."""
        feed = Feed()
        assert feed.batches(10) == [(10, 8)]
        assert feed.batches(60, every=0.125, wait=0.0) == []  # 4x the rate: the growth paid
        assert feed.policy.value == 8
        (_, hold) = feed.stats.thread_events
        assert (hold.old, hold.new) == (8, 8)
        assert hold.reason.startswith("hold: consumer-bound: the loop waited 0% of the time at 8")


class TestHoldsChangeWithTheReason:
    """Each kind of hold is said when it first applies in an epoch, and not repeated."""

    def test_ceiling_then_consumer_then_ceiling_again(self) -> None:
        """CPU ceiling, then the loop stops waiting, then waits again: two events, in order."""
        feed = Feed()
        feed.batches(100, **CPU_BOUND)
        feed.batches(100, **CPU_BOUND, **IDLE)
        feed.batches(100, **CPU_BOUND)
        kinds = [e.reason.split(";")[0] for e in feed.stats.thread_events]
        assert kinds == [
            "hold: the loop waited 75% of the time",
            "hold: consumer-bound: the loop waited 0% of the time at 2 threads (under 10%)",
        ]
        assert "at the CPU ceiling of 2 threads" in feed.stats.thread_events[0].reason
        assert all(e.old == e.new == 2 for e in feed.stats.thread_events)

    def test_no_gain_then_consumer_bound(self) -> None:
        """After a failed probe: next epoch says 'no more throughput', then 'consumer-bound'."""
        feed = Feed()
        assert feed.batches(34) == [(10, 8), (34, 2)]  # 8 threads gave the same 2 batches/s
        feed.epoch()
        feed.batches(40)
        feed.batches(40, **IDLE)
        first, second = (e.reason for e in feed.stats.thread_events)
        assert first.startswith("hold: 8 threads gave no more throughput than 2")
        assert second.startswith("hold: consumer-bound")


class TestEpochCeiling:
    """``batches`` (the DataLoader's batches per epoch) bounds the count: a thread reads a batch."""

    def test_growth_stops_at_the_batches_of_an_epoch(self) -> None:
        """Waiting 75% calls for 8 threads; an epoch of 6 batches allows 6, and the hold says it."""
        feed = Feed(ThreadPolicy(cores=2, batches=6))
        assert feed.batches(10) == [(10, 6)]
        assert feed.stats.thread_events[0].reason.endswith(
            "within the 6 batches of an epoch (a thread reads a whole batch)"
        )
        feed.batches(200, every=0.5)  # no gain from 6: reverted to 2 and held; never above 6
        assert max(e.new for e in feed.stats.thread_events) == 6

    def test_at_the_ceiling_the_hold_names_it(self) -> None:
        """Starting at the ceiling (an epoch of 2 batches), a waiting loop gets a hold naming it."""
        feed = Feed(ThreadPolicy(cores=2, batches=2))
        assert feed.batches(100) == []
        (hold,) = feed.stats.thread_events
        assert hold.reason == (
            "hold: the loop waited 75% of the time; at the 2 batches of an epoch "
            "(a thread reads a whole batch)"
        )

    def test_start_capped(self) -> None:
        """An epoch of one batch starts (and stays) at one thread."""
        policy = ThreadPolicy(cores=2, batches=1)
        feed = Feed(policy)
        assert feed.batches(100) == [] and policy.value == 1


class Sleepy(Dataset[torch.Tensor]):
    """Six samples that each take 10 ms of sleeping (I/O: the GIL is released)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.tensor(index)


class TestWithBackgroundLoader:
    """At the grain of batches ``fetch_threads="auto"`` is bounded by the batches per epoch."""

    def test_auto_stays_within_the_epoch(self) -> None:
        """Three batches an epoch, the loop only waiting: auto grows to 3, never to 8."""
        data = DataLoader(Sleepy(), batch_size=2)
        loader = BackgroundLoader(data, fetch_threads="auto", fetch_grain="batch")
        peaks, events = [], []
        for _ in range(14):  # windows of 8 batches span epochs of 3
            assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5]]
            peaks.append(loader.stats.peak_fetch_threads)
            events += loader.stats.thread_events
        assert max(peaks) == 3
        grown = [e for e in events if e.new > e.old]
        assert grown and all(e.new == 3 for e in grown)
        assert "within the 3 batches of an epoch" in grown[0].reason
