"""On a real GPU: inputs a transform reads, pageable copies, and Normalize.

Inputs a failed or dropped transform read, the pageable-copy warnings, and
Normalize (one kernel, coefficients per stream), each with a control that
switches its protection off and must see the failure.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher, Normalize
from prefetch._device import normalize as normalize_module
from prefetch._device.copier import KeepAlive
from prefetch._device.ops import DeviceOps

from .gpu_helpers import (
    BASE,
    ELEMENTS,
    POISON,
    SLOW_CYCLES,
    Packed,
    check_first_batch_only,
    disable,
    expected,
    host_batches,
    poison,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


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
