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
  depth, or the items ``max_bytes`` holds; at least every item), whenever
  the items taken run out, and at the first item after the loop waited if
  at most :data:`~prefetch._threads.shared.EARLY_WAKE` are ready then (an
  early wake-up: :mod:`prefetch._threads.engine`), the slow path gives their
  tickets back and takes the runs posted since
  (:meth:`~prefetch._threads.consumer_side.ConsumerSide.exchange`). Before
  the items run out it skips that while the thread it woke last has not
  run since
  (:meth:`~prefetch._threads.consumer_side.ConsumerSide.threads_woken_idle`:
  one thread over an iterator, under the GIL, gets the interpreter only
  once the loop lets go of it); the tickets then come back when the items
  taken are used up. A run's first and
  last items take the slow path too, which
  stamps ``stats.last_handoff`` (so an epoch's time ends at its last item,
  to within a quarter of the depth when the loop stops in a run's middle).
  An item handed over is no longer referenced by the run, so the loop alone
  decides how long it lives.
* **Reports are exact** (:mod:`prefetch._threads.reports`): the fast path
  stops where a report to the adaptive policies is due.
* An ``Exception`` the source raised (``RAISE_AND_GO_ON``) is re-raised in its place
  and the epoch goes on: the next ``next()`` returns what the source gave
  after it. A final error (``RAISE_AND_END``: a ``BaseException``, or the error of a
  DataLoader that lost a worker process) or the end stops the engine first.
* The frame that re-raises an error does not hold the iterator (``self`` is
  deleted before the error leaves), nor does any frame between ``next()``
  and the wait for a run, where Ctrl-C lands, so an error kept alive by its
  caller does not keep the iterator, its threads or its source's workers
  alive.
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
from prefetch._threads.reports import Reports
from prefetch._threads.shared import EARLY_WAKE

T = TypeVar("T")

EngineFactory = Callable[
    [Iterator[Any], EpochRecord, bool, bool, "Callable[[], Any] | None", "int | None"], Engine
]
"""Makes an epoch's engine from what ``_launch`` gets: source, record, owned, keep, read_state,
expected."""


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
        self._kick = False  # the loop waited: give tickets back at the next item
        self._largest = 0  # bytes of the largest item taken (with a byte bound)
        self._return_every = max(1, depth.value // 4)
        self._reports = Reports(depth, threads)  # what the policies are told, and when
        self._done = False
        self._source_error_id: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _launch(
        self,
        source: Iterator[Any],
        record: EpochRecord,
        *,
        owned: bool,
        keep: bool,
        read_state: Callable[[], Any] | None,
        expected: int | None,
    ) -> None:
        """Run the epoch: make its engine over ``source`` and start its threads."""
        self._depth.start_epoch(record.stats)
        self._threads.start_epoch(record.stats)
        engine = self._engine_for(source, record, owned, keep, read_state, expected)
        self._engine = self._stopper = engine
        self._record = record
        self._return_every = self._return_interval()
        self._finalizer = finalizer = weakref.finalize(self, engine.stop)
        finalizer.atexit = False
        self._reports.start(engine)
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
                    used_up = pos + 1 == len(items) and not self._queued
                    if handed >= self._return_every or self._kick or used_up:
                        self._exchange(wait=False, skip=not used_up)  # tickets back; new runs
                        handed = 0
                    stats.record_hand_over(time.perf_counter())
                    reports = self._reports
                    if reports.active:
                        self._report(reports)
                    # The fast path stops before a return point, a report and a run's last item.
                    until = min(len(items) - 1, pos + self._return_every - handed)
                    if reports.active:
                        until = min(until, pos + reports.due(stats.items))
                    self._fast_until = until
                    return item  # type: ignore[no-any-return]
                if self._end_message is not None:
                    self._take_end()
                    continue
                if self._queued:
                    self._load(self._queued.popleft())
                    continue
                self._exchange(wait=True)
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

    def _exchange(self, *, wait: bool, skip: bool = False) -> None:
        """Give back the tickets of the items handed over since the last exchange; take runs.

        ``skip``: not while the thread woken last has not run since (see the module).
        """
        assert self._engine is not None  # started: _next_slow starts the epoch first
        engine = self._engine
        if skip and engine.consumer.threads_woken_idle():
            self._items_at_exchange = self._record.stats.items
            self._kick = False
            return
        pos, start = self._pos, self._returned_pos
        returned = self._unreturned + pos - start
        nbytes = self._unreturned_bytes
        if self._sizes is not None and pos > start:
            nbytes += sum(self._sizes[start:pos])
        self._unreturned = self._unreturned_bytes = 0
        self._returned_pos = pos
        self._items_at_exchange = self._record.stats.items
        self._kick = False
        try:
            runs, waited = engine.consumer.exchange(returned, nbytes, wait=wait)
            if engine.told():  # the reads the thread policy asked to hear of are done
                self._reports.reads_done(engine)
            self._queued.extend(runs)
            if waited:
                self._kick = self._ready() <= EARLY_WAKE
                self._reports.waited(waited)
                self._record.stats.record_wait(waited)
        finally:
            del self  # Ctrl-C in the wait: its traceback keeps this frame, not the iterator

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
            if message.kind is Kind.END:  # before the epoch is over: where it leaves the source
                self._record.state = message.state  # read after StopIteration: the next epoch's
            self._finish()
            if message.kind is Kind.STOPPED:  # close() from another thread while this one waited
                return
            if message.kind is Kind.END:
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

    def _report(self, reports: Reports) -> None:
        """Tell the policies of this hand-over (a policy's failure ends the epoch)."""
        assert self._engine is not None  # a hand-over: the epoch runs
        try:
            if reports.hand_over(self._ready(), self._record.stats, self._engine):
                self._return_every = self._return_interval()
        except BaseException:  # Ctrl-C included
            self._finish()
            raise

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._record.stats.finished = time.perf_counter()
            engine = self._engine
            if engine is not None and engine.keeps:  # a one-shot source: the next epoch's
                engine.keep_front(self._read_ahead())
        self._items, self._states, self._sizes, self._end_message = [], None, None, None
        self._queued.clear()
        self._pos = self._fast_until = 0
        self._opener = None  # an idle epoch closed before its first next() never starts
        if self._finalizer is not None and self._engine is not None:
            self._finalizer()
            left = self._engine.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)
            self._record.over(None if left else self._engine)

    def _read_ahead(self) -> list[Run]:
        """The runs taken from the engine and not handed over yet, in order."""
        runs = []
        pos, items = self._pos, self._items
        if pos < len(items) or self._end_message is not None:
            runs.append(Run(items[pos:], end=self._end_message))
        runs.extend(self._queued)
        return runs

    def __del__(self) -> None:
        # A `break` drops the iterator: over a one-shot source what it read ahead
        # is kept for the next epoch (the finalizer, which cannot see it, stops the engine).
        # Over a seeded shuffle the generators go back to where the loop stopped, now.
        engine = getattr(self, "_engine", None)
        if engine is not None and engine.keeps and not self._done:
            self._done = True
            engine.keep_front(self._read_ahead())
            engine.stop()
        elif engine is not None and self._record.sampling is not None:
            self._finish()


def started_threads(iterator: BackgroundIterator[Any]) -> tuple[threading.Thread, ...]:
    """The threads ``iterator``'s epoch started (it must have started)."""
    engine = iterator._engine
    assert engine is not None  # started: its caller starts it first
    return engine.threads
