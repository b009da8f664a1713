"""``fetch_info()``: what a parallel-fetch thread knows about itself.

The threads' counterpart of ``torch.utils.data.get_worker_info()``. The
engine (:mod:`prefetch._threads.engine`) enters each parallel-fetch thread
here before anything else runs in it (the thread's set-up and
``thread_init_fn`` included) and leaves when the thread does; everywhere
else, the main thread and a one-thread ``BackgroundLoader`` included,
:func:`fetch_info` returns ``None``.
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
    ``None`` outside the threads of ``BackgroundLoader(...,
    fetch_threads=...)``: on your loop's thread, and in the one thread of a
    ``BackgroundLoader`` without ``fetch_threads``.

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
