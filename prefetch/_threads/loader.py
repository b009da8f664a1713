"""``BackgroundLoader``: produce a loader's items in a thread, ``depth`` ahead.

This module holds the loader: its arguments and what each epoch runs (the
tasks, the engine and its threads' set-up). Opening and stopping epochs is
:class:`~prefetch._shared.wrapper.LoaderWrapper`'s; the consumer end of an
epoch is :mod:`prefetch._threads.iterator`; the threads are
:mod:`prefetch._threads.engine`; how ``depth="auto"`` and
``fetch_threads="auto"`` decide is :mod:`prefetch._threads.depth_policy` and
:mod:`prefetch._threads.thread_policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Literal, TypeVar, cast

import torch
from torch.utils.data import DataLoader

from prefetch._shared.arguments import (
    check_bool,
    check_fetch_threads,
    check_iterable,
    check_loader_depth,
    check_optional_count,
    check_timeout,
)
from prefetch._shared.checkpointing import adopt_state
from prefetch._shared.epoch import EpochRecord, Opener
from prefetch._shared.pinning import (
    current_device_index,
    pin_batch,
    pinning_wanted,
)
from prefetch._shared.read_ahead import Resumed
from prefetch._shared.stacking import check_stack_order
from prefetch._shared.wrapper import LoaderWrapper, short_repr
from prefetch._threads.depth_policy import depth_control
from prefetch._threads.engine import Engine
from prefetch._threads.fetch_options import (
    OUT_OF_ORDER,
    BackgroundSettings,
    check_fetch_grain,
    check_in_order,
    check_thread_init_fn,
    fetchable,
    intra_op_threads,
    thread_control,
    thread_setup,
)
from prefetch._threads.iterator import BackgroundIterator
from prefetch._threads.keywords import explain_keywords
from prefetch._threads.parallel_fetch import check_parallel_loader, sampler_tasks
from prefetch._threads.tasks import IteratorTasks, ProducerSpec, Tasks, reads_units
from prefetch._threads.timeout import Timeout, check_dataloader_timeout
from prefetch._torch.fetcher import base_seed
from prefetch._torch.sampler_start import start_sampler_here
from prefetch._torch.worker_pids import guard_worker_pids

DEFAULT_MAX_BYTES = 1 << 30
"""Default ceiling on tensor bytes buffered with ``depth="auto"`` (1 GiB)."""

T = TypeVar("T")


class BackgroundLoader(LoaderWrapper, Generic[T]):
    """Wrap a loader so its items are produced in a background thread.

    Each ``iter()`` is an epoch: it calls ``iter(loader)`` on your thread
    (DataLoader workers start from the main thread), then a daemon thread
    named ``prefetch-N`` keeps up to ``depth`` items ready. Items arrive in
    order, ``None`` included; an exception raised by the loader arrives as
    the same object after every item before it, and the epoch goes on as far
    as the loader's own iterator does (a ``DataLoader`` continues with the
    next batch, unless it lost a worker process; a generator that raised is
    finished). Breaking out of the loop, :meth:`close`, a ``with`` block or
    garbage collection stop the thread; an open iterator keeps reading ahead
    from the loader until then.

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
            only); default 32, or 256 for items the loader makes in under
            0.1 ms (ints, small records: what the loop then waits for is the
            hand-off between threads, which a deeper buffer amortizes).
        max_bytes: Most bytes of tensor storage buffered (items produced and
            not yet consumed). Default: 1 GiB with ``depth="auto"``, no limit
            with a fixed depth. One item always flows, however large.
        pin_memory: Pin every tensor leaf in the thread, for fast
            host-to-device copies. The thread first selects the device of
            the :class:`~prefetch.CudaPrefetcher` stacked on this loader, or
            else the caller's current device at ``iter()``. Without an
            accelerator this warns once and items pass through unchanged.
        num_threads: How many threads *each* loading thread's torch ops
            may use (torch's intra-op threads), so torch work there does not
            fight your training step for the cores; not how many threads
            load: that is ``fetch_threads``. It is set for the loading
            threads alone: your other threads keep their count. Default:
            one with ``fetch_threads`` (as each DataLoader worker process
            sets for itself), else torch's default.
        fetch_threads: Parallel fetch, for a map-style ``DataLoader`` with
            ``num_workers=0``: this many threads read and collate its batches
            (``"auto"``: as many as make the loop wait less, up to about the
            core count for CPU-bound work and more for I/O), delivered in
            sampler order, exactly the DataLoader's batches. ``None`` (the
            default): one thread produces the loader's items, whatever the
            loader is. The threads' counterpart of the DataLoader's
            ``num_workers`` (worker processes, set on the ``DataLoader``,
            which this loader does not take); see the guide on threads
            versus worker processes. At most 256; a count above 32 per core
            warns (it cannot help), and ``"auto"`` stays within 32 and the
            DataLoader's batches per epoch.
        thread_init_fn: Called once at the start of each fetch thread, before
            it reads, with the thread's index (``fetch_threads`` only; the
            threads' ``worker_init_fn``). An exception from it ends the epoch
            and reaches your loop. In the threads, :func:`~prefetch.fetch_info`
            tells the index, the thread count and the epoch's seed.
        timeout: Most seconds your loop waits for the next item, as
            ``DataLoader(timeout=...)`` for worker processes: past it, ``next()``
            raises :class:`~prefetch.LoaderTimeoutError` (a ``TimeoutError`` and
            a ``RuntimeError``) and the epoch is over. ``None`` or ``0`` (the
            default): no limit.
        fetch_grain: How fetch threads share the reads. ``"sample"`` (the
            default): the samples of each batch are read by whichever
            threads are free, and ``collate_fn`` runs once all are in, so
            the first batch comes after about ``batch_size / fetch_threads``
            reads by each thread; a dataset with ``__getitems__`` gets contiguous chunks, one
            per thread. ``"batch"``: each thread reads a whole batch, as a
            worker process does: for a ``__getitems__`` that must see the
            whole batch at once.
        in_order: ``False`` (``fetch_threads`` only): hand each batch over as
            soon as it is ready, so one slow sample holds back only its own
            batch; the epoch still has every batch exactly once, and an error
            that ends it comes after every batch before it. Such a loader has
            no ``state_dict`` (no point in the epoch has every earlier batch
            seen). ``True`` (the default): sampler order.

    DataLoader arguments (``num_workers``, ``batch_size``, ``shuffle``,
    ``prefetch_factor``, ...) belong to the ``DataLoader`` you wrap; passing
    one here raises ``TypeError`` saying so, and a misspelt keyword names
    the close matches.

    Example:
        >>> loader = BackgroundLoader(range(5))
        >>> [x * 10 for x in loader]
        [0, 10, 20, 30, 40]
        >>> len(loader), loader.stats.items, loader.depth
        (5, 5, 2)
        >>> BackgroundLoader(range(5), depth=8).max_depth
        8
    """

    @explain_keywords("BackgroundLoader")
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
        thread_init_fn: Callable[[int], object] | None = None,
        timeout: float | None = None,
        fetch_grain: Literal["sample", "batch"] = "sample",
        in_order: bool = True,
    ) -> None:
        check_iterable(loader, "BackgroundLoader")
        check_stack_order(loader, "BackgroundLoader")
        fixed = check_loader_depth(depth, max_depth, "BackgroundLoader")
        self._max_bytes = check_optional_count(max_bytes, "max_bytes", "BackgroundLoader")
        self._budget_set = max_bytes is not None  # the user's budget holds from the first item
        if fixed is None and self._max_bytes is None:
            self._max_bytes = DEFAULT_MAX_BYTES
        self._depth = depth_control(fixed, max_depth, self._max_bytes)
        check_bool(pin_memory, "pin_memory", "BackgroundLoader")
        check_optional_count(num_threads, "num_threads", "BackgroundLoader")
        pin_memory = pinning_wanted(pin_memory, "BackgroundLoader")
        self._fetch_threads = check_fetch_threads(fetch_threads, "BackgroundLoader")
        if fetch_threads is not None:
            check_parallel_loader(loader, "BackgroundLoader")
        check_thread_init_fn(thread_init_fn, fetch_threads, "BackgroundLoader")
        self._fetch_grain = check_fetch_grain(fetch_grain, fetch_threads, "BackgroundLoader")
        self._in_order = check_in_order(in_order, fetch_threads, "BackgroundLoader")
        self._timeout = check_timeout(timeout, "BackgroundLoader")
        check_dataloader_timeout(loader, "BackgroundLoader")
        available = fetch_threads is None and fetchable(loader)
        self._threads = thread_control(
            loader, self._fetch_threads, self._max_bytes, self._fetch_grain
        )
        self._thread_init_fn = thread_init_fn
        guard_worker_pids()  # GIL off: torch's worker-pid map, before an epoch can use it
        super().__init__(loader)
        self._parallel_fetch_available = available  # the summary's advice may name it
        self._num_threads = intra_op_threads(num_threads, fetch_threads)
        self._num_threads_asked = num_threads is not None
        self._facts = self._facts.background(self._num_threads, self.adaptive, fetch_threads)
        self._preparation_due = fetch_threads is None  # fetch_threads reads unprepared loaders
        self._pin_memory = pin_memory
        self._pin_device: int | None = None  # None: the caller's current device at iter()
        adopt_state(self, None if in_order else OUT_OF_ORDER)

    @property
    def depth(self) -> int:
        """The most items produced ahead and not yet consumed (now, if adaptive)."""
        return self._depth.value

    @property
    def adaptive(self) -> bool:
        """Whether the depth adapts (``depth="auto"``)."""
        return self._depth.adaptive

    @property
    def max_depth(self) -> int:
        """An adaptive depth's ceiling, or the fixed depth.

        With the default ceiling, items the loader makes in under 0.1 ms may
        reach 256 (see ``max_depth`` in the class arguments).
        """
        return self._depth.maximum

    @property
    def max_bytes(self) -> int | None:
        """The most tensor bytes buffered, or ``None`` for no byte limit."""
        return self._max_bytes

    @property
    def fetch_threads(self) -> int | Literal["auto"] | None:
        """Threads that fetch a DataLoader's batches in parallel (``None``: one thread)."""
        return self._fetch_threads

    @property
    def settings(self) -> BackgroundSettings:
        """Its options as it resolved them: a :class:`~prefetch.BackgroundSettings`.

        Its own options live here, not as attributes of the same names: an
        attribute the loader lacks reads through to the wrapped loader, so
        ``loader.timeout``, ``loader.pin_memory`` and ``loader.in_order``
        are the wrapped ``DataLoader``'s, as a framework that rebuilds a
        ``DataLoader`` from them (accelerate's ``skip_first_batches``) needs.

        Example:
            >>> from torch.utils.data import DataLoader
            >>> loader = BackgroundLoader(DataLoader(range(4)), timeout=5)
            >>> loader.settings.timeout, loader.timeout
            (5.0, 0)
        """
        return BackgroundSettings(
            depth="auto" if self._depth.adaptive else self._depth.value,
            max_depth=self._depth.maximum,
            max_bytes=self._max_bytes,
            pin_memory=self._pin_memory,
            num_threads=self._num_threads,
            fetch_threads=self._fetch_threads,
            fetch_grain=self._fetch_grain,
            in_order=self._in_order,
            timeout=self._timeout,
        )

    def _idle_epoch(self, opener: Opener) -> BackgroundIterator[T]:
        return BackgroundIterator(
            opener, self._engine_for, depth=self._depth, threads=self._threads
        )

    def _engine_for(
        self,
        source: Iterator[Any],
        record: EpochRecord,
        owned: bool,
        keep: bool,
        read_state: Callable[[], Any] | None,
        expected: int | None,
    ) -> Engine:
        """The engine of the epoch over ``source`` (``iter()`` of the wrapped loader)."""
        start_sampler_here(source)  # a seeded shuffle must not depend on the thread's timing
        tasks: Tasks
        if self._fetch_threads is not None:
            loader = cast("DataLoader[T]", self._loader)  # pragma: no mutate (a cast)
            tasks = sampler_tasks(loader, source, "BackgroundLoader", self._fetch_grain)
        else:
            tasks = self._one_thread_tasks(source, owned)
        producer = ProducerSpec(
            prepare=pin_batch if self._pin_memory else None,
            read_state=read_state,
            setup=self._thread_setup(),
            seed=base_seed(source) if reads_units(tasks) else None,
        )
        return Engine(
            tasks,
            producer,
            record,
            depth=self._depth.value,
            threads=self._threads.value,
            max_bytes=self._max_bytes,
            measure_cpu=self._threads.adaptive,
            probe_first=self._budget_set,
            timeout=Timeout(self._timeout, repr(self)) if self._timeout is not None else None,
            in_order=self._in_order,
            expected=expected,
            keep=keep,
        )

    def _one_thread_tasks(self, source: Iterator[Any], owned: bool) -> Tasks:
        """What one thread runs: a map-style DataLoader's samples, or the source's items.

        Reading a DataLoader's samples itself, batch by batch, the thread knows
        each sample's place, so :func:`~prefetch.sample_seed` seeds it
        (augmentations that repeat); any other source is drawn item by item.
        """
        if self._parallel_fetch_available and not isinstance(source, Resumed):
            loader = cast("DataLoader[T]", self._loader)  # pragma: no mutate (a cast)
            try:
                return sampler_tasks(loader, source, "BackgroundLoader", "batch")
            except TypeError:  # not torch's single-process iterator after all
                pass
        return IteratorTasks(source, owned=owned)

    def _copied_to(self, device: torch.device) -> None:
        """Pin for ``device`` (a CudaPrefetcher stacked on this loader copies there)."""
        self._pin_device = device.index

    def _thread_setup(self) -> Callable[[], None] | None:
        device = None
        if self._pin_memory:
            device = self._pin_device if self._pin_device is not None else current_device_index()
        return thread_setup(
            device, self._num_threads, self._thread_init_fn, asked=self._num_threads_asked
        )

    def __repr__(self) -> str:
        depth = "'auto'" if self._depth.adaptive else self._depth.value
        text = f"BackgroundLoader({short_repr(self._loader)}, depth={depth}"
        if self._fetch_threads is not None:
            text += f", fetch_threads={self._fetch_threads!r}"
        if self._timeout is not None:
            text += f", timeout={self._timeout:g}"
        if not self._in_order:
            text += ", in_order=False"
        return text + ")"
