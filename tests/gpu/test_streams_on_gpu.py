"""On a real GPU: the waits and lifetime protections matter, and memory stays flat.

Each correctness test has a control with the protection switched off that must
show the corruption the protection prevents, so a pass means something.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
SLOW_CYCLES = 20_000_000  # ~10 ms of spinning on the GPU


def host_batches(n: int, size: int = 1 << 20) -> list[torch.Tensor]:
    """Pinned host tensors filled with their index."""
    return [torch.full((size,), float(i)).pin_memory() for i in range(n)]


def slow_fill(batch: torch.Tensor) -> torch.Tensor:
    """A transform that spins on the (side) stream, then rewrites the batch."""
    torch.cuda._sleep(SLOW_CYCLES)
    return batch * 1.0


def sums_on_consumer(prefetcher: CudaPrefetcher[Any]) -> list[float]:
    """Read each batch on the consumer stream immediately; return its mean per element."""
    results = [batch.mean() for batch in prefetcher]
    torch.cuda.synchronize()
    return [r.item() for r in results]


def disable(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:
        monkeypatch.setattr(CudaPrefetcher, name, lambda self, *args: None)


class TestConsumerWait:
    """The consumer stream waits for each batch's copy and transform."""

    def test_immediate_read_is_correct(self) -> None:
        """Reading right after hand-off sees the finished batch."""
        batches = host_batches(8)
        assert sums_on_consumer(CudaPrefetcher(batches, transform=slow_fill)) == [
            float(i) for i in range(8)
        ]

    def test_control_without_wait_reads_early(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: without the wait, some read sees an unfinished batch."""
        disable(monkeypatch, "_consumer_wait")
        batches = host_batches(8)
        assert sums_on_consumer(CudaPrefetcher(batches, transform=slow_fill)) != [
            float(i) for i in range(8)
        ]


def far_ahead_consumer(prefetcher: CudaPrefetcher[Any]) -> list[float]:
    """Queue slow work before each read and drop each batch at once."""
    results = []
    for batch in prefetcher:
        torch.cuda._sleep(SLOW_CYCLES)
        results.append(batch.mean())
        del batch
    torch.cuda.synchronize()
    return [r.item() for r in results]


class TestLifetime:
    """Memory the consumer still reads is never recycled for the next copy."""

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_far_ahead_consumer_reads_its_own_batch(self, lifetime: Any) -> None:
        """With either lifetime mode, every read sees its own batch."""
        batches = host_batches(12)
        assert far_ahead_consumer(CudaPrefetcher(batches, lifetime=lifetime, depth=2)) == [
            float(i) for i in range(12)
        ]

    def test_control_without_protection_is_corrupted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: with neither fence nor record_stream, a read sees recycled memory."""
        disable(monkeypatch, "_fence")
        batches = host_batches(12)
        assert far_ahead_consumer(CudaPrefetcher(batches, lifetime="fence", depth=2)) != [
            float(i) for i in range(12)
        ]


class TestMemory:
    """One side stream per prefetcher keeps reserved memory flat."""

    def test_reserved_memory_flat_over_40_epochs(self) -> None:
        """Reserved memory after epoch 40 equals that after epoch 2."""
        loader = CudaPrefetcher(BackgroundLoader(host_batches(6, 1 << 18), pin_memory=True))
        reserved = []
        for _ in range(40):
            for batch in loader:
                batch.mul_(2)
            torch.cuda.synchronize()
            reserved.append(torch.cuda.memory_reserved())
        print(f"reserved bytes, epochs 2 / 40: {reserved[1]} / {reserved[-1]}")
        assert reserved[-1] == reserved[1]
        assert loader.stream is not None


class TestOverlap:
    """Copies overlap compute; results equal a plain loop's (timings are printed, not asserted)."""

    def test_same_results_as_plain_copies(self) -> None:
        """The prefetched loop computes what the plain .to(device) loop computes; both are timed."""
        batches = host_batches(20, 1 << 22)
        weight = torch.randn(1024, 1024, device="cuda")

        def step(x: torch.Tensor) -> torch.Tensor:
            y = x[: 1024 * 256].view(256, 1024)
            for _ in range(4):
                y = torch.tanh(y @ weight)
            return y.sum()

        def timed(loop: Any) -> tuple[float, list[float]]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = loop()
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end)), [o.item() for o in out]

        def plain() -> list[torch.Tensor]:
            return [step(host.to("cuda", non_blocking=True)) for host in batches]

        def prefetched() -> list[torch.Tensor]:
            return [step(batch) for batch in CudaPrefetcher(batches)]

        timed(plain), timed(prefetched)  # warm up
        plain_ms, plain_out = timed(plain)
        prefetched_ms, prefetched_out = timed(prefetched)
        print(f"epoch of 20 steps: plain {plain_ms:.1f} ms, CudaPrefetcher {prefetched_ms:.1f} ms")
        assert prefetched_out == plain_out
