"""``BackgroundIterator``: the consumer end of one epoch's producer thread.

The thread itself lives in :mod:`prefetch._thread_worker`. This module takes
items off the channel, waits (timed, checking the thread is alive) when none
is ready, keeps the epoch's stats and checkpoint state, reports each hand-off
to an adaptive depth policy if there is one, and shuts the thread down when
the epoch ends, on ``close()``, or when the iterator is collected.

Invariants:

* Only the latest epoch reports to the depth policy; an older one still
  open keeps the depth it had.
* An ``Exception`` the source raised (``RAISED``) is re-raised and the epoch
  goes on: the next ``next()`` returns what the source gave after it. A final
  error (``ERROR``) or the end stops the thread first.
* The frame that re-raises an error does not hold the iterator (``self`` is
  deleted before the error leaves), so an error kept alive by its caller
  does not keep the iterator, its thread or its source's workers alive.
* An iterator another epoch had to stop (``_invalidate``)
  raises ``RuntimeError`` saying why on its next ``next()``, then
  ``StopIteration``: it never ends silently.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from queue import Empty
from typing import TypeVar

from prefetch import _thread_worker as thread_worker
from prefetch._adaptive_depth import DepthControl
from prefetch._channel import END, ITEM, POLL_SECONDS, RAISED, Channel, Message, request_stop
from prefetch._profiling import profiling, span
from prefetch._stats import EpochRecord, LoaderStats
from prefetch._thread_worker import ProducerSpec

T = TypeVar("T")

CLOSE_TIMEOUT = 10.0
"""Longest ``close()`` waits for the thread (shutting down DataLoader workers)."""
STUCK_GRACE = 0.2
"""How long ``close()`` waits for a thread that is blocked inside the source."""
REPORT_EVERY = 16
"""Quiet hand-offs (two or more items ready) reported to a depth policy at once."""


class BackgroundIterator(Iterator[T]):
    """One epoch of a :class:`BackgroundLoader`: the consumer end of the thread.

    Created by ``iter(background_loader)``; you rarely name it. It stops its
    thread at the end of the data, on a ``BaseException`` from the source
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
        source: Iterator[T],
        epoch: EpochRecord,
        *,
        control: DepthControl,
        max_bytes: int | None,
        producer: ProducerSpec,
    ) -> None:
        control.start_epoch(epoch.stats)
        self._channel = Channel(control.depth, epoch.stats, max_bytes)
        self._epoch = epoch
        self._control = control
        self._reports = control.adaptive  # a fixed depth hears nothing
        self._waited = 0.0
        self._handed_over = 0.0  # perf_counter() at the last report to the policy
        self._pending = 0  # hand-offs since then
        self._fewest = 0  # the fewest items ready among them (0: report the first at once)
        self._done = False
        self._invalid: str | None = None  # why another epoch stopped this one
        self._keeps_state = producer.read_state is not None
        self._source_error_id: int | None = None
        self._finalizer = weakref.finalize(self, request_stop, self._channel)
        self._finalizer.atexit = False
        try:
            self._thread = thread_worker.start_producer(self._channel, source, producer)
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
        messages = self._channel.messages
        ready = len(messages)
        if ready:
            kind, payload, state, nbytes = messages.popleft()  # one consumer: cannot fail
        else:
            kind, payload, state, nbytes = self._wait()
        if kind == ITEM:
            self._channel.release_slot(nbytes)
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
                    self._adapt()
            return payload  # type: ignore[no-any-return]  # messages are untyped tuples
        if kind == RAISED:  # the source goes on after it
            self._channel.release_slot(0)
        else:
            self._finish()
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
        """Report the hand-offs since the last report to the policy; apply its decision."""
        if not self._control.drives(self._epoch.stats):
            self._reports = False  # a newer iter() adapts it now; this epoch keeps its depth
            return
        channel = self._channel
        now = time.perf_counter()
        fewest, count = self._fewest, self._pending
        waited = 0.0 if fewest else self._waited  # only the last hand-off can have waited
        new = self._control.observe(
            now=now,
            step=now - self._handed_over - waited,
            waited=waited,
            ready=fewest,
            fetched=channel.fetched,
            busy_seconds=channel.busy_seconds,
            blocked_seconds=channel.blocked_seconds,
            largest_item=channel.largest_item,
            count=count,
        )
        if new is not None:
            channel.set_depth(new)
        self._handed_over = now
        self._pending, self._fewest = 0, 1 << 62

    def _wait(self) -> Message:
        if profiling():
            with span("prefetch.wait"):
                return self._wait_for_message()
        return self._wait_for_message()

    def _wait_for_message(self) -> Message:
        channel = self._channel
        started = time.perf_counter()
        try:
            while True:
                channel.consumer_waiting = True  # announce, then re-check: no lost wake-up
                try:
                    return channel.messages.popleft()
                except IndexError:
                    pass
                try:
                    channel.data_ready.get(timeout=POLL_SECONDS)
                except Empty:
                    if not self._thread.is_alive() and not channel.messages:
                        self._finish()
                        msg = (
                            f"prefetch thread {self._thread.name!r} exited without "
                            "delivering an item, an error or the end of the data"
                        )
                        raise RuntimeError(msg) from None
        finally:
            channel.consumer_waiting = False
            self._waited = time.perf_counter() - started
            self._epoch.stats.wait_seconds += self._waited

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._epoch.stats.finished = time.perf_counter()
        self._finalizer()
        thread_worker.join_producer(
            self._thread, self._channel, timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE
        )
        self._channel.messages.clear()

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
