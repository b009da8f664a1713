"""The threads' side of an :class:`~prefetch._threads.engine.Engine`.

One class split over two modules for size: :class:`ThreadSide` holds what the
fetch threads call (taking tickets, posting runs, leaving) and the engine
inherits it. Its methods act on an ``Engine`` (``self``); every
invariant they keep is written in :mod:`prefetch._threads.engine`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prefetch._threads.messages import ERROR, Final, Message, Run
from prefetch._threads.producers import Held

if TYPE_CHECKING:
    from prefetch._shared.epoch import EpochRecord
    from prefetch._threads.engine import Engine
    from prefetch._threads.tasks import ProducerSpec, Tasks

POLL_SECONDS = 0.1
"""How often a blocked side re-checks that the other side is still there."""

live: set[Engine] = set()
"""Engines with a thread that has not left (the interpreter's exit stops them)."""


class ThreadSide:
    """What the fetch threads call on their engine (see :mod:`prefetch._threads.engine`).

    The fields are the engine's (``Engine.__init__`` sets and describes them).
    """

    tasks: Tasks
    spec: ProducerSpec
    record: EpochRecord
    in_order: bool
    max_bytes: int | None
    next_seq: int
    consumer_waiting: bool
    stopped: bool
    _lock: threading.RLock
    _space: threading.Condition
    _data: threading.Condition
    _depth: int
    _threads_wanted: int
    _posted: dict[int, Run]
    _taken: int
    _in_flight: int
    _unposted: int
    _buffered_bytes: int
    _fetched: int
    _largest_item: int
    _probe_first: bool
    _busy: float
    _blocked: float
    _cpu: float
    _threads_staying: int
    _threads_running: int
    _threads_waiting: int
    _threads_woken: bool
    _releasing: bool
    _ended: bool
    _sample_grain: bool
    _final: Final | None
    _indices: set[int]

    def _wake_consumer(self) -> None:
        """Wake the consumer waiting for a run (holding the lock); the tests' seam likewise."""
        self._data.notify()

    def thread_count(self) -> int:
        """The threads wanted now (what :func:`~prefetch.fetch_info` reports)."""
        with self._lock:
            return self._threads_wanted

    # What the threads call (from prefetch._threads.producers), and the hints they read.

    @property
    def over(self) -> bool:
        """Whether the epoch ended or the engine stopped (a hint read without the lock)."""
        return self._ended or self.stopped

    def _limit(self) -> int:
        # Each thread may hold a batch besides the depth ready ones. At the grain of
        # samples a batch is drawn only when no unit waits, so the batches being read
        # are the one being started plus those with a read in progress: one or two,
        # with small batches up to one per thread (sample_fetch).
        return self._depth + self._threads_wanted - 1

    def _free(self) -> int:
        """Tickets that may be taken now (see the invariants)."""
        free = self._limit() - self._in_flight
        if free <= 0:
            return 0
        limit = self.max_bytes
        if limit is None:
            return free
        largest = self._largest_item
        if largest:
            room = (limit - self._buffered_bytes) // largest - self._unposted
        elif self._probe_first:
            room = 0 if self._unposted else 1  # one draw at a time until a size is known
        else:
            room = free
        if self._in_flight == 0:
            room = max(room, 1)  # one item always flows
        return max(min(free, room), 0)

    def take_tickets(
        self, held: Held, most: int, *, unless: Callable[[], bool] | None = None
    ) -> int:
        """Wait for free tickets and take up to ``most``; 0: the thread is to leave instead.

        With ``unless``, return -1 (no ticket) as soon as ``unless()`` is true:
        a sample-grain thread has units to read (:meth:`work_added` wakes it).
        """
        with self._lock:
            blocked = 0.0
            while True:
                if self.stopped:
                    return 0
                if unless is not None and unless():
                    return -1
                if self._ended:
                    return 0
                if self._threads_staying > self._threads_wanted:  # fewer wanted: this one leaves
                    self._threads_staying -= 1
                    return 0
                free = self._free()
                if free:
                    break
                if not blocked:
                    blocked = time.perf_counter()
                self._threads_waiting += 1
                self._threads_woken = False
                try:
                    self._space.wait(POLL_SECONDS)
                finally:
                    self._threads_waiting -= 1
            if blocked:
                self._blocked += time.perf_counter() - blocked
            count = min(free, most)
            self._in_flight += count
            self._unposted += count
            held.tickets += count
            return count

    def end(self, source_ended: bool) -> None:
        """Mark the epoch ended (a final message is coming): no thread draws again."""
        with self._lock:
            self._ended = True
            if source_ended:
                self.record.source_ended = True

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
    ) -> int:
        """Post ``run`` at ``seq``, give back ``unused`` tickets and take up to ``take`` more.

        Returns the tickets taken (without waiting: 0 if none is free).
        ``seconds`` (``cpu``) is the time the thread spent making the run; a
        parallel thread also gives its ``slot`` in ``stats.fetch_seconds`` and
        the seconds spent in ``collate_fn``.
        """
        with self._lock:
            tickets = len(run.items) + (run.end is not None) + unused
            held.tickets -= tickets
            self._unposted -= tickets
            self._in_flight -= unused
            stats = self.record.stats
            stats.source_seconds += seconds
            if slot >= 0:
                stats.fetch_seconds[slot] += seconds - collate
                stats.collate_seconds += collate
            self._busy += seconds
            self._cpu += cpu
            if self.stopped:  # nobody will take it
                self._in_flight -= tickets - unused
                return 0
            self._fetched += len(run.items)
            if run.sizes:
                self._buffered_bytes += sum(run.sizes)
                largest = max(run.sizes)
                if largest > self._largest_item:
                    self._largest_item = self.record.largest_item = largest
                if self._buffered_bytes > stats.peak_bytes:
                    stats.peak_bytes = self._buffered_bytes
                if self._threads_waiting and self._fetched <= len(run.items):
                    self._space.notify_all()  # a size is known now
            if run.items or run.end is not None:
                self._posted[seq] = run
            if self._in_flight > stats.peak_items:
                stats.peak_items = self._in_flight
            if self.consumer_waiting and (seq == self._taken or not self.in_order):
                self._wake_consumer()
            if not take or self._ended or self._threads_staying > self._threads_wanted:
                return 0
            count = min(self._free(), take)
            self._in_flight += count
            self._unposted += count
            held.tickets += count
            return count

    def give_back_ticket(self, held: Held) -> None:
        """Return one ticket ``held`` took and did not use (a sample-grain thread reads instead)."""
        with self._lock:
            self._in_flight -= 1
            self._unposted -= 1
            held.tickets -= 1
            if self._threads_waiting:
                self._space.notify_all()

    def work_added(self, samples: int) -> None:
        """A batch's units were put on the board: wake the threads waiting for tickets."""
        with self._lock:
            stats = self.record.stats
            if samples > stats.peak_samples:
                stats.peak_samples = samples
            if self._threads_waiting:
                self._space.notify_all()

    def account(self, slot: int, seconds: float, cpu: float, *, reads: int = 0) -> None:
        """Count ``seconds`` (``cpu``) a thread spent without posting (``slot`` -1: drawing)."""
        with self._lock:
            stats = self.record.stats
            stats.source_seconds += seconds
            if slot >= 0:
                stats.fetch_seconds[slot] += seconds
                stats.fetch_reads[slot] += reads
            self._busy += seconds
            self._cpu += cpu

    def add_fetch_slot(self) -> int:
        """Give a parallel thread its entry in ``stats.fetch_seconds``; return its index."""
        with self._lock:
            fetch_seconds = self.record.stats.fetch_seconds
            fetch_seconds.append(0.0)
            self.record.stats.fetch_reads.append(0)
            return len(fetch_seconds) - 1

    def leave(self, final: Final | None, held: Held) -> None:
        """Leave; the last thread out releases the source, then posts the final message."""
        with self._lock:
            self._in_flight -= held.tickets  # a final message holds no ticket
            self._unposted -= held.tickets
            held.tickets = 0
            if final is not None:
                self._ended = True
                if self._final is None or final.seq < self._final.seq:
                    self._final = final
                self._space.notify_all()
            self._threads_running -= 1
            last = self._threads_running == 0
            if last:
                self._releasing = True
                final = self._final
        if not last:
            return
        try:
            self.tasks.release()
        except BaseException as error:
            if (final is not None and final.message.kind == ERROR) or self.stopped:
                raise  # nobody would read it after the source's own error: threading.excepthook
            seq = final.seq if final is not None else self.next_seq
            final = Final(seq, Message(ERROR, error, None))
        finally:
            with self._lock:
                if final is not None and not self.stopped:
                    self._posted[final.seq] = Run([], end=final.message)
                if self.stopped:  # nobody will read them: free the fetched items now
                    self._posted.clear()
                self._releasing = False
                self._data.notify_all()
            live.discard(self)
