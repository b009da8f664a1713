"""``BackgroundLoader``: produce a loader's items in a thread, ``depth`` ahead.

The thread itself lives in :mod:`prefetch.thread_worker`; this module is the
consumer side: epochs, hand-off, stats, checkpoints and shutdown.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from queue import Empty
from typing import Any, Generic, TypeVar

import torch
from torch.autograd import profiler

from prefetch import thread_worker
from prefetch.pinning import accelerator_available, current_device_index, pin_batch, select_device
from prefetch.stats import LoaderStats
from prefetch.thread_worker import END, ITEM, Channel
from prefetch.wrapper import LoaderWrapper

__all__ = ["BackgroundIterator", "BackgroundLoader"]

T = TypeVar("T")

CLOSE_TIMEOUT = 10.0
"""Longest ``close()`` waits for the thread (shutting down DataLoader workers)."""
STUCK_GRACE = 0.2
"""How long ``close()`` waits for a thread that is blocked inside the source."""


def check_iterable(loader: object, owner: str) -> None:
    """Raise ``TypeError`` naming ``owner`` if ``loader`` cannot be iterated."""
    if not (hasattr(loader, "__iter__") or hasattr(loader, "__getitem__")):
        msg = f"{owner}(loader=...) expects an iterable, got {type(loader).__name__} {loader!r:.80}"
        raise TypeError(msg)


def check_depth(depth: object, owner: str) -> int:
    """Return ``depth`` if it is an int >= 1, else raise naming the argument."""
    if isinstance(depth, bool) or not isinstance(depth, int):
        msg = (
            f"{owner}(depth=...) expects an int >= 1, got {depth!r} of type {type(depth).__name__}"
        )
        raise TypeError(msg)
    if depth < 1:
        msg = f"{owner}(depth=...) expects an int >= 1, got {depth}"
        raise ValueError(msg)
    return depth


class EpochRecord:
    """What the loader remembers of its current epoch without holding the iterator."""

    __slots__ = ("start_state", "state", "stats")

    def __init__(self, start_state: Any) -> None:
        self.stats = LoaderStats(started=time.perf_counter())
        self.start_state = start_state
        self.state = start_state


class BackgroundIterator(Iterator[T]):
    """One epoch of a :class:`BackgroundLoader`: the consumer end of the thread.

    Created by ``iter(background_loader)``; you rarely name it. It stops its
    thread when exhausted, on an error, on :meth:`close`, at the end of a
    ``with`` block and when garbage-collected.

    Example:
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
        depth: int,
        epoch: EpochRecord,
        *,
        owned: bool,
        prepare: Callable[[Any], Any] | None,
        read_state: Callable[[], Any] | None,
        setup: Callable[[], None] | None,
    ) -> None:
        self._channel = Channel(depth)
        self._epoch = epoch
        self._track_state = read_state is not None
        self._done = False
        self._thread = thread_worker.start_producer(
            self._channel, source, owned=owned, prepare=prepare, read_state=read_state, setup=setup
        )
        self._finalizer = weakref.finalize(self, thread_worker.request_stop, self._channel)
        self._finalizer.atexit = False

    @property
    def stats(self) -> LoaderStats:
        """This epoch's :class:`~prefetch.LoaderStats`."""
        stats = self._epoch.stats
        stats.source_seconds = self._channel.source_seconds
        return stats

    def __iter__(self) -> BackgroundIterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            kind, payload, state = self._channel.messages.popleft()
        except IndexError:
            kind, payload, state = self._wait()
        if kind == ITEM:
            self._channel.release_slot()
            epoch = self._epoch
            epoch.stats.items += 1
            if self._track_state:
                epoch.state = state
            return payload  # type: ignore[no-any-return]
        self._finish()
        if kind == END:
            raise StopIteration
        try:
            raise payload
        finally:
            del payload

    def _wait(self) -> thread_worker.Message:
        if profiler._is_profiler_enabled:
            with profiler.record_function("prefetch.wait"):
                return self._wait_for_message()
        return self._wait_for_message()

    def _wait_for_message(self) -> thread_worker.Message:
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
                    channel.data_ready.get(timeout=thread_worker.POLL_SECONDS)
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
            self._epoch.stats.wait_seconds += time.perf_counter() - started

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            stats = self.stats
            stats.finished = time.perf_counter()
        self._finalizer()
        thread_worker.join_producer(
            self._thread, self._channel, timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE
        )
        self._channel.messages.clear()

    def close(self, wait: bool = False) -> None:
        """Stop the thread and release the source; prefetched items are dropped.

        Returns within about ``0.2`` s even if the thread is blocked inside the
        source (it then exits by itself when the source returns).

        Args:
            wait: Wait for the thread however long it takes instead (used
                before a new epoch reuses the same source).
        """
        self._finish()
        while wait and self._thread.is_alive():
            self._thread.join(0.1)

    def __enter__(self) -> BackgroundIterator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BackgroundLoader(LoaderWrapper, Generic[T]):
    """Wrap a loader so its items are produced in a background thread.

    Each ``iter()`` is an epoch: it calls ``iter(loader)`` on your thread
    (DataLoader workers start from the main thread), then a daemon thread
    named ``prefetch-N`` keeps at most ``depth`` items ready. Items arrive in
    order, ``None`` included; an exception raised by the loader arrives as
    the same object after every item before it. Breaking out of the loop,
    :meth:`close`, a ``with`` block or garbage collection stop the thread.
    ``len``, ``set_epoch``, ``dataset``, ``sampler`` and ``batch_size`` pass
    through, so it drops into an existing training loop.

    A thread only helps when loading releases the GIL: file and network I/O,
    torch operations, DataLoader worker processes. See the guide.

    Args:
        loader: Any iterable: a ``DataLoader``, a list, a generator.
        depth: Items produced ahead and not yet consumed, at most (>= 1).
        pin_memory: Pin every tensor leaf in the thread, for fast
            host-to-device copies. Without an accelerator this warns once
            and items pass through unchanged.
        num_threads: If given, ``torch.set_num_threads`` in the producer
            thread, so torch work there does not fight your training step
            for the cores.

    Example:
        >>> loader = BackgroundLoader(range(5), depth=2)
        >>> [x * 10 for x in loader]
        [0, 10, 20, 30, 40]
        >>> len(loader)
        5
        >>> loader.stats.items
        5
    """

    def __init__(
        self,
        loader: Iterable[T],
        depth: int = 2,
        *,
        pin_memory: bool = False,
        num_threads: int | None = None,
    ) -> None:
        check_iterable(loader, "BackgroundLoader")
        self._depth = check_depth(depth, "BackgroundLoader")
        if not isinstance(pin_memory, bool):
            msg = f"BackgroundLoader(pin_memory=...) expects a bool, got {pin_memory!r}"
            raise TypeError(msg)
        if num_threads is not None and (
            isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1
        ):
            msg = (
                f"BackgroundLoader(num_threads=...) expects None or an int >= 1, "
                f"got {num_threads!r}"
            )
            raise ValueError(msg)
        if pin_memory and not accelerator_available():
            warnings.warn(
                "BackgroundLoader(pin_memory=True): no accelerator is available, "
                "so batches are passed through unpinned",
                UserWarning,
                stacklevel=2,
            )
            pin_memory = False
        self._loader = loader
        self._pin_memory = pin_memory
        self._num_threads = num_threads
        self._stateful = callable(getattr(loader, "state_dict", None)) and callable(
            getattr(loader, "load_state_dict", None)
        )
        self._epoch: EpochRecord | None = None
        self._current: weakref.ref[BackgroundIterator[T]] | None = None
        self._producer: tuple[threading.Thread, Channel] | None = None

    @property
    def depth(self) -> int:
        """Items produced ahead and not yet consumed, at most."""
        return self._depth

    @property
    def pin_memory(self) -> bool:
        """Whether batches are pinned in the thread (false without an accelerator)."""
        return self._pin_memory

    @property
    def stats(self) -> LoaderStats:
        """The latest epoch's :class:`~prefetch.LoaderStats` (zeros before the first)."""
        current = self._current() if self._current is not None else None
        if current is not None:
            return current.stats
        if self._epoch is None:
            return LoaderStats()
        if self._producer is not None:
            self._epoch.stats.source_seconds = self._producer[1].source_seconds
        return self._epoch.stats

    def __iter__(self) -> BackgroundIterator[T]:
        self._stop_current(wait=True)
        loader = self._loader
        start_state = loader.state_dict() if self._stateful else None  # type: ignore[attr-defined]
        source = iter(loader)
        self._epoch = EpochRecord(start_state)
        iterator = BackgroundIterator(
            source,
            self._depth,
            self._epoch,
            owned=source is not loader,
            prepare=pin_batch if self._pin_memory else None,
            read_state=loader.state_dict if self._stateful else None,  # type: ignore[attr-defined]
            setup=self._thread_setup(),
        )
        self._current = weakref.ref(iterator)
        self._producer = (iterator._thread, iterator._channel)
        return iterator

    def _thread_setup(self) -> Callable[[], None] | None:
        device = current_device_index() if self._pin_memory else None
        num_threads = self._num_threads
        if device is None and num_threads is None:
            return None

        def setup() -> None:
            select_device(device)
            if num_threads is not None:
                torch.set_num_threads(num_threads)

        return setup

    def _stop_current(self, wait: bool) -> None:
        # The iterator may already be garbage: its thread can still be inside the
        # source, so stop and join through the thread itself, never the iterator.
        current = self._current() if self._current is not None else None
        producer, self._producer, self._current = self._producer, None, None
        if current is not None:
            current.close(wait=wait)
        if producer is not None:
            thread, channel = producer
            thread_worker.request_stop(channel)
            thread_worker.join_producer(
                thread, channel, timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE
            )
            while wait and thread.is_alive():
                thread.join(0.1)

    def close(self) -> None:
        """Stop the current epoch's thread, if one runs, and release the source."""
        self._stop_current(wait=False)

    def __enter__(self) -> BackgroundLoader[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def state_dict(self) -> Any:
        """Return the wrapped loader's state as of the last item you received.

        Items the thread prefetched beyond it are not counted as consumed, so
        ``load_state_dict`` resumes right after the last item your loop saw.

        Raises:
            TypeError: If the wrapped loader has no ``state_dict``/``load_state_dict``.

        Example:
            >>> from torchdata.stateful_dataloader import StatefulDataLoader
            >>> loader = BackgroundLoader(StatefulDataLoader(list(range(6))), depth=4)
            >>> iterator = iter(loader)
            >>> [next(iterator).item() for _ in range(2)]
            [0, 1]
            >>> state = loader.state_dict()  # the thread may be further ahead: not counted
            >>> loader.load_state_dict(state)
            >>> [batch.item() for batch in loader]
            [2, 3, 4, 5]
        """
        self._require_stateful("state_dict")
        if self._epoch is None:
            return self._loader.state_dict()
        return self._epoch.state

    def load_state_dict(self, state_dict: Any) -> None:
        """Stop any running epoch and load ``state_dict`` into the wrapped loader.

        The next ``iter()`` resumes from that state.
        """
        self._require_stateful("load_state_dict")
        self._stop_current(wait=True)
        self._epoch = None
        self._loader.load_state_dict(state_dict)

    def _require_stateful(self, method: str) -> None:
        if not self._stateful:
            msg = (
                f"BackgroundLoader.{method}() needs a loader with state_dict() and "
                f"load_state_dict() (such as torchdata's StatefulDataLoader); "
                f"got {type(self._loader).__name__}"
            )
            raise TypeError(msg)

    def __repr__(self) -> str:
        return f"BackgroundLoader({self._loader!r:.60}, depth={self._depth})"
