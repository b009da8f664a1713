"""The patterns users copy today, written out here so the benchmarks can time them.

* :class:`DataLoaderX` - the ``DataLoader`` subclass found in countless
  repositories, whose ``__iter__`` returns
  ``prefetch_generator.BackgroundGenerator(super().__iter__())``.
* :class:`ApexStylePrefetcher` - the one-ahead ``data_prefetcher`` of NVIDIA
  apex's ImageNet example: a side stream created per epoch, ``wait_stream``
  and ``record_stream`` on ``next()``, ``None`` at the end, normalisation on
  the side stream.
* :class:`TimmStylePrefetcher` - timm's ``PrefetchLoader`` pattern: a
  generator that creates a side stream per epoch, copies and normalises the
  next batch on it and yields the previous one after ``wait_stream``
  (without ``record_stream``).

They reproduce the patterns for measurement only; they are not part of the
library's API.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

__all__ = ["ApexStylePrefetcher", "DataLoaderX", "TimmStylePrefetcher"]

Pair = tuple[torch.Tensor, torch.Tensor]


class DataLoaderX(DataLoader):  # type: ignore[type-arg]  # the recipe as people copy it
    """``DataLoader`` whose iterator runs in a ``prefetch_generator`` thread."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # the recipe returns a generator
        import prefetch_generator  # here: the gpu workload runs where it is not installed

        return prefetch_generator.BackgroundGenerator(super().__iter__())  # type: ignore[no-any-return]  # prefetch_generator is untyped


def _scale(values: tuple[float, float, float], device: torch.device) -> torch.Tensor:
    return torch.tensor([v * 255 for v in values], device=device).view(1, 3, 1, 1)


class ApexStylePrefetcher:
    """One batch ahead on a side stream, as in apex's ``data_prefetcher``.

    Iterating yields ``(input, target)`` pairs until the underlying
    ``next()`` returns ``None``, as the apex training loop does.
    """

    def __init__(
        self,
        loader: Any,
        device: torch.device,
        mean: tuple[float, float, float],
        std: tuple[float, float, float],
    ) -> None:
        self.loader = iter(loader)
        self.stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]  # torch leaves it untyped
        self.device = device
        self.mean = _scale(mean, device)
        self.std = _scale(std, device)
        self.next_input: torch.Tensor | None = None
        self.next_target: torch.Tensor | None = None
        self.preload()

    def preload(self) -> None:
        """Start copying the next batch on the side stream (or mark the end)."""
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = None
            self.next_target = None
            return
        with torch.cuda.stream(self.stream):
            assert self.next_input is not None and self.next_target is not None
            self.next_input = self.next_input.to(self.device, non_blocking=True)
            self.next_target = self.next_target.to(self.device, non_blocking=True)
            self.next_input = self.next_input.float().sub_(self.mean).div_(self.std)

    def next(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Return the batch copied last time and start copying the one after."""
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        batch_input, target = self.next_input, self.next_target
        if batch_input is not None:
            batch_input.record_stream(current)
        if target is not None:
            target.record_stream(current)
        self.preload()
        return batch_input, target

    def __iter__(self) -> Iterator[Pair]:
        batch_input, target = self.next()
        while batch_input is not None and target is not None:
            yield batch_input, target
            batch_input, target = self.next()


class TimmStylePrefetcher:
    """timm's ``PrefetchLoader`` pattern: one batch ahead, new stream per epoch."""

    def __init__(
        self,
        loader: Any,
        device: torch.device,
        mean: tuple[float, float, float],
        std: tuple[float, float, float],
    ) -> None:
        self.loader = loader
        self.device = device
        self.mean = _scale(mean, device)
        self.std = _scale(std, device)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Pair]:
        stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]  # torch leaves it untyped
        first = True
        batch_input = target = torch.empty(0)
        for next_input, next_target in self.loader:
            with torch.cuda.stream(stream):
                next_input = next_input.to(device=self.device, non_blocking=True)
                next_target = next_target.to(device=self.device, non_blocking=True)
                next_input = next_input.float().sub_(self.mean).div_(self.std)
            if not first:
                yield batch_input, target
            else:
                first = False
            torch.cuda.current_stream(self.device).wait_stream(stream)
            batch_input, target = next_input, next_target
        if not first:
            yield batch_input, target
