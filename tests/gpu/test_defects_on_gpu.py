"""On a real GPU: the protections issue 19 added, each with a control that reads a wrong result.

The stack's order and thread, a side stream of our own (outside torch's
pool, and non-blocking), the record_stream run-ahead bound, inputs a failed
or dropped transform read, the pageable-copy warnings, and Normalize (one
kernel, coefficients per stream). A control switches its protection off and
must see the failure, so a pass means the protection, not luck.
"""

from __future__ import annotations

import gc
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher, Normalize
from prefetch._device import iterator as device_iterator
from prefetch._device import normalize as normalize_module
from prefetch._device import streams
from prefetch._device.copier import KeepAlive
from prefetch._device.ops import DeviceOps

from .gpu_helpers import (
    BASE,
    ELEMENTS,
    POISON,
    SLOW_CYCLES,
    Opaque,
    Packed,
    busy_gpu,
    check_first_batch_only,
    disable,
    expected,
    host_batches,
    poison,
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


class Boom(Exception):
    """A transform's error."""


def device_inputs(n: int) -> Iterator[dict[str, torch.Tensor]]:
    """Inputs already on the GPU, written on the consumer stream, freed once let go."""
    for k in range(n):
        yield {"x": torch.full((ELEMENTS,), BASE + k, device="cuda")}


def read_by_raising_transform(n: int = 10) -> list[float]:
    """What a transform that spins, reads its input and raises read from each of ``n`` inputs."""
    outs: list[torch.Tensor] = []

    def read_then_raise(batch: dict[str, torch.Tensor]) -> Any:
        torch.cuda._sleep(SLOW_CYCLES)
        outs.append(batch["x"] * 1.0)
        raise Boom

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    iterator = iter(CudaPrefetcher(device_inputs(n), transform=read_then_raise, depth=3))
    errors = 0
    while True:
        try:
            next(iterator)
        except Boom:
            errors += 1  # the loop goes on: the next input is made where the last one was
        except StopIteration:
            break
    torch.cuda.synchronize()
    assert errors == n
    return [o.mean().item() for o in outs]


def packed_inputs(n: int) -> Iterator[dict[str, Packed]]:
    for k in range(n):
        yield {"p": Packed(torch.full((ELEMENTS,), BASE + k, device="cuda"))}


def read_by_dropped_batches() -> list[float]:
    """Close an epoch while three transforms still spin; overwrite freed memory; read theirs."""
    outs: list[torch.Tensor] = []

    def slow_read(batch: dict[str, Packed]) -> torch.Tensor:
        torch.cuda._sleep(SLOW_CYCLES)
        outs.append(batch["p"].tensor * 1.0)
        return outs[-1]

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    iterator = iter(CudaPrefetcher(packed_inputs(6), depth=3, transform=slow_read))
    next(iterator)  # batches 1 to 3 are in flight, their transforms queued behind a spin
    iterator.close()
    gc.collect()
    overwrite = [torch.full((ELEMENTS,), POISON, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    del overwrite
    return [o.mean().item() for o in outs]


class TestTransformInputs:
    """Inputs a transform reads stay intact until it has read them, whatever happens to it."""

    def test_failed_transform_read_its_own_input(self) -> None:
        """The transform raised after queuing its read: the input was kept until the read."""
        assert read_by_raising_transform() == expected(10)

    def test_control_without_keeping_inputs(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: not recorded on the side stream, the next input takes its memory first."""
        disable(monkeypatch, "_keep_inputs_alive")
        assert read_by_raising_transform() != expected(10)

    def test_dropped_batches_read_their_own_inputs(self) -> None:
        """Closed mid-flight: the consumer stream reuses the inputs only after the transforms."""
        assert read_by_dropped_batches() == expected(4)

    def test_control_dropped_without_the_wait(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: released without the consumer's wait, the inputs are overwritten first."""
        monkeypatch.setattr(KeepAlive, "order_consumer", lambda self: None)
        assert read_by_dropped_batches() != expected(4)


def pageable_warnings(batches: list[Any]) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        list(CudaPrefetcher(batches))
    return [str(w.message) for w in record if "CudaPrefetcher:" in str(w.message)]


def pinned_strided() -> torch.Tensor:
    """A view of pinned memory with gaps: pinned, not dense."""
    view = torch.full((ELEMENTS, 2), BASE).pin_memory()[:, 0]
    assert view.is_pinned()
    return view


class TestPageableCopies:
    """Warnings about what really happens, on real pinned memory."""

    def test_a_later_unpinned_batch_warns(self) -> None:
        """Three pinned batches, then an unpinned one: one warning, naming batch 3."""
        messages = pageable_warnings(host_batches(3) + host_batches(1, pinned=False))
        assert len(messages) == 1 and "batch 3 arrives in unpinned host memory" in messages[0]

    def test_pinned_not_dense_warns(self) -> None:
        """A pinned view with gaps warns that torch copies it into pageable memory first."""
        messages = pageable_warnings([*host_batches(1), pinned_strided()])
        assert len(messages) == 1 and "batch 1 is pinned but not dense" in messages[0]

    def test_control_first_batch_only(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: the first batch alone (the old check) says nothing about batch 3."""
        check_first_batch_only(monkeypatch)
        assert pageable_warnings(host_batches(3) + host_batches(1, pinned=False)) == []

    def test_pinning_thread_pins_a_dense_copy(self) -> None:
        """BackgroundLoader(pin_memory=True) turns the pinned view into dense pinned memory."""
        (out,) = list(BackgroundLoader([pinned_strided()], pin_memory=True))
        assert out.is_pinned() and out.is_contiguous() and out[0].item() == BASE


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cuda_kernels(work: Callable[[], object]) -> list[str]:
    """The names of the CUDA kernels ``work`` launches (empty if the profiler sees none)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        work()
        torch.cuda.synchronize()
    return [e.name for e in trace.events() if e.device_type == DeviceType.CUDA]


def device_images() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=generator)
    return x.cuda()


class TestNormalizeOnGpu:
    """One kernel per batch, and coefficients that are never read before they are written."""

    def test_one_kernel(self) -> None:
        """uint8 to channels-last float16 in one kernel (converting as it loads and stores)."""
        normalize = Normalize(MEAN, STD, key=None, dtype=torch.float16, channels_last=True)
        x = device_images()
        normalize(x)  # the coefficients, once
        kernels = cuda_kernels(lambda: normalize(x))
        if not kernels:
            pytest.skip("the profiler recorded no CUDA kernel here")
        assert len(kernels) == 1, kernels

    def test_control_three_passes_are_four_kernels(self) -> None:
        """Control: the old convert, compute, round and reformat launch four."""
        x = device_images()
        scale = torch.tensor([1 / (s * 255) for s in STD], device="cuda").view(-1, 1, 1)
        shift = torch.tensor([-m / s for m, s in zip(MEAN, STD, strict=True)], device="cuda")
        shift = shift.view(-1, 1, 1)

        def old() -> torch.Tensor:
            result = torch.addcmul(shift, x.to(torch.float32), scale).to(torch.float16)
            return result.contiguous(memory_format=torch.channels_last)

        kernels = cuda_kernels(old)
        if not kernels:
            pytest.skip("the profiler recorded no CUDA kernel here")
        assert len(kernels) == 4, kernels

    @staticmethod
    def two_streams(normalize: Normalize) -> torch.Tensor:
        """Use ``normalize`` first on a stream that is busy, then at once on another one."""
        busy = DeviceOps(torch.device("cuda", torch.cuda.current_device())).new_stream()
        poison(busy, size=1 << 18)  # a fresh pool: whatever it allocates first reads POISON
        x = device_images()
        torch.cuda.synchronize()
        with torch.cuda.stream(busy):
            torch.cuda._sleep(5 * SLOW_CYCLES)
            normalize(x)  # its coefficients are filled after the spin
        with torch.cuda.stream(torch.cuda.Stream()):
            second = normalize(x)
        torch.cuda.synchronize()
        mean = torch.tensor(MEAN, device="cuda", dtype=torch.float64).view(-1, 1, 1)
        std = torch.tensor(STD, device="cuda", dtype=torch.float64).view(-1, 1, 1)
        return (second.double() - (x.double() / 255 - mean) / std).abs().max()

    def test_second_stream_builds_its_own(self) -> None:
        """One Normalize on two streams: the second reads coefficients filled on its own."""
        assert self.two_streams(Normalize(MEAN, STD, key=None)).item() < 1e-5

    def test_control_shared_coefficients_read_early(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: cached for every stream, the second stream reads them before the fill."""
        monkeypatch.setattr(normalize_module, "_stream_key", lambda device: None)
        assert not self.two_streams(Normalize(MEAN, STD, key=None)).item() < 1e-5
