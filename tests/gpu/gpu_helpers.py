"""Shared pieces of the GPU tests: batches that never read as correct by accident.

Every batch ``k`` holds ``BASE + k`` (never 0), and the memory a race could
expose is first filled with ``POISON``: a read that comes too early, or from
recycled memory, sees ``POISON`` or another batch's value, never the right
one. The caching allocator keeps one pool per stream, so :func:`poison`
fills blocks on the stream whose pool the racing allocation will use.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from prefetch import CudaPrefetcher
from prefetch._device.copier import StreamCopier

BASE = 1000.0
POISON = -7.0e6
SLOW_CYCLES = 20_000_000  # ~10 ms of spinning on the GPU
ELEMENTS = 1 << 20


def expected(n: int) -> list[float]:
    """The per-batch values a correct run reads."""
    return [BASE + k for k in range(n)]


def host_batches(n: int, size: int = ELEMENTS, *, pinned: bool = True) -> list[torch.Tensor]:
    """Host tensors filled with ``BASE + k``."""
    batches = [torch.full((size,), BASE + k) for k in range(n)]
    return [b.pin_memory() for b in batches] if pinned else batches


def poison(stream: Any, size: int = ELEMENTS, blocks: int = 8) -> None:
    """Leave ``blocks`` freed ``POISON``-filled blocks of ``size`` floats in ``stream``'s pool."""
    with torch.cuda.stream(stream):
        filled = [torch.full((size,), POISON, device=stream.device) for _ in range(blocks)]
        del filled
    torch.cuda.synchronize()


def poisoned_iter(prefetcher: CudaPrefetcher[Any], size: int = ELEMENTS) -> Any:
    """Start an epoch with the side stream's and the consumer's pools poisoned."""
    iterator = iter(prefetcher)  # creates the side stream; nothing is copied yet
    poison(prefetcher.stream, size)
    poison(torch.cuda.current_stream(), size)
    return iterator


def slow_copy(batch: Any) -> Any:
    """A transform that spins on the (side) stream, then writes the batch anew."""
    torch.cuda._sleep(SLOW_CYCLES)
    return batch * 1.0


def disable(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Switch off StreamCopier protections (the sabotage the controls need)."""
    for name in names:
        monkeypatch.setattr(StreamCopier, name, lambda self, *args: None)


class Packed:
    """A batch object with ``.to()``: its tensor is invisible to record_stream."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def to(self, device: Any, non_blocking: bool = False) -> Packed:
        return Packed(self.tensor.to(device, non_blocking=non_blocking))


@dataclasses.dataclass(frozen=True)
class Sample:
    """A dataclass batch leaf."""

    features: torch.Tensor
