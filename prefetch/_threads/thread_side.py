"""``ThreadSide``: what an engine's producer threads do to the state they share.

A producer (:class:`prefetch._threads.producers.Producer`) is given a
:class:`ThreadSide` over its engine's :class:`~prefetch._threads.shared.Shared`
and nothing else of the engine: it takes tickets, posts runs, marks the end,
and its thread leaves through :meth:`ThreadSide.leave`, where the last thread
out releases the source and posts the final message. Every rule these
methods keep is written in :mod:`prefetch._threads.engine`; each method takes
the shared lock for one decision and never calls back into the producer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prefetch._threads.messages import Final, Kind, Message, Run
from prefetch._threads.shared import EARLY_WAKE, Shared
from prefetch._threads.tickets import Held


class ThreadSide:
    """The threads' calls on their engine's shared state (see the module)."""

    __slots__ = ("shared",)

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def thread_count(self) -> int:
        """The threads wanted now (what :func:`~prefetch.fetch_info` reports)."""
        with self.shared.lock:
            return self.shared.tickets.threads

    def take_tickets(
        self, held: Held, most: int, *, unless: Callable[[], bool] | None = None
    ) -> int:
        """Wait for free tickets and take up to ``most``; 0: the thread is to leave instead.

        With ``unless``, return -1 (no ticket) as soon as ``unless()`` is true:
        a thread that reads units has some to read (:meth:`work_added` wakes it).
        Under the GIL, one thread over an iterator (``early_wakes``: its draws
        are quick) that takes at most :data:`~prefetch._threads.shared.EARLY_WAKE`
        tickets wakes a loop waiting for a run already here: the loop runs
        only once this thread blocks, after its post, and one woken that
        early takes the interpreter at once, where one woken by the post
        itself wakes up only after the thread blocked (the hand-off at depths
        2 and 8, docs/benchmarks). Woken earlier than that, before many draws,
        it would be asleep again by then.
        """
        shared = self.shared
        with shared.lock:
            blocked = 0.0
            while True:
                if shared.stopped:
                    return 0
                if unless is not None and unless():
                    return -1
                if shared.ended:
                    return 0
                if shared.staying > shared.tickets.threads:  # fewer wanted: it leaves
                    shared.staying -= 1
                    return 0
                free = shared.tickets.free()
                if free:
                    break
                if not blocked:
                    blocked = time.perf_counter()
                shared.waiting += 1
                shared.woken = False
                try:
                    shared.space.wait(shared.poll)
                finally:
                    shared.waiting -= 1
            if blocked:
                shared.blocked += time.perf_counter() - blocked
            wake = shared.early_wakes and shared.consumer_waiting and not shared.consumer_woken
            if wake and min(free, most) <= EARLY_WAKE:
                shared.wake_consumer()  # early: see above
            return shared.tickets.take(held, most)

    def end(self, *, source_ended: bool) -> None:
        """Mark the epoch ended (a final message is coming): no thread draws again."""
        with self.shared.lock:
            self.shared.ended = True
            if source_ended:
                self.shared.record.source_ended = True

    def post(
        self,
        seq: int,
        run: Run,
        held: Held,
        *,
        seconds: float,
        unused: int = 0,
        take: int = 0,
        cpu: float = 0.0,
        slot: int = -1,
        collate: float = 0.0,
        wait: bool = False,
    ) -> int:
        """Post ``run`` at ``seq``, give back ``unused`` tickets and take up to ``take`` more.

        Returns the tickets taken: without ``wait``, 0 if none is free; with
        it, :meth:`take_tickets`' answer (0: the thread is to leave), waiting
        under the same hold of the lock as the post. A thread that would wait
        next anyway waits here at once: the consumer this post woke runs as
        soon as it can, instead of waiting for the GIL while this thread comes
        back to wait. ``seconds`` (``cpu``) is the time the thread spent making
        the run; a thread that reads units also gives its ``slot`` in
        ``stats.fetch_seconds`` and the seconds spent in ``collate_fn``.
        """
        shared = self.shared
        with shared.lock:
            tickets = shared.tickets
            tickets.posted(held, run.numbers + unused, unused)
            self._count(slot, seconds - collate, cpu, collate=collate)
            shared.record.stats.record_loading_clocks()
            if shared.stopped and not shared.keep:  # nobody will take it
                tickets.in_flight -= run.numbers
                return 0
            shared.fetched += len(run.items)
            stats = shared.record.stats
            if run.sizes:
                tickets.buffered(run.sizes)
                shared.record.largest_item = max(shared.record.largest_item, tickets.largest_item)
                stats.peak_bytes = max(stats.peak_bytes, tickets.buffered_bytes)
                if shared.waiting and shared.fetched <= len(run.items):
                    shared.space.notify_all()  # a size is known now
            if run.items or run.end is not None:
                shared.handover.post(seq, run)
            stats.peak_items = max(stats.peak_items, shared.fetched - stats.items)
            if shared.consumer_waiting and not shared.consumer_woken and shared.handover.due(seq):
                shared.wake_consumer()
            if wait:
                return self.take_tickets(held, take)
            if not take or shared.ended or shared.staying > tickets.threads:
                return 0
            return tickets.take(held, take)

    def give_back_ticket(self, held: Held) -> None:
        """Return one ticket ``held`` took and did not use (the thread reads instead)."""
        shared = self.shared
        with shared.lock:
            shared.tickets.dropped(held, 1)
            if shared.waiting:
                shared.space.notify_all()

    def work_added(self, samples: int) -> None:
        """A batch's units were put on the board: wake the threads waiting for tickets."""
        shared = self.shared
        with shared.lock:
            stats = shared.record.stats
            stats.peak_samples = max(stats.peak_samples, samples)
            if shared.waiting:
                shared.space.notify_all()

    def account(self, slot: int, seconds: float, cpu: float, *, reads: int = 0) -> None:
        """Count ``seconds`` (``cpu``) a thread spent without posting (``slot`` -1: drawing)."""
        with self.shared.lock:
            self._count(slot, seconds, cpu, reads=reads)

    def _count(
        self, slot: int, seconds: float, cpu: float, *, collate: float = 0.0, reads: int = 0
    ) -> None:
        """Add a thread's time to the stats and the engine's sums (holding the lock)."""
        shared = self.shared
        stats = shared.record.stats
        stats.source_seconds += seconds + collate
        stats.collate_seconds += collate
        if slot >= 0:
            stats.fetch_seconds[slot] += seconds
            stats.fetch_reads[slot] += reads
        shared.busy += seconds + collate
        shared.cpu += cpu
        if reads:
            shared.reads += reads
            if shared.tell_at is not None and shared.reads >= shared.tell_at:
                shared.tell_at = None  # once: the consumer decides on them (a policy's start)
                shared.told = True
                shared.data.notify()

    def add_fetch_slot(self) -> int:
        """Give a thread that reads units its entry in ``stats.fetch_seconds``; return it."""
        with self.shared.lock:
            stats = self.shared.record.stats
            stats.fetch_seconds.append(0.0)
            stats.fetch_reads.append(0)
            return len(stats.fetch_seconds) - 1

    def fail(self, error: BaseException) -> Final:
        """The final message for a failure of the thread's own (numbered after every draw)."""
        shared = self.shared
        with shared.draw_lock:
            seq = shared.next_seq
            shared.next_seq = seq + 1
            self.end(source_ended=False)
        return Final(seq, Message(Kind.RAISE_AND_END, error, None))

    def leave(self, final: Final | None, held: Held) -> bool:
        """Leave; the last thread out releases the source, then posts the final message.

        Returns whether this thread was the last to leave.
        """
        shared = self.shared
        with shared.lock:
            shared.tickets.dropped(held, held.tickets)  # a final message holds no ticket
            if final is not None:
                shared.ended = True
                if shared.final is None or final.seq < shared.final.seq:
                    shared.final = final
                shared.space.notify_all()
            shared.running -= 1
            if shared.running:
                return False
            shared.releasing = True
            final = shared.final
        try:
            shared.tasks.release()
        except BaseException as error:
            if (final is not None and final.message.kind is Kind.RAISE_AND_END) or shared.stopped:
                raise  # nobody would read it after the source's own error: threading.excepthook
            seq = final.seq if final is not None else shared.next_seq  # nobody draws now
            final = Final(seq, Message(Kind.RAISE_AND_END, error, None))
        finally:
            with shared.lock:
                if final is not None and (shared.keep or not shared.stopped):
                    shared.handover.post(final.seq, Run([], end=final.message))
                if shared.stopped and not shared.keep:  # nobody reads them: free them now
                    shared.handover.clear()
                shared.releasing = False
                shared.data.notify_all()
        return True
