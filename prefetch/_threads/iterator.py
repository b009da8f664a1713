"""``BackgroundIterator``: the consumer end of one epoch's engine.

The threads and what they share live in :mod:`prefetch._threads.engine`.
This module takes the runs the threads post, hands their items over one by
one, keeps the epoch's stats and checkpoint state, reports to the depth and
thread policies if they adapt, and stops the engine when the epoch ends, on
``close()``, or when the iterator is collected.

Invariants:

* **The fast path holds no lock.** Items of a run taken from the engine are
  handed over by :meth:`BackgroundIterator.__next__` alone: no lock, no
  clock, no policy. Every quarter of what the bounds let in flight (the
  depth, or the items ``max_bytes`` holds; at least every item), and
  whenever the items taken run out, the slow path gives their tickets back
  and takes the runs posted since
  (:meth:`~prefetch._threads.engine.Engine.exchange`). A run's first and
  last items take the slow path too, which
  stamps ``stats.last_handoff`` (so an epoch's time ends at its last item,
  to within a quarter of the depth when the loop stops in a run's middle).
  An item handed over is no longer referenced by the run, so the loop alone
  decides how long it lives.
* **Reports are exact.** The slow path reports to adaptive policies at once
  when the loop waited or nearly did, and otherwise after exactly
  ``max(REPORT_EVERY, depth)`` quiet hand-offs: the fast path stops there.
* Only the latest epoch reports to the depth and thread policies; an older
  one still open keeps the depth and threads it had.
* An ``Exception`` the source raised (``RAISE_AND_GO_ON``) is re-raised in its place
  and the epoch goes on: the next ``next()`` returns what the source gave
  after it. A final error (``RAISE_AND_END``: a ``BaseException``, or the error of a
  DataLoader that lost a worker process) or the end stops the engine first.
* The frame that re-raises an error does not hold the iterator (``self`` is
  deleted before the error leaves), so an error kept alive by its caller
  does not keep the iterator, its threads or its source's workers alive.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from prefetch._shared.epoch import CLOSE_TIMEOUT, STUCK_GRACE, EpochIterator, EpochRecord, Opener
from prefetch._threads.engine import Engine
from prefetch._threads.messages import Kind, Message, Run
from prefetch._threads.policy import THREADS, Control, Fixed

T = TypeVar("T")

EngineFactory = Callable[[Iterator[Any], EpochRecord, bool, "Callable[[], Any] | None"], Engine]
"""Makes an epoch's engine: (source, record, owned, read_state), as :meth:`_run` gets them."""

REPORT_EVERY = 16
"""Quiet hand-offs reported to the policies at once (or the depth's worth, if more)."""


