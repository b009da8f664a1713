"""Parallel fetch: a map-style DataLoader's batches, read by several threads.

:class:`SamplerTasks` splits a single-process DataLoader's ``next()`` in two.
The *draw* is the DataLoader's own ``next()`` with its fetcher swapped for
one that returns the batch's indices instead of reading them: the sampler,
its random draws, the counters and a ``StatefulDataLoader``'s checkpoint
state move exactly as in a plain loop, in order, on one thread at a time.
The *reads* take the samples (``dataset.__getitems__`` where the dataset has
it, else ``dataset[i]`` for each index), unit by unit on any of the engine's
threads, and ``collate_fn`` joins them, as the DataLoader's own fetcher
does. So the
batches are the DataLoader's, bit for bit, for the same seed, and a
checkpoint resumes exactly.

:func:`sampler_tasks` refuses, with the reason and what to do, every loader
this cannot apply to.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from prefetch._shared.epoch import release_source
from prefetch._threads.fetch_info import enter_sample, leave_sample
from prefetch._threads.sample_board import Reading, SampleBoard
from prefetch._torch.fetcher import own_iteration, pin, pin_settings, refusal, swap_fetcher, yielded


class _Indices:
    """A DataLoader fetcher that returns the indices it is given (the draw's half)."""

    def __init__(self, fetcher: Any) -> None:
        self._fetcher = fetcher

    def fetch(self, index: Any) -> Any:
        return index

    def __getattr__(self, name: str) -> Any:  # state_dict() reads the dataset through it
        return getattr(self._fetcher, name)


class SamplerTasks:
    """Tasks of a map-style DataLoader: draw indices in order, read and collate in parallel.

    Made by :func:`sampler_tasks`. A drawn batch is planned as units on the
    :attr:`board` (:meth:`plan`), read by any thread (:meth:`read`) and
    collated once all are in (:meth:`join`); see
    :mod:`prefetch._threads.producers`. At the grain of samples, the
    default, a unit is a sample (or, for a dataset with ``__getitems__``, a
    chunk per thread); at the grain of batches (``grain="batch"``) the whole
    batch is one unit, read by one thread as a worker process reads it.
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        iterator: Iterator[Any],
        grain: str = "sample",
    ) -> None:
        self.sample_grain = grain == "sample"
        self.board = SampleBoard()
        self._iterator = iterator
        self._dataset = loader.dataset
        self._collate = loader.collate_fn
        self._batched = loader.batch_sampler is not None
        items = getattr(self._dataset, "__getitems__", None)
        self._getitems = items if self._batched and items else None
        self._pin, self._pin_device = pin_settings(iterator)  # False without a GPU

    def draw(self) -> Any:
        """Return the next batch's indices (the DataLoader's ``next()``, without the reads)."""
        return next(self._iterator)

    def _number(self, seq: int) -> int:
        """The number in the epoch of the batch just drawn (it resumes with the loader)."""
        return yielded(self._iterator, seq + 1) - 1

    def plan(self, seq: int, task: Any, state: Any, threads: int) -> Reading:
        """Split a drawn batch into units: a sample each, ``threads`` chunks, or the batch."""
        number = self._number(seq)
        if not self._batched:
            return Reading(seq, number, [task], [0], 1, state)
        indices = list(task)
        if not self.sample_grain:
            return Reading(seq, number, [indices], [0], len(indices), state)
        if self._getitems is None:
            return Reading(seq, number, indices, list(range(len(indices))), len(indices), state)
        size = max(1, -(-len(indices) // max(1, threads)))
        starts = list(range(0, len(indices), size))
        units = [indices[start : start + size] for start in starts]
        return Reading(seq, number, units, starts, len(indices), state)

    def read(self, batch: Reading, unit: int) -> Any:
        """Read one unit of ``batch`` (any thread), with its samples' seeds in reach."""
        index = batch.units[unit]
        start = batch.starts[unit]
        enter_sample(batch.number, start)
        try:
            if self._getitems is not None:
                return self._getitems(index)
            if not self._batched or self.sample_grain:
                return self._dataset[index]
            data = []  # the whole batch, sample by sample, as the DataLoader's fetcher reads
            for position, sample in enumerate(index, start):
                enter_sample(batch.number, position)
                data.append(self._dataset[sample])
            return data
        finally:
            leave_sample()

    def join(self, batch: Reading) -> tuple[Any, float]:
        """Collate a complete batch's units in order (and pin it); return it and collate time."""
        parts = batch.parts
        if not self._batched or not self.sample_grain:
            data = parts[0]
        elif self._getitems is not None:
            data = [sample for part in parts for sample in part]
        else:
            data = parts
        batch.parts = []
        started = time.perf_counter()
        item = self._collate(data)
        collated = time.perf_counter() - started
        if self._pin:
            item = pin(item, self._pin_device)
        return item, collated

    def release(self) -> None:
        """Release the DataLoader's iterator (no worker processes: nothing to stop)."""
        release_source(self._iterator, owned=True)

    def broken(self) -> bool:
        """Never: draws come from the sampler, and a batch that raised leaves it as it was."""
        return False


