"""``fetch_info()``: what a thread reading a DataLoader's samples knows about itself.

The threads' counterpart of ``torch.utils.data.get_worker_info()``. The
engine (:mod:`prefetch._threads.engine`) enters each thread that reads a
map-style DataLoader's samples (the ``fetch_threads``, or the one thread of a
``BackgroundLoader`` without them) here before anything else runs in it (the
thread's set-up and ``thread_init_fn`` included) and leaves when the thread
does; everywhere else (your loop's thread, a thread drawing whole items from
any other iterable) :func:`fetch_info` returns ``None``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable


@dataclasses.dataclass(frozen=True, slots=True)
class FetchInfo:
    """Which parallel-fetch thread runs the code that asks; see :func:`fetch_info`.

    Attributes:
        index: The thread's index, from 0: unique among the epoch's running
            fetch threads, below the most that ran at once (a thread that
            leaves when ``fetch_threads="auto"`` lowers the count frees its
            index for the next one started).
        threads: The epoch's fetch thread count when asked (it changes
            under ``fetch_threads="auto"``).
        seed: The epoch's base seed: what the DataLoader's iterator drew
            from the loader's ``generator`` (or torch's global generator) at
            ``iter()``, the seed its worker processes would be seeded from.
    """

    index: int
    threads: int
    seed: int


_local = threading.local()


def fetch_info() -> FetchInfo | None:
    """Return the current parallel-fetch thread's :class:`FetchInfo`, or ``None`` elsewhere.

    Call it in a dataset's ``__getitem__``, a ``collate_fn`` or
    ``thread_init_fn``, as ``get_worker_info()`` in a worker process. It is
    ``None`` outside the threads that read a DataLoader's samples: on your
    loop's thread, and in the thread of a ``BackgroundLoader`` over any
    other iterable (without ``fetch_threads``, one thread reads a map-style
    DataLoader's samples: thread 0 of 1).

    Which thread reads which batch varies from run to run, so for random
    numbers that repeat across runs derive them from ``seed`` and the sample
    index (``torch.Generator().manual_seed(seed + index)``), not from the
    thread's ``index``.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from prefetch import BackgroundLoader, fetch_info
        >>> class Where(torch.utils.data.Dataset):
        ...     def __len__(self): return 4
        ...     def __getitem__(self, i): return fetch_info().threads
        >>> [batch.tolist() for batch in BackgroundLoader(DataLoader(Where()), fetch_threads=2)]
        [[2], [2], [2], [2]]
        >>> fetch_info() is None
        True
    """
    entry: tuple[int, int, Callable[[], int]] | None = getattr(_local, "entry", None)
    if entry is None:
        return None
    index, seed, count = entry
    return FetchInfo(index, count(), seed)


def call_thread_init(init: Callable[[int], object]) -> None:
    """Call a ``thread_init_fn`` with the index of the fetch thread that calls this."""
    info = fetch_info()
    assert info is not None, "thread_init_fn runs only in parallel-fetch threads"
    init(info.index)


def enter_fetch_thread(index: int, seed: int, count: Callable[[], int]) -> None:
    """Mark the calling thread as fetch thread ``index`` (``count``: the thread count now)."""
    _local.entry = (index, seed, count)


def leave_fetch_thread() -> None:
    """Mark the calling thread as no fetch thread any more."""
    _local.entry = None


_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finalizer: a well-spread 64-bit value from ``value``."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)


def sample_seed(offset: int = 0) -> int | None:
    """Return a seed for the sample being read, the same whichever thread reads it.

    It depends only on the epoch's base seed (:attr:`FetchInfo.seed`, what
    the DataLoader drew at ``iter()``: ``torch.manual_seed`` or the loader's
    ``generator`` fix it) and the sample's place in the epoch (its batch's
    number and its position in the batch), so two seeded runs draw the same
    random numbers for each sample with any ``fetch_threads``. Seed a
    generator of your own with it in ``__getitem__``; the global RNGs
    (``torch.rand``, ``random``, torchvision's random transforms) are shared
    by the threads and cannot repeat. In ``__getitems__``, ``offset`` gives
    the seed of the chunk's sample at that offset. ``None`` outside the
    reads of a ``BackgroundLoader`` over a map-style DataLoader (one thread,
    or ``fetch_threads``): in a plain ``DataLoader``, seed per worker as torch
    documents.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, Dataset
        >>> from prefetch import BackgroundLoader, sample_seed
        >>> class Noisy(Dataset):
        ...     def __len__(self): return 8
        ...     def __getitem__(self, i):
        ...         seed = sample_seed()  # None outside a BackgroundLoader: the global RNG then
        ...         generator = None if seed is None else torch.Generator().manual_seed(seed)
        ...         return torch.rand((), generator=generator)
        >>> def epoch(threads):
        ...     torch.manual_seed(0)
        ...     loader = BackgroundLoader(DataLoader(Noisy(), batch_size=4), fetch_threads=threads)
        ...     return torch.cat(list(loader))
        >>> torch.equal(epoch(1), epoch(3))
        True
        >>> sample_seed() is None
        True
    """
    place: tuple[int, int] | None = getattr(_local, "sample", None)
    entry = getattr(_local, "entry", None)
    if place is None or entry is None:
        return None
    batch, position = place
    seed = _mix(entry[1] & _MASK)
    seed = _mix(seed ^ (batch & _MASK))
    return _mix(seed ^ ((position + offset) & _MASK)) >> 1  # fits manual_seed and numpy


def enter_sample(batch: int, position: int) -> None:
    """Mark the calling fetch thread as reading the sample at ``position`` of batch ``batch``."""
    _local.sample = (batch, position)


def leave_sample() -> None:
    """Mark the calling fetch thread as between reads."""
    _local.sample = None
