"""Shared pieces of the GPU tests: batches that never read as correct by accident.

Every batch ``k`` holds ``BASE + k`` (never 0), and the memory a race could
expose is first filled with ``POISON``: a read that comes too early, or from
recycled memory, sees ``POISON`` or another batch's value, never the right
one. The caching allocator keeps one pool per stream, so :func:`poison`
fills blocks on the stream whose pool the racing allocation will use.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from prefetch import CudaPrefetcher
from prefetch._device.copier import StreamCopier
from prefetch._device.host import HostCheck

BASE = 1000.0
POISON = -7.0e6
SLOW_CYCLES = 20_000_000  # ~10 ms of spinning on the GPU
ELEMENTS = 1 << 20


def busy_gpu(seconds: float) -> int:
    """Run 4096x4096 matrix products for ``seconds``, synchronizing; return how many ran.

    The GPU's clock rises under this load, so GPU-time calibrations that follow
    measure the clock the test runs at, not the idle one.
    """
    matrix = torch.randn(4096, 4096, device="cuda")
    product = torch.empty_like(matrix)
    count = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        for _ in range(4):
            torch.mm(matrix, matrix, out=product)
        torch.cuda.synchronize()
        count += 4
    return count


def elapsed_ms(loop: Callable[[], object]) -> float:
    """Run ``loop`` once and return its GPU time, measured with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    loop()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end))


def median_ms(loop: Callable[[], object], probes: int = 3) -> float:
    """The median GPU time of ``probes`` runs of ``loop`` (after one unmeasured run)."""
    elapsed_ms(loop)
    return statistics.median(elapsed_ms(loop) for _ in range(probes))


def sleep_cycles_for(milliseconds: float) -> int:
    """The ``torch.cuda._sleep`` argument that spins for about ``milliseconds``, at today's clock.

    ``_sleep`` spins for a number of GPU cycles, so its time depends on the
    clock: call it on a warm GPU (see :func:`busy_gpu`).
    """
    probe = 10_000_000
    return int(probe * milliseconds / median_ms(lambda: torch.cuda._sleep(probe)))


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


def check_first_batch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the pageable-copy check look at the first batch only (the old check: a sabotage)."""
    check = HostCheck.check

    def first_only(self: HostCheck, host: Any) -> None:
        if self._batches == 0:
            check(self, host)
        self._batches += 1

    monkeypatch.setattr(HostCheck, "check", first_only)


class Opaque:
    """A wrapper that hides what it wraps: only the thread check sees the order."""

    def __init__(self, loader: Any) -> None:
        self._inner = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self._inner)


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
