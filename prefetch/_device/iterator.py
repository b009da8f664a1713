"""``DeviceIterator``: one epoch of a :class:`~prefetch.CudaPrefetcher`.

It runs entirely on the training loop's thread: the thread that called
``iter()``; ``next()`` from any other thread raises ``RuntimeError`` (the
waits and fences would target that thread's current stream). On a device with streams it
keeps ``depth`` batches in flight behind the one being handed over, each with
the event that marks its copy done and the wrapped loader's checkpoint state
right after it was produced; on the CPU it passes batches straight through.
An error from the source or the transform waits in the queue at its
position, so every batch before it is delivered first. A ``KeyboardInterrupt``
raised on this thread while it refills (Ctrl-C, not the source's own) is
raised at once, with the queue left intact.

Invariants:

* After an ``Exception`` the epoch goes on: the source is asked for more, as
  a loop that catches the error would ask it (a DataLoader iterator goes on,
  a generator that raised is finished). A ``BaseException`` from the source
  ends the epoch and releases the source first, and so does the error of a
  DataLoader iterator that lost a worker process
  (:mod:`prefetch._torch.workers`): asked again, it would drop the dead
  worker's batches or wait forever.
* No frame of this module holds the iterator once it has finished: a
  traceback keeps every frame it passes through *and their callers*
  (``f_back``), so ``__next__``, ``_fill`` and ``_load_one`` delete ``self``
  (and the source) on every way out. A finalizer releases the source when the
  iterator is collected, so an error kept alive by its caller does not keep
  the iterator, nor DataLoader workers, alive.
* After ``StopIteration`` the source's state is read once more and becomes
  the epoch's state when the loop reaches the end.
* Over a sized loader the copies run ahead to its last item, never past:
  the ``next()`` that finds the end is made when the loop asks past the
  last item, as a plain loop makes it (and a framework that stops at
  ``len(loader)`` never makes it).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar

from prefetch._shared.epoch import (
    EpochIterator,
    EpochRecord,
    Opener,
    raised_by_source,
    release_source,
)
from prefetch._shared.read_ahead import Entry, ReadAhead
from prefetch._torch.workers import lost_a_worker

T = TypeVar("T")


class Copier(Protocol):
    """What an epoch needs from the device side (:class:`~prefetch._device.copier.StreamCopier`)."""

    def to_device(self, host: Any) -> tuple[Any, Any]:
        """Start one batch's copy; return the batch and the event to wait for (or ``None``)."""

    def hand_over(self, batch: Any, event: Any) -> None:
        """Make the consumer's current stream ready to use ``batch``."""


class InFlight(NamedTuple):
    """A batch whose copy has been queued: the batch, its event, the source state after it."""

    batch: Any
    event: Any
    state: Any


class Failure(NamedTuple):
    """An exception that stands in the queue at the position it was raised."""

    error: BaseException
    final: bool  # the epoch ends with it (a BaseException from the source)


class SourceRelease:
    """What stops an epoch without its iterator: releasing its source (see ``Stoppable``).

    Over a one-shot source (``keeps``) it also holds what the epoch read ahead
    and did not hand over, once the epoch stopped.
    """

    def __init__(self, release: weakref.finalize[Any, Any], keeps: bool) -> None:
        self._release = release
        self.keeps = keeps
        self.kept = ReadAhead()

    def read_ahead(self) -> ReadAhead:
        """What the stopped epoch read ahead of its one-shot source (taken once)."""
        kept, self.kept = self.kept, ReadAhead()
        return kept

    def stop(self) -> None:
        """Release the source (once; later calls do nothing)."""
        self._release()

    def join(self, *, timeout: float, stuck_grace: float) -> bool:
        """Nothing to wait for: no thread of its own (a source's threads stop on release)."""
        return True


def wrong_thread_error() -> RuntimeError:
    """The error for a ``next()`` on another thread than the one that called ``iter()``."""
    return RuntimeError(
        f"CudaPrefetcher: next() was called on thread {threading.current_thread().name!r}, "
        f"not on the thread that called iter(); an epoch must be iterated on the thread "
        f"that started it (the training loop's), because its stream waits target the "
        f"calling thread's current stream. If a BackgroundLoader or another thread drives "
        f"it, stack them the other way: CudaPrefetcher(BackgroundLoader(...))"
    )