class BackgroundIterator(EpochIterator[T]):
    """One epoch of a :class:`BackgroundLoader`: the consumer end of its threads.

    Created by ``iter(background_loader)``; you rarely name it. Its first
    ``next()`` (or :meth:`start`) starts the epoch. It stops its
    threads at the end of the data, on a ``BaseException`` from the source
    (an ``Exception`` is re-raised and the epoch goes on), on :meth:`close`,
    at the end of a ``with`` block and when garbage-collected.

    Example:
        >>> from prefetch import BackgroundLoader
        >>> iterator = iter(BackgroundLoader(range(100)))
        >>> next(iterator), next(iterator)
        (0, 1)
        >>> iterator.close()
        >>> next(iterator)
        Traceback (most recent call last):
        ...
        StopIteration
    """

    def __init__(
        self,
        opener: Opener,
        engine_for: EngineFactory,
        *,
        depth: Control,
        threads: Control | None = None,
    ) -> None:
        if threads is None:
            threads = Fixed(THREADS, 1)
        self._opener = opener
        self._engine_for = engine_for
        self._engine: Engine | None = None  # made when the epoch runs
        self._record = EpochRecord(None)  # a placeholder until then
        self._depth = depth
        self._threads = threads
        # The current run (items handed over are set to None) and the runs behind it.
        self._items: list[Any] = []
        self._states: list[Any] | None = None
        self._sizes: list[int] | None = None
        self._end_message: Message | None = None
        self._pos = 0  # the current run's next item
        self._fast_until = 0  # items before this index are handed over by the fast path
        self._queued: deque[Run] = deque()
        # Tickets to give back: earlier runs' (and errors'), and the current run's from here.
        self._unreturned = self._unreturned_bytes = 0
        self._returned_pos = 0
        self._items_at_exchange = 0  # stats.items when tickets were last given back
        self._largest = 0  # bytes of the largest item taken (with a byte bound)
        self._return_every = max(1, depth.value // 4)
        # What the policies are told at the next report.
        self._reports = depth.adaptive or threads.adaptive  # fixed ones hear nothing
        self._waited = 0.0  # seconds the last exchange waited
        self._handed_over = 0.0  # perf_counter() at the last report
        self._reported_items = 0  # stats.items at the last report
        self._fewest = 0  # the fewest items ready at a report point since (0: report at once)
        self._done = False
        self._source_error_id: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _run(
        self,
        source: Iterator[Any],
        record: EpochRecord,
        *,
        owned: bool,
        read_state: Callable[[], Any] | None,
    ) -> None:
        """Run the epoch: make its engine over ``source`` and start its threads."""
        self._depth.start_epoch(record.stats)
        self._threads.start_epoch(record.stats)
        engine = self._engine_for(source, record, owned, read_state)
        self._engine = self._stopper = engine
        self._record = record
        self._return_every = self._return_interval()
        self._finalizer = finalizer = weakref.finalize(self, engine.stop)
        finalizer.atexit = False
        try:
            engine.start()
        except BaseException:  # e.g. Ctrl-C while Thread.start() waits: never leave it running
            finalizer()
            raise

    def __next__(self) -> T:
        pos = self._pos
        if pos < self._fast_until:
            self._pos = pos + 1
            record = self._record
            record.stats.items += 1
            states = self._states
            if states is not None:
                record.state = states[pos]
            items = self._items
            item = items[pos]
            items[pos] = None  # the loop holds it now, not the run
            return item  # type: ignore[no-any-return]  # an item is whatever the source made
        try:
            return self._next_slow()
        finally:
            del self  # a traceback keeps this frame: not the iterator (see the invariants)

    def _next_slow(self) -> T:
        """Hand over the next item with the bookkeeping the fast path skips."""
        try:
            if self._opener is not None:
                self.start()  # the first next(): the epoch starts now, on this thread
            while not self._done:
                pos, items = self._pos, self._items
                if pos < len(items):
                    self._pos = pos + 1
                    record = self._record
                    stats = record.stats
                    stats.items += 1
                    if self._states is not None:
                        record.state = self._states[pos]
                    item = items[pos]
                    items[pos] = None
                    handed = stats.items - self._items_at_exchange
                    if handed >= self._return_every or (pos + 1 == len(items) and not self._queued):
                        self._exchange(wait=False)  # tickets back; the runs posted since
                        handed = 0
                    stats.last_handoff = time.perf_counter()
                    if self._reports:
                        self._note_hand_over(self._ready())
                    # The fast path stops before a return point, a report and a run's last item.
                    until = min(len(items) - 1, pos + self._return_every - handed)
                    if self._reports:
                        until = min(until, pos + self._report_due(stats.items))
                    self._fast_until = until
                    return item  # type: ignore[no-any-return]
                if self._end_message is not None:
                    self._take_end()
                    continue
                if self._queued:
                    self._load(self._queued.popleft())
                    continue
                self._exchange(wait=True)
                if self._waited:
                    self._fewest = 0  # the loop waited: reported with the next item
            self._end()
        finally:
            del self  # a traceback keeps this frame: not the iterator (see the invariants)

    def _ready(self) -> int:
        """Items ready to hand over now (taken from the engine), this one included."""
        return len(self._items) - self._pos + 1 + sum(len(run.items) for run in self._queued)

    def _load(self, run: Run) -> None:
        """Make ``run`` the current run; the used-up one's tickets wait to be given back."""
        self._unreturned += len(self._items) - self._returned_pos
        if self._sizes is not None:
            self._unreturned_bytes += sum(self._sizes[self._returned_pos :])
        self._items, self._states, self._sizes = run.items, run.states, run.sizes
        self._end_message = run.end
        self._pos = self._returned_pos = self._fast_until = 0
        if run.sizes and max(run.sizes) > self._largest:
            self._largest = max(run.sizes)
            self._return_every = self._return_interval()

    def _return_interval(self) -> int:
        """Items handed over between two exchanges: a quarter of what the bounds let in flight."""
        limit = self._depth.value
        max_bytes = self._engine.max_bytes if self._engine is not None else None
        if max_bytes is not None and self._largest:
            limit = min(limit, max(1, max_bytes // self._largest))
        return max(1, limit // 4)

    def _exchange(self, *, wait: bool) -> None:
        """Give back the tickets of the items handed over since the last exchange; take runs."""
        pos, start = self._pos, self._returned_pos
        returned = self._unreturned + pos - start
        nbytes = self._unreturned_bytes
        if self._sizes is not None and pos > start:
            nbytes += sum(self._sizes[start:pos])
        self._unreturned = self._unreturned_bytes = 0
        self._returned_pos = pos
        self._items_at_exchange = self._record.stats.items
        assert self._engine is not None  # started: _next_slow starts the epoch first
        runs, waited = self._engine.exchange(returned, nbytes, wait=wait)
        self._queued.extend(runs)
        if waited:
            self._waited = waited  # reported with the next hand-over
            self._record.stats.wait_seconds += waited

    def _take_end(self) -> None:
        """Act on the message after the current run: raise its error, or end the epoch."""
        message, self._end_message = self._end_message, None
        assert message is not None
        if message.kind is Kind.RAISE_AND_GO_ON:  # the source goes on after it: its ticket
            self._unreturned += 1
            if message.state is not None:
                self._record.state = message.state  # the failed batch was drawn: resume after it
            error = message.error
        else:
            self._finish()
            if message.kind is Kind.STOPPED:  # close() from another thread while this one waited
                return
            if message.kind is Kind.END:
                self._record.state = message.state  # read after StopIteration: the next epoch's
                raise StopIteration
            error = message.error
            self._source_error_id = id(error)
        assert error is not None
        del message
        try:
            raise error
        finally:
            del error, self  # the traceback keeps this frame: not the iterator

    def _is_over(self) -> bool:
        return self._done

    def _raised(self, error: BaseException) -> bool:
        return self._source_error_id == id(error)

    def _note_hand_over(self, ready: int) -> None:
        """Report to the policies now if the loop waited or nearly did, else every few items."""
        if ready < self._fewest:
            self._fewest = ready
        items = self._record.stats.items
        fewest, depth = self._fewest, self._depth
        # A near miss at the ceiling changes nothing a wait or the next report would not.
        urgent = fewest == 0 or (fewest == 1 and depth.value < depth.maximum)
        if urgent or self._report_due(items) <= 0:
            try:
                self._adapt(items)
            except BaseException:  # a policy's failure (Ctrl-C included) ends the epoch
                self._finish()
                raise

    def _report_due(self, items: int) -> int:
        """Hand-offs from the one that made ``items`` to the next quiet report."""
        return self._reported_items + max(REPORT_EVERY, self._depth.value) - items

    def _adapt(self, items: int) -> None:
        """Report the hand-offs since the last report to the policies; apply their decisions."""
        stats = self._record.stats
        adapts_depth, adapts_threads = self._depth.drives(stats), self._threads.drives(stats)
        if not adapts_depth and not adapts_threads:
            self._reports = False  # a newer iter() adapts them now; this epoch keeps its own
            return
        now = time.perf_counter()
        assert self._engine is not None
        engine = self._engine.snapshot()
        if adapts_depth:
            fewest = self._fewest
            waited = 0.0 if fewest else self._waited  # only the last hand-off can have waited
            threads = max(engine.threads, 1)  # N threads make an item N times as often
            new = self._depth.observe(
                now=now,
                step=now - self._handed_over - waited,
                waited=waited,
                ready=fewest,
                fetched=engine.fetched,
                busy_seconds=engine.busy_seconds / threads,
                blocked_seconds=engine.blocked_seconds,
                largest_item=engine.largest_item,
                count=max(1, items - self._reported_items),
            )
            if new is not None:
                self._engine.set_depth(new)
                self._return_every = self._return_interval()
        if adapts_threads:
            wanted = self._threads.observe(
                now=now,
                items=items,
                waited=stats.wait_seconds,
                busy_seconds=engine.busy_seconds,
                cpu_seconds=engine.cpu_seconds,
                largest_item=engine.largest_item,
            )
            if wanted is not None:
                self._engine.set_threads(wanted)
        self._handed_over, self._reported_items = now, items
        self._fewest, self._waited = 1 << 62, 0.0

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._record.stats.finished = time.perf_counter()
        self._items, self._states, self._sizes, self._end_message = [], None, None, None
        self._queued.clear()
        self._pos = self._fast_until = 0
        self._opener = None  # an idle epoch closed before its first next() never starts
        if self._finalizer is not None and self._engine is not None:
            self._finalizer()
            self._engine.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)


def started_threads(iterator: BackgroundIterator[Any]) -> tuple[threading.Thread, ...]:
    """The threads ``iterator``'s epoch started (none before it starts)."""
    engine = iterator._engine
    return engine.threads if engine is not None else ()
