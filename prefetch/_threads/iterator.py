"""``BackgroundIterator``: the consumer end of one epoch's engine.

The threads and what they share live in :mod:`prefetch._threads.engine`. This module
takes items from the engine, keeps the epoch's stats and checkpoint state,
reports each hand-off to the adaptive depth and thread policies if there are
any, and stops the engine when the epoch ends, on ``close()``, or when the
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
* An iterator another epoch had to stop (``_invalidate``)
  raises ``RuntimeError`` saying why on its next ``next()``, then
  ``StopIteration``: it never ends silently.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import TypeVar

from prefetch._shared.stats import EpochRecord, LoaderStats
from prefetch._threads.depth_policy import DepthControl
from prefetch._threads.engine import END, ITEM, RAISED, STOPPED, Engine
from prefetch._threads.tasks import ProducerSpec, Tasks
from prefetch._threads.thread_policy import FixedThreads, ThreadControl

T = TypeVar("T")

CLOSE_TIMEOUT = 10.0
"""Longest ``close()`` waits for the threads (shutting down DataLoader workers)."""
STUCK_GRACE = 0.2
"""How long ``close()`` waits for a thread that is blocked inside the source."""
REPORT_EVERY = 16
"""Quiet hand-offs (two or more items ready) reported to a depth policy at once."""


class BackgroundIterator(Iterator[T]):
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
        tasks: Tasks,
        epoch: EpochRecord,
        *,
        control: DepthControl,
        max_bytes: int | None,
        producer: ProducerSpec,
        threads: ThreadControl | None = None,
        size_hint: int = 0,
        probe_first: bool = False,
    ) -> None:
        control.start_epoch(epoch.stats)
        threads = threads if threads is not None else FixedThreads(1)
        threads.start_epoch(epoch.stats)
        self._engine = Engine(
            tasks,
            producer,
            depth=control.depth,
            threads=threads.threads,
            max_bytes=max_bytes,
            stats=epoch.stats,
            measure_cpu=threads.adaptive,
            size_hint=size_hint,
            probe_first=probe_first,
        )
        self._epoch = epoch
        self._control = control
        self._threads = threads
        self._reports = control.adaptive or threads.adaptive  # fixed ones hear nothing
        self._waited = 0.0
        self._handed_over = 0.0  # perf_counter() at the last report to the policy
        self._pending = 0  # hand-offs since then
        self._fewest = 0  # the fewest items ready among them (0: report the first at once)
        self._done = False
        self._invalid: str | None = None  # why another epoch stopped this one
        self._keeps_state = producer.read_state is not None
        self._source_error_id: int | None = None
        self._finalizer = weakref.finalize(self, self._engine.stop)
        self._finalizer.atexit = False
        try:
            self._engine.start()
        except BaseException:  # e.g. Ctrl-C while Thread.start() waits: never leave it running
            self._finalizer()
            raise

    @property
    def stats(self) -> LoaderStats:
        """This epoch's :class:`~prefetch.LoaderStats`."""
        return self._epoch.stats

    def __iter__(self) -> BackgroundIterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            reason, self._invalid = self._invalid, None
            if reason is not None:
                raise RuntimeError(reason)
            raise StopIteration
        (kind, payload, state, _), ready, waited = self._engine.take()
        if waited:
            self._waited = waited
            self._epoch.stats.wait_seconds += waited
        if kind == ITEM:
            epoch = self._epoch
            epoch.stats.items += 1
            epoch.state = state  # None unless the loader is stateful
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
            return payload  # type: ignore[no-any-return]  # messages are untyped tuples
        if kind == RAISED:  # the source goes on after it
            if state is not None:
                self._epoch.state = state  # the failed batch was drawn: resume after it
        else:
            self._finish()
            if kind == STOPPED:  # close() from another thread while this one waited
                return self.__next__()
            if kind == END:
                if self._keeps_state:
                    self._epoch.state = state  # read after StopIteration: the next epoch
                raise StopIteration
            self._source_error_id = id(payload)
        try:
            raise payload
        finally:
            del payload, self  # the traceback keeps this frame: not the iterator

    def _invalidate(self, reason: str) -> None:
        """Stop this epoch because a newer one cannot run beside it.

        The next ``next()`` raises ``RuntimeError(reason)``, later ones
        ``StopIteration``. Nothing happens if the epoch is already over.
        """
        if not self._done:
            self._invalid = reason
        self._finish()

    def _raised_by_source(self, error: BaseException) -> bool:
        """Return whether ``error`` is the source's error this iterator re-raised.

        Lets a consumer tell a ``KeyboardInterrupt`` raised *by the source* (to
        be delivered in order) from one raised on its own thread (Ctrl-C).
        """
        return self._source_error_id == id(error)

    def _adapt(self) -> None:
        """Report the hand-offs since the last report to the policies; apply their decisions."""
        stats, engine = self._epoch.stats, self._engine
        if not self._control.drives(stats) and not self._threads.drives(stats):
            self._reports = False  # a newer iter() adapts them now; this epoch keeps its own
            return
        now = time.perf_counter()
        if self._control.drives(stats):
            fewest, count = self._fewest, self._pending
            waited = 0.0 if fewest else self._waited  # only the last hand-off can have waited
            threads = max(engine.target, 1)  # N threads make an item N times as often
            new = self._control.observe(
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
                engine.set_depth(new)
        if self._threads.drives(stats):
            wanted = self._threads.observe(
                now=now,
                items=stats.items,
                waited=stats.wait_seconds,
                busy_seconds=engine.busy_seconds,
                cpu_seconds=engine.cpu_seconds,
                largest_item=engine.largest_item,
            )
            if wanted is not None:
                engine.set_threads(wanted)
        self._handed_over = now
        self._pending, self._fewest = 0, 1 << 62

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._epoch.stats.finished = time.perf_counter()
        self._finalizer()
        self._engine.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)

    def close(self) -> None:
        """Stop the thread and release the source; prefetched items are dropped.

        Returns within about ``0.2`` s even if the thread is blocked inside the
        source (it then exits by itself when the source returns).
        """
        self._finish()

    def __enter__(self) -> BackgroundIterator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
