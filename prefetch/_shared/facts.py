"""What the summary's advice knows of a wrapped loader and the machine: :class:`LoaderFacts`.

Recorded once, where a loader is wrapped (a wrapper over another takes its
facts), and copied into each epoch's stats (:attr:`LoaderStats.facts
<prefetch.LoaderStats.facts>`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

KINDS = ("map", "iterable", "prepared", "workers", "other")
"""What :attr:`LoaderFacts.kind` may be."""


def usable_cores() -> int:
    """Return the cores this process may run on (its CPU affinity where known).

    Example:
        >>> usable_cores() >= 1
        True
    """
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


def gil_enabled() -> bool:
    """Return whether the GIL is on (always, before free-threaded Python 3.13)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


@dataclasses.dataclass(frozen=True)
class LoaderFacts:
    """What the summary's advice knows of the wrapped loader and the machine.

    Recorded where the loader is wrapped (``BackgroundLoader(...)``,
    ``CudaPrefetcher(...)``; a wrapper over another takes its facts), so that
    ``summary()`` can tell the scenarios apart and never names a setting the
    loader refuses.

    Attributes:
        kind: The innermost loader: ``"map"`` (a map-style ``DataLoader``
            with ``num_workers=0``), ``"iterable"`` (a ``DataLoader`` over an
            ``IterableDataset``, ``num_workers=0``), ``"prepared"`` (an
            accelerate-prepared ``DataLoader``, ``num_workers=0``:
            ``fetch_threads`` refuses it), ``"workers"`` (a ``DataLoader``
            with worker processes), ``"other"`` (any other iterable).
        workers: The ``DataLoader``'s ``num_workers`` (0 for other loaders).
        depth: ``"auto"`` or ``"fixed"``: the ``BackgroundLoader``'s depth;
            ``""`` without one in the stack.
        num_threads: The ``BackgroundLoader``'s ``num_threads`` (``None``:
            not set, the loading thread's torch ops use every core).
        fetch_threads: Whether its ``fetch_threads`` is set (threads read
            the ``DataLoader``'s batches in parallel already).
        cores: The cores this process may use, when the loader was wrapped.
        gil_enabled: Whether the GIL was on then (``False`` on a
            free-threaded Python running with the GIL off).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from prefetch import LoaderFacts
        >>> facts = LoaderFacts.of(DataLoader(range(8), batch_size=2))
        >>> facts.kind, facts.workers, facts.depth
        ('map', 0, '')
        >>> facts.background(1, True, None).depth
        'auto'
    """

    kind: str = "other"
    workers: int = 0
    depth: str = ""
    num_threads: int | None = None
    fetch_threads: bool = False
    cores: int = 0
    gil_enabled: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            msg = f"LoaderFacts(kind=...) must be one of {KINDS}, got {self.kind!r}"
            raise ValueError(msg)

    @classmethod
    def of(cls, loader: Any) -> LoaderFacts:
        """Return the facts of ``loader`` (not a prefetch wrapper) and of this machine now."""
        kind, workers = "other", 0
        if isinstance(loader, DataLoader):
            workers = loader.num_workers
            if workers > 0:
                kind = "workers"
            elif type(loader).__module__.split(".")[0] == "accelerate":
                kind = "prepared"
            elif isinstance(loader.dataset, IterableDataset):
                kind = "iterable"
            else:
                kind = "map"
        return cls(kind=kind, workers=workers, cores=usable_cores(), gil_enabled=gil_enabled())

    def background(
        self, num_threads: int | None, adaptive: bool, fetch_threads: object
    ) -> LoaderFacts:
        """Return these facts under a ``BackgroundLoader`` with these settings."""
        depth = "auto" if adaptive else "fixed"
        parallel = fetch_threads is not None
        return dataclasses.replace(
            self, depth=depth, num_threads=num_threads, fetch_threads=parallel
        )