class DeviceIterator(EpochIterator[T]):
    """One epoch of a :class:`~prefetch.CudaPrefetcher`; created by ``iter(prefetcher)``.

    Example:
        >>> import torch
        >>> from prefetch import CudaPrefetcher
        >>> iterator = iter(CudaPrefetcher([torch.zeros(1), torch.ones(1)], device="cpu"))
        >>> next(iterator)
        tensor([0.])
        >>> iterator.stats.items
        1
    """

    def __init__(self, opener: Opener, *, copier: Copier, depth: int) -> None:
        self._opener = opener
        self._copier = copier
        self._depth = depth
        self._read_state: Callable[[], Any] | None = None
        self._source: Iterator[Any] | None = None  # attached when the epoch starts
        self._record = EpochRecord(None)  # a placeholder until then
        self._pending: deque[InFlight | Failure] = deque()
        self._ended = False  # the source raised StopIteration
        self._end_state: Any = None
        self._left: int | None = None  # see _launch
        self._releaser: weakref.finalize[Any, Any] | None = None
        self._release_and_keep: SourceRelease | None = None
        self._thread = threading.get_ident()  # the consumer's: iter() runs on it

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
        """Take the source: the copies start at the first ``next()`` that needs them."""
        self._read_state = read_state
        self._left = expected  # items to take before the next() that finds the end (None: any)
        self._record, self._source = record, source
        self._releaser = releaser = weakref.finalize(self, release_source, source, owned)
        releaser.atexit = False
        self._stopper = self._release_and_keep = SourceRelease(releaser, keeps=keep)

    def __next__(self) -> T:
        if self._invalid is not None:
            self._end()
        stats = self._record.stats
        started = time.perf_counter()
        handed = False
        try:
            if threading.get_ident() != self._thread:
                raise wrong_thread_error()
            if self._opener is not None:
                self.start()  # the first next(): the epoch starts now, on this thread
                stats = self._record.stats
                started = time.perf_counter()  # iter() of the loader is before the epoch
            if not self._pending and self._left == 0:
                self._left = None  # the loop asks past the last item: now look for the end
            self._fill(1)
            if not self._pending:
                if self._ended:
                    self._ended = False
                    if self._read_state is not None:
                        self._record.state = self._end_state  # the next epoch
                self._finish()
                raise StopIteration
            entry = self._pending[0]
            if isinstance(entry, Failure):
                if entry.final:
                    self._finish()
                else:
                    self._pending.popleft()
                error = entry.error
                del entry
                try:
                    raise error
                finally:
                    del error
            if entry.event is not None:
                # Queue the copies of the next `depth` batches before handing this
                # one over, so they overlap its compute. The batch stays first in
                # line until then: an interrupt here loses nothing.
                self._fill(1 + self._depth)
                self._copier.hand_over(entry.batch, entry.event)
            self._pending.popleft()
            self._record.state = entry.state
            now = time.perf_counter()
            stats.record_wait(now - started)  # all of next(): this loop loads on its own thread
            handed = True
            stats.items += 1
            stats.record_hand_over(now)
            return entry.batch  # type: ignore[no-any-return]  # InFlight holds Any
        finally:
            if not handed:  # the end, an error: after the last item
                stats.record_wait(time.perf_counter() - started)
            del self  # a traceback may keep this frame (see the module invariants)

    def _fill(self, count: int) -> None:
        try:
            while self._source is not None and len(self._pending) < count and self._left != 0:
                if self._left is not None:
                    self._left -= 1
                self._load_one(self._source)
        finally:
            del self  # a traceback may keep this frame (see the module invariants)

    def _load_one(self, source: Iterator[Any]) -> None:
        stats = self._record.stats
        fetch_started = time.perf_counter()
        try:
            try:
                host = next(source)
            finally:
                stats.source_seconds += time.perf_counter() - fetch_started
            read_state = self._read_state
            state = read_state() if read_state is not None else None
            batch, event = self._copier.to_device(host)
            self._pending.append(InFlight(batch, event, state))
        except StopIteration:
            read_state = self._read_state
            self._end_state = read_state() if read_state is not None else None
            self._ended = self._record.source_ended = True
            self._release()
        except BaseException as error:
            final = not isinstance(error, Exception)
            if final and not raised_by_source(source, error):
                raise  # Ctrl-C or a timeout on this thread: raise now; the queue stays intact
            final = final or lost_a_worker(source)  # a DataLoader that lost a worker: no more
            if final:
                self._release()
            self._pending.append(Failure(error, final))  # at its position, never dropped
        finally:
            del self, source  # a traceback may keep this frame (see the module invariants)

    def _release(self) -> None:
        self._source = None
        self._opener = None  # an idle epoch closed before its first next() never starts
        if self._releaser is not None:
            self._releaser()  # once: later calls do nothing

    def _is_over(self) -> bool:
        return self._source is None and not self._pending

    def _finish(self) -> None:
        stats = self._record.stats
        if stats.finished is None:
            stats.finished = time.perf_counter()
        self._keep_read_ahead()
        self._pending.clear()
        self._release()  # a wrapper below is over first: this epoch's position is set last
        self._record.over(None)

    def _keep_read_ahead(self) -> None:
        """Over a one-shot source, keep what is read ahead for the next epoch."""
        keeper = self._release_and_keep
        if keeper is None or not keeper.keeps or not (self._pending or self._ended):
            return
        for entry in self._pending:
            if isinstance(entry, InFlight):
                keeper.kept.add([Entry(entry.batch)])
            else:
                keeper.kept.add([Entry(None, entry.error)])
        keeper.kept.ended = keeper.kept.ended or self._ended
        self._pending.clear()
        self._ended = False

    def __del__(self) -> None:
        # A `break` drops the iterator: over a one-shot source what it read ahead
        # is kept for the next epoch (the finalizer, which cannot see it, releases).
        # Over a seeded shuffle the generators go back to where the loop stopped, now.
        if getattr(self, "_pending", None):
            self._keep_read_ahead()
        record = getattr(self, "_record", None)
        if record is not None and record.sampling is not None:
            self._finish()
