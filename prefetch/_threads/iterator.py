"""``BackgroundIterator``: the consumer end of one epoch's engine.

The threads and what they share live in :mod:`prefetch._threads.engine`.
This module takes items from the engine, keeps the epoch's stats and
checkpoint state, reports hand-offs to the depth and thread policies if they
adapt, and stops the engine when the epoch ends, on ``close()``, or when the
iterator is collected.

Invariants:

* Only the latest epoch reports to the depth and thread policies; an older
  one still open keeps the depth and threads it had.
* An ``Exception`` the source raised (``RAISED``) is re-raised and the epoch
  goes on: the next ``next()`` returns what the source gave after it. A final
  error (``ERROR``) or the end stops the engine first.
* The frame that re-raises an error does not hold the iterator (``self`` is
  deleted before the error leaves), so an error kept alive by its caller
  does not keep the iterator, its threads or its source's workers alive.
"""

from __future__ import annotations

import time
import weakref
from typing import TypeVar

from prefetch._shared.epoch import CLOSE_TIMEOUT, STUCK_GRACE, EpochIterator, EpochRecord
from prefetch._threads.engine import Engine
from prefetch._threads.messages import END, ITEM, RAISED, STOPPED
from prefetch._threads.policy import THREADS, Control, Fixed

T = TypeVar("T")

REPORT_EVERY = 16
"""Quiet hand-offs (two or more items ready) reported to a depth policy at once."""


class BackgroundIterator(EpochIterator[T]):
    """One epoch of a :class:`BackgroundLoader`: the consumer end of its threads.

    Created by ``iter(background_loader)``; you rarely name it. It stops its
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
        engine: Engine,
        record: EpochRecord,
        *,
        depth: Control,
        threads: Control | None = None,
    ) -> None:
        if threads is None:
            threads = Fixed(THREADS, 1)
        depth.start_epoch(record.stats)
        threads.start_epoch(record.stats)
        self._engine = engine
        self._record = record
        self._stopper = engine
        self._depth = depth
        self._threads = threads
        self._reports = depth.adaptive or threads.adaptive  # fixed ones hear nothing
        self._waited = 0.0
        self._handed_over = 0.0  # perf_counter() at the last report to the policy
        self._pending = 0  # hand-offs since then
        self._fewest = 0  # the fewest items ready among them (0: report the first at once)
        self._done = False
        self._source_error_id: int | None = None
        self._finalizer = weakref.finalize(self, engine.stop)
        self._finalizer.atexit = False
        try:
            engine.start()
        except BaseException:  # e.g. Ctrl-C while Thread.start() waits: never leave it running
            self._finalizer()
            raise

    def __next__(self) -> T:
        if self._done:
            self._end()
        (kind, payload, state, _), ready, waited = self._engine.take()
        if waited:
            self._waited = waited
            self._record.stats.wait_seconds += waited
        if kind == ITEM:
            record = self._record
            record.stats.items += 1
            record.state = state  # None unless the loader is stateful
            if self._reports:
                # Quiet hand-offs (two or more ready) are reported in batches; a wait
                # or a near miss is reported at once, so a decision is never late.
                self._pending += 1
                if ready < self._fewest:
                    self._fewest = ready
                if self._fewest <= 1 or self._pending >= REPORT_EVERY:
                    try:
                        self._adapt()
                    except BaseException:  # a policy's failure (Ctrl-C included) ends the epoch
                        self._finish()
                        raise
            return payload  # type: ignore[no-any-return]  # an item is whatever the source made
        if kind == RAISED:  # the source goes on after it
            if state is not None:
                self._record.state = state  # the failed batch was drawn: resume after it
        else:
            self._finish()
            if kind == STOPPED:  # close() from another thread while this one waited
                return self.__next__()
            if kind == END:
                self._record.state = state  # read after StopIteration: the next epoch's start
                raise StopIteration
            self._source_error_id = id(payload)
        try:
            raise payload
        finally:
            del payload, self  # the traceback keeps this frame: not the iterator

    def _is_over(self) -> bool:
        return self._done

    def _raised(self, error: BaseException) -> bool:
        return self._source_error_id == id(error)

    def _adapt(self) -> None:
        """Report the hand-offs since the last report to the policies; apply their decisions."""
        stats = self._record.stats
        adapts_depth, adapts_threads = self._depth.drives(stats), self._threads.drives(stats)
        if not adapts_depth and not adapts_threads:
            self._reports = False  # a newer iter() adapts them now; this epoch keeps its own
            return
        now = time.perf_counter()
        engine = self._engine.snapshot()
        if adapts_depth:
            fewest, count = self._fewest, self._pending
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
                count=count,
            )
            if new is not None:
                self._engine.set_depth(new)
        if adapts_threads:
            wanted = self._threads.observe(
                now=now,
                items=stats.items,
                waited=stats.wait_seconds,
                busy_seconds=engine.busy_seconds,
                cpu_seconds=engine.cpu_seconds,
                largest_item=engine.largest_item,
            )
            if wanted is not None:
                self._engine.set_threads(wanted)
        self._handed_over = now
        self._pending, self._fewest = 0, 1 << 62

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._record.stats.finished = time.perf_counter()
        self._finalizer()
        self._engine.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)