def check_parallel_loader(loader: object, caller: str) -> None:
    """Raise, saying why and what to do, unless ``loader`` can be fetched in parallel.

    Raises:
        TypeError: ``loader`` is not a map-style DataLoader.
        ValueError: the DataLoader has worker processes or a dataset with its own state.
        RuntimeError: torch changed the DataLoader iterator's internals parallel fetch
            needs, or ``PREFETCH_TORCH_WORKAROUNDS=0`` (:mod:`prefetch._torch.fetcher`).
    """
    what = f"{caller}(fetch_threads=...)"
    if not isinstance(loader, DataLoader):
        msg = (
            f"{what} reads a DataLoader's dataset, sampler and collate_fn in threads; "
            f"got {type(loader).__name__}. For any other iterable leave fetch_threads "
            "unset: one thread overlaps its loading with your loop"
        )
        raise TypeError(msg)
    if isinstance(loader.dataset, IterableDataset):
        kind = type(loader.dataset)  # Hugging Face's class is named IterableDataset itself
        found = f"{kind.__qualname__}, an IterableDataset"
        if kind.__qualname__ == "IterableDataset":
            found = f"an IterableDataset (from {kind.__module__})"
        msg = (
            f"{what} needs a map-style dataset (indices to read in parallel); got {found}, "
            "which only its own iterator can read, in order. Leave fetch_threads unset, or "
            "give it num_workers (each worker process reads its own shard)"
        )
        raise TypeError(msg)
    if loader.num_workers > 0:
        msg = (
            f"{what} replaces worker processes with threads, but this DataLoader has "
            f"num_workers={loader.num_workers}. Build it with num_workers=0, or leave "
            "fetch_threads unset to overlap the workers' batches with one thread"
        )
        raise ValueError(msg)
    if (refused := refusal(what)) is not None:  # torch changed its iterator, or switched off
        raise RuntimeError(refused)
    own = own_iteration(type(loader))
    if own is not None:
        msg = (
            f"{what} reads a DataLoader's batches without its own next(), but "
            f"{type(loader).__name__} defines its own {own} (accelerate's prepared loaders "
            "do: device placement, synchronised random states), which parallel fetch "
            "would skip. Pass a DataLoader or StatefulDataLoader, or leave fetch_threads "
            "unset over this one"
        )
        raise TypeError(msg)
    if callable(getattr(loader.dataset, "state_dict", None)):
        msg = (
            f"{what} cannot read a dataset with its own state "
            f"({type(loader.dataset).__name__}.state_dict) from several threads: the "
            "state would not match the batches. Leave fetch_threads unset"
        )
        raise ValueError(msg)


def sampler_tasks(
    loader: DataLoader[Any],
    iterator: Iterator[Any],
    caller: str,
    grain: str = "sample",
) -> SamplerTasks:
    """Return the parallel-fetch tasks of ``loader`` (checked), whose ``iter()`` gave ``iterator``.

    The tasks are the same for one thread (the default ``BackgroundLoader``
    over a map-style DataLoader, so that :func:`~prefetch.sample_seed` works):
    the thread policy, not the tasks, records how many threads read them.

    Raises:
        TypeError: the iterator is not torch's single-process DataLoader iterator.
    """
    what = f"{caller}(fetch_threads=...)"
    if not swap_fetcher(iterator, _Indices):
        msg = (
            f"{what} needs torch's single-process DataLoader iterator; "
            f"iter({type(loader).__name__}) gave {type(iterator).__name__}"
        )
        raise TypeError(msg)
    return SamplerTasks(loader, iterator, grain)
