"""``BackgroundLoader``: produce a loader's items in a thread, ``depth`` ahead.

This module holds the loader: epochs, pinning, pass-through and checkpoints.
The consumer end of an epoch is :mod:`prefetch._threads.iterator`; the
thread is :mod:`prefetch._thread_worker`; the shared state is
:mod:`prefetch._channel`; how ``depth="auto"`` decides is
:mod:`prefetch._threads.depth_policy`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Generic, Literal, TypeVar, cast

import torch
from torch.utils.data import DataLoader

from prefetch._shared.arguments import (
    check_bool,
    check_fetch_threads,
    check_iterable,
    check_loader_depth,
    check_optional_count,
)
from prefetch._shared.checkpointing import adopt_state, read_start_state
from prefetch._shared.pinning import (
    accelerator_available,
    current_device_index,
    pin_batch,
    select_device,
)
from prefetch._shared.stateful import read_state
from prefetch._shared.stats import EpochRecord
from prefetch._shared.wrapper import (
    LoaderWrapper,
    one_iterator_reason,
    short_repr,
    warn_consumed,
)
from prefetch._threads.depth_policy import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DEPTH,
    DepthControl,
    DepthPolicy,
    FixedDepth,
)
from prefetch._threads.engine import Engine
from prefetch._threads.iterator import CLOSE_TIMEOUT, STUCK_GRACE, BackgroundIterator
from prefetch._threads.parallel_fetch import check_parallel_loader, sampler_tasks
from prefetch._threads.sampler_seed import start_sampler_here
from prefetch._threads.tasks import IteratorTasks, ProducerSpec, Tasks
from prefetch._threads.thread_policy import FixedThreads, ThreadControl, ThreadPolicy

T = TypeVar("T")


class BackgroundLoader(LoaderWrapper, Generic[T]):
    """Wrap a loader so its items are produced in a background thread.

    Each ``iter()`` is an epoch: it calls ``iter(loader)`` on your thread
    (DataLoader workers start from the main thread), then a daemon thread
    named ``prefetch-N`` keeps up to ``depth`` items ready. Items arrive in
    order, ``None`` included; an exception raised by the loader arrives as
    the same object after every item before it, and the epoch goes on as far
    as the loader's own iterator does (a ``DataLoader`` continues with the
    next batch; a generator that raised is finished). Breaking out of the
    loop, :meth:`close`, a ``with`` block or garbage collection stop the
    thread; an open iterator keeps reading ahead from the loader until then.

    Each ``iter()`` stands on its own where the loader allows it, so
    ``zip(loader, loader)`` and nested loops behave as over the loader
    itself. A one-shot iterator, or a ``DataLoader`` with
    ``persistent_workers=True``, has only one position: a new ``iter()``
    stops the older iterator, whose next ``next()`` raises ``RuntimeError``
    saying why. A later epoch over a one-shot source that an earlier epoch
    used up warns once. ``stats`` and :meth:`state_dict` describe the most
    recent ``iter()``.
    ``len``, ``set_epoch``, ``dataset``, ``sampler`` and ``batch_size`` pass
    through, so it drops into an existing training loop.

    By default (``depth="auto"``) the depth adapts: it starts at 2, grows
    when your loop waited for a burst of slow items that a deeper buffer
    would have absorbed, never grows for a loader that is simply slower than
    the loop, and shrinks when the buffer is never drawn down; it stays within
    ``max_depth`` items and ``max_bytes`` of tensor storage. ``stats`` shows
    the depth and each change with its reason. An integer ``depth`` is fixed.

    A thread only helps when loading releases the GIL: file and network I/O,
    torch operations, DataLoader worker processes. See the guide.

    Args:
        loader: Any iterable: a ``DataLoader``, a list, a generator.
        depth: ``"auto"``, or a fixed number of items produced ahead and not
            yet consumed, at most (>= 1).
        max_depth: Most items an adaptive depth may reach (``depth="auto"``
            only); default 32.
        max_bytes: Most bytes of tensor storage buffered (items produced and
            not yet consumed). Default: 1 GiB with ``depth="auto"``, no limit
            with a fixed depth. One item always flows, however large.
        pin_memory: Pin every tensor leaf in the thread, for fast
            host-to-device copies. The thread first selects the device of
            the :class:`~prefetch.CudaPrefetcher` stacked on this loader, or
            else the caller's current device at ``iter()``. Without an
            accelerator this warns once and items pass through unchanged.
        num_threads: If given, ``torch.set_num_threads`` in the producer
            thread(s), so torch work there does not fight your training step
            for the cores.
        fetch_threads: Parallel fetch, for a map-style ``DataLoader`` with
            ``num_workers=0``: this many threads read and collate its batches
            (``"auto"``: as many as make the loop wait less, up to about the
            core count for CPU-bound work and more for I/O), delivered in
            sampler order, exactly the DataLoader's batches. ``None`` (the
            default): one thread produces the loader's items, whatever the
            loader is. See the guide on threads versus worker processes.

    Example:
        >>> loader = BackgroundLoader(range(5))
        >>> [x * 10 for x in loader]
        [0, 10, 20, 30, 40]
        >>> len(loader), loader.stats.items, loader.depth
        (5, 5, 2)
        >>> BackgroundLoader(range(5), depth=8).max_depth
        8
    """

    def __init__(
        self,
        loader: Iterable[T],
        depth: int | Literal["auto"] = "auto",
        *,
        max_depth: int | None = None,
        max_bytes: int | None = None,
        pin_memory: bool = False,
        num_threads: int | None = None,
        fetch_threads: int | Literal["auto"] | None = None,
    ) -> None:
        check_iterable(loader, "BackgroundLoader")
        fixed = check_loader_depth(depth, max_depth, "BackgroundLoader")
        self._max_bytes = check_optional_count(max_bytes, "max_bytes", "BackgroundLoader")
        self._budget_set = max_bytes is not None  # the user's budget holds from the first item
        self._control: DepthControl
        if fixed is None:
            if self._max_bytes is None:
                self._max_bytes = DEFAULT_MAX_BYTES
            maximum = max_depth if max_depth is not None else DEFAULT_MAX_DEPTH
            self._control = DepthPolicy(maximum=maximum, max_bytes=self._max_bytes)
        else:
            self._control = FixedDepth(fixed)
        check_bool(pin_memory, "pin_memory", "BackgroundLoader")
        check_optional_count(num_threads, "num_threads", "BackgroundLoader")
        if pin_memory and not accelerator_available():
            warnings.warn(
                "BackgroundLoader(pin_memory=True): no accelerator is available, "
                "so batches are passed through unpinned",
                UserWarning,
                stacklevel=2,
            )
            pin_memory = False
        self._fetch_threads = check_fetch_threads(fetch_threads, "BackgroundLoader")
        if fetch_threads is not None:
            check_parallel_loader(loader, "BackgroundLoader")
        self._thread_control: ThreadControl | None = None
        if fetch_threads == "auto":
            self._thread_control = ThreadPolicy(max_bytes=self._max_bytes)
        self._loader = loader
        self._pin_memory = pin_memory
        self._num_threads = num_threads
        self._pin_device: int | None = None  # None: the caller's current device at iter()
        self._stateful = adopt_state(self)
        self._epoch = None
        # Every epoch whose threads may still run: (iterator, engine).
        self._live: list[tuple[weakref.ref[BackgroundIterator[T]], Engine]] = []
        self._last_engine: Engine | None = None
        self._warned_consumed = False

    @property
    def depth(self) -> int:
        """The most items produced ahead and not yet consumed (now, if adaptive)."""
        return self._control.depth

    @property
    def adaptive(self) -> bool:
        """Whether the depth adapts (``depth="auto"``)."""
        return self._control.adaptive

    @property
    def max_depth(self) -> int:
        """The most items ever buffered (an adaptive depth's ceiling, or the fixed depth)."""
        return self._control.maximum

    @property
    def max_bytes(self) -> int | None:
        """The most tensor bytes buffered, or ``None`` for no byte limit."""
        return self._max_bytes

    @property
    def pin_memory(self) -> bool:
        """Whether batches are pinned in the thread (false without an accelerator)."""
        return self._pin_memory

    def __iter__(self) -> BackgroundIterator[T]:
        self._check_sharding()
        loader = self._loader
        reason = one_iterator_reason(loader)
        if reason is not None:
            # Before iter(loader): persistent workers reset the iterator an older
            # thread may still be reading.
            why = f"a newer iter() of this {type(self).__name__} stopped it: {reason}"
            self._stop_epoch(wait=True, reason=why)
            self._warn_if_consumed(loader)
        else:
            self._join_abandoned()
        source = iter(loader)
        # After iter(): a StatefulDataLoader's new epoch (its shuffle included) is in
        # this state, not the finished previous one. The thread has not started yet.
        start_state = read_start_state(self)
        start_sampler_here(source)  # a seeded shuffle must not depend on the thread's timing
        self._epoch = EpochRecord(start_state)
        producer = ProducerSpec(
            owned=source is not loader,
            prepare=pin_batch if self._pin_memory else None,
            read_state=partial(read_state, loader) if self._stateful else None,
            setup=self._thread_setup(),
        )
        tasks: Tasks
        if self._fetch_threads is None:
            tasks = IteratorTasks(source, producer.owned)
        else:
            tasks = sampler_tasks(cast("DataLoader[T]", loader), source, "BackgroundLoader")
        iterator: BackgroundIterator[T] = BackgroundIterator(
            tasks,
            self._epoch,
            control=self._control,
            max_bytes=self._max_bytes,
            producer=producer,
            threads=self._threads_for_epoch(),
            size_hint=self._last_engine.largest_item if self._last_engine is not None else 0,
            probe_first=self._budget_set,
        )
        self._live.append((weakref.ref(iterator), iterator._engine))
        self._last_engine = iterator._engine
        return iterator

    @property
    def fetch_threads(self) -> int | Literal["auto"] | None:
        """Threads that fetch a DataLoader's batches in parallel (``None``: one thread)."""
        return self._fetch_threads

    def _threads_for_epoch(self) -> ThreadControl:
        if self._thread_control is not None:
            return self._thread_control
        return FixedThreads(self._fetch_threads if isinstance(self._fetch_threads, int) else 1)

    def _pin_for(self, device: torch.device) -> None:
        """Pin for ``device`` (a CudaPrefetcher on top names it): the thread selects it."""
        self._pin_device = device.index

    def _warn_if_consumed(self, loader: Iterable[T]) -> None:
        engine = self._last_engine
        used_up = engine is not None and engine.source_ended
        if used_up and isinstance(loader, Iterator) and not self._warned_consumed:
            self._warned_consumed = True
            warn_consumed(type(self).__name__, loader)

    def _thread_setup(self) -> Callable[[], None] | None:
        device = None
        if self._pin_memory:
            device = self._pin_device if self._pin_device is not None else current_device_index()
        num_threads = self._num_threads
        if device is None and num_threads is None:
            return None

        def setup() -> None:
            select_device(device)
            if num_threads is not None:
                torch.set_num_threads(num_threads)

        return setup

    def _stop_epoch(self, wait: bool, reason: str | None = None) -> None:
        """Stop every open epoch; with ``reason``, their next ``next()`` says why."""
        live, self._live = self._live, []
        for ref, engine in live:
            # The iterator may already be garbage while its threads are still inside
            # the source, so they are stopped and joined through the engine.
            current = ref()
            if current is not None and reason is not None:
                current._invalidate(reason)  # stops and joins the threads (bounded)
            elif current is not None:
                current.close()
            else:
                engine.stop()
                engine.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)
            del current
            while wait and not engine.join(timeout=0.1, stuck_grace=0.1):
                pass  # e.g. before persistent workers are reset: wait them out

    def _join_abandoned(self) -> None:
        """Forget ended epochs; stop and join those whose iterator was dropped."""
        kept = []
        for entry in self._live:
            ref, engine = entry
            if ref() is not None:
                kept.append(entry)
            else:
                engine.stop()
                engine.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)
        self._live = kept

    def __repr__(self) -> str:
        depth = "'auto'" if self._control.adaptive else self._control.depth
        text = f"BackgroundLoader({short_repr(self._loader)}, depth={depth}"
        if self._fetch_threads is not None:
            text += f", fetch_threads={self._fetch_threads!r}"
        return text + ")"
