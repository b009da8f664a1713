"""``DeviceIterator``: one epoch of a :class:`~prefetch.CudaPrefetcher`.

It runs entirely on the training loop's thread. On a device with streams it
keeps ``depth`` batches in flight behind the one being handed over, each with
the event that marks its copy done and the wrapped loader's checkpoint state
right after it was produced; on the CPU it passes batches straight through.
An error from the source or the transform waits in the queue at its
position, so every batch before it is delivered first. A ``KeyboardInterrupt``
raised on this thread while it refills (Ctrl-C, not the source's own) is
raised at once, with the queue left intact.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from prefetch._stats import EpochRecord, LoaderStats
from prefetch._thread_worker import release_source

if TYPE_CHECKING:
    from prefetch._cuda_prefetcher import CudaPrefetcher


T = TypeVar("T")


class InFlight(NamedTuple):
    """A batch whose copy has been queued: the batch, its event, the source state after it."""

    batch: Any
    event: Any
    state: Any


class Failure(NamedTuple):
    """An exception that stands in the queue at the position it was raised."""

    error: BaseException


def _raised_by_source(source: Iterator[Any], error: BaseException) -> bool:
    """Whether a ``BaseException`` came from the producer (not from this thread)."""
    check = getattr(source, "raised_by_source", None)
    return bool(check(error)) if callable(check) else False


class DeviceIterator(Iterator[T]):
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

    def __init__(
        self,
        owner: CudaPrefetcher[T],
        source: Iterator[Any],
        epoch: EpochRecord,
        *,
        owned: bool,
    ) -> None:
        self._owner = owner
        self._source: Iterator[Any] | None = source
        self._owned = owned
        self._epoch = epoch
        self._pending: deque[InFlight | Failure] = deque()

    @property
    def stats(self) -> LoaderStats:
        """This epoch's :class:`~prefetch.LoaderStats`."""
        return self._epoch.stats

    def __iter__(self) -> DeviceIterator[T]:
        return self

    def __next__(self) -> T:
        started = time.perf_counter()
        try:
            self._fill(1)
            if not self._pending:
                self._finish()
                raise StopIteration
            entry = self._pending[0]
            if isinstance(entry, Failure):
                self._finish()
                error = entry.error
                try:
                    raise error
                finally:
                    del error, entry
            if entry.event is not None:
                # Queue the copies of the next `depth` batches before handing this
                # one over, so they overlap its compute. The batch stays first in
                # line until then: an interrupt here loses nothing.
                self._fill(1 + self._owner.depth)
                self._owner._hand_over(entry.batch, entry.event)
            self._pending.popleft()
            self._epoch.state = entry.state
            self._epoch.stats.items += 1
            return entry.batch  # type: ignore[no-any-return]
        finally:
            self._epoch.stats.wait_seconds += time.perf_counter() - started

    def _fill(self, count: int) -> None:
        while self._source is not None and len(self._pending) < count:
            self._load_one(self._source)

    def _load_one(self, source: Iterator[Any]) -> None:
        stats = self._epoch.stats
        fetch_started = time.perf_counter()
        try:
            try:
                host = next(source)
            finally:
                stats.source_seconds += time.perf_counter() - fetch_started
            state = self._owner._read_state()
            batch, event = self._owner._to_device(host)
            self._pending.append(InFlight(batch, event, state))
        except StopIteration:
            self._release()
        except BaseException as error:
            if not (isinstance(error, Exception) or _raised_by_source(source, error)):
                raise  # Ctrl-C or a timeout on this thread: raise now; the queue stays intact
            self._release()
            self._pending.append(Failure(error))  # delivered at its position, never dropped

    def _release(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            release_source(source, self._owned)

    def _finish(self) -> None:
        stats = self._epoch.stats
        if stats.finished is None:
            stats.finished = time.perf_counter()
        self._pending.clear()
        self._release()

    def close(self) -> None:
        """Drop the batches in flight and release (close) the source iterator."""
        self._finish()

    def __enter__(self) -> DeviceIterator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
