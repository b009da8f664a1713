"""On a real GPU: the stack's order, a side stream of our own, and bounded memory.

The stack's order and thread, a side stream of our own (outside torch's
pool, and non-blocking) and the record_stream run-ahead bound, each with a
control that switches its protection off and must see the failure, so a
pass means the protection, not luck. ``test_inputs_on_gpu.py`` has the
inputs a transform reads, the pageable-copy warnings and Normalize.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._device import iterator as device_iterator
from prefetch._device import streams
from prefetch._device.ops import DeviceOps

from .gpu_helpers import (
    BASE,
    Opaque,
    busy_gpu,
    disable,
    expected,
    host_batches,
    poisoned_iter,
    sleep_cycles_for,
    slow_copy,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

RIGHT_ORDER = r"CudaPrefetcher\(BackgroundLoader\(\.\.\.\)\)"


@pytest.fixture
def fresh_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Side streams from an empty registry: no stream of an earlier test is recycled."""
    monkeypatch.setattr(streams, "REGISTRY", streams.StreamRegistry())


def read_on_user_stream(loader: Any) -> list[float]:
    """Consume ``loader`` under ``with torch.cuda.stream(user)``, reading each batch at once."""
    user = torch.cuda.Stream()
    results = []
    with torch.cuda.stream(user):
        for batch in loader:
            results.append(batch.mean())
    torch.cuda.synchronize()
    return [r.item() for r in results]


class TestStacking:
    """The wrong order is refused; an epoch driven from another thread raises."""

    def test_refused_at_construction(self) -> None:
        """BackgroundLoader(CudaPrefetcher(...)) is a TypeError naming the right order."""
        with pytest.raises(TypeError, match=RIGHT_ORDER):
            BackgroundLoader(CudaPrefetcher(host_batches(2)))

    def test_background_thread_behind_an_opaque_wrapper_raises(self) -> None:
        """Hidden from construction, the first batch raises instead of reading early."""
        loader = BackgroundLoader(Opaque(CudaPrefetcher(host_batches(4), transform=slow_copy)))
        with pytest.raises(RuntimeError, match=RIGHT_ORDER):
            read_on_user_stream(loader)
        loader.close()

    def test_control_without_the_thread_check_reads_early(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: without the check, the waits go to the thread's default stream: early reads."""
        same_thread = types.SimpleNamespace(
            get_ident=lambda: 0, current_thread=threading.current_thread
        )
        monkeypatch.setattr(device_iterator, "threading", same_thread)
        prefetcher = CudaPrefetcher(host_batches(8), transform=slow_copy)
        poisoned_iter(prefetcher).close()  # the side stream exists now, its pool poisoned
        loader = BackgroundLoader(Opaque(prefetcher), depth=8)
        assert read_on_user_stream(loader) != expected(8)


def pool_handles(device: torch.device) -> set[int]:
    """The handles a burst of ``torch.cuda.Stream()`` calls hands out, at every priority."""
    return {
        torch.cuda.Stream(device=device, priority=priority).cuda_stream
        for priority in (0, -1, -2, -3, -4, -5)
        for _ in range(64)
    }


def runs_beside_the_default_stream(side: Any) -> bool:
    """Whether work on ``side`` completes while the default stream is still busy."""
    cycles = sleep_cycles_for(300.0)
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.default_stream()):
        torch.cuda._sleep(cycles)
    marker = torch.cuda.Event()
    marker.record(side)
    deadline = time.monotonic() + 0.1
    while not marker.query() and time.monotonic() < deadline:
        time.sleep(0.001)
    beside = marker.query() and not torch.cuda.default_stream().query()
    torch.cuda.synchronize()
    return beside


def first_epoch_stream() -> Any:
    loader = CudaPrefetcher(host_batches(2))
    assert [b[0].item() for b in loader] == expected(2)
    return loader.stream


@pytest.mark.usefixtures("fresh_streams")
class TestOwnSideStream:
    """The side stream is nobody else's, and does not wait for the default stream."""

    def test_not_among_pool_streams(self) -> None:
        """No torch.cuda.Stream(), at any priority, is handed our stream."""
        stream = first_epoch_stream()
        assert isinstance(stream, torch.cuda.ExternalStream)
        assert stream.cuda_stream not in pool_handles(stream.device)
        assert stream != torch.cuda.default_stream(stream.device)

    def test_control_a_pool_stream_is_handed_out_again(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: a side stream taken from the pool comes back from the burst."""
        monkeypatch.setattr(
            DeviceOps, "new_stream", lambda self: torch.cuda.Stream(device=self.device)
        )
        stream = first_epoch_stream()
        assert stream.cuda_stream in pool_handles(stream.device)

    def test_non_blocking(self) -> None:
        """Work on it runs while the (legacy) default stream spins: copies overlap the step."""
        assert runs_beside_the_default_stream(first_epoch_stream())

    def test_control_a_blocking_stream_waits(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: created without the non-blocking flag, it waits for the default stream."""
        monkeypatch.setattr(streams, "CU_STREAM_NON_BLOCKING", 0)
        assert not runs_beside_the_default_stream(first_epoch_stream())


BIG = 1 << 22  # floats: 16 MiB, a segment of its own in the caching allocator


def peak_batches(lifetime: Any, depth: int = 1, steps: int = 60) -> tuple[float, float]:
    """Peak reserved and allocated device memory, in batches, over a loop with no sync."""
    host = torch.full((BIG,), BASE).pin_memory()
    busy_gpu(0.3)
    cycles = sleep_cycles_for(2.0)  # a step several times longer than a copy

    def source() -> Iterator[torch.Tensor]:
        for _ in range(steps):
            yield host

    loader = CudaPrefetcher(source(), lifetime=lifetime, depth=depth)
    sums = []
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for batch in loader:
        torch.cuda._sleep(cycles)
        sums.append(batch[:1].sum())
    torch.cuda.synchronize()
    size = host.numel() * host.element_size()
    peak = (
        (torch.cuda.max_memory_reserved() - reserved) / size,
        (torch.cuda.max_memory_allocated() - allocated) / size,
    )
    assert [s.item() for s in sums] == [BASE] * steps
    print(f"{lifetime}, depth {depth}: peak reserved {peak[0]:.1f}, allocated {peak[1]:.1f}")
    return peak


class TestRunAheadMemory:
    """Device memory stays bounded over a long loop that never synchronizes.

    ``max_memory_allocated`` counts live tensors only: the caching allocator
    stops counting a block at its free even while a ``record_stream`` use
    keeps it from reuse. The growth the bound prevents shows in
    ``max_memory_reserved``: blocks that could not be reused yet.
    """

    @pytest.mark.parametrize(("lifetime", "most"), [("fence", 4), ("record_stream", 7)])
    @pytest.mark.parametrize("depth", [1, 2])
    def test_bounded(self, lifetime: Any, most: int, depth: int) -> None:
        """fence: depth + 2 batches (+1 spare); record_stream: 2 * depth + 3 (+2 spare)."""
        limit = most + (depth - 1) * (1 if lifetime == "fence" else 2)
        reserved, allocated = peak_batches(lifetime, depth)
        assert reserved <= limit and allocated <= limit

    def test_control_without_the_bound_record_stream_grows(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: with the CPU free to run ahead, record_stream holds a third of the epoch."""
        disable(monkeypatch, "_bound_run_ahead")
        reserved, _allocated = peak_batches("record_stream")
        assert reserved >= 20
