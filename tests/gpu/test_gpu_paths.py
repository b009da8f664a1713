"""On a real GPU: overlap, the pinning thread, flat memory, Normalize and a second GPU."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher, Normalize

from .gpu_helpers import busy_gpu, elapsed_ms, expected, host_batches, median_ms, sleep_cycles_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


class TestOverlap:
    """With a step longer than the copy, prefetching hides the copy behind it."""

    def test_prefetched_epoch_at_most_three_quarters_of_plain(self) -> None:
        """prefetched <= 0.75 x plain for 20 steps, each 1.5x as long as one batch's copy."""
        batches = host_batches(20, 1 << 24)  # 64 MiB each, pinned
        busy_gpu(0.5)  # pinning 1.3 GB left the GPU idle: back to its working clock
        copy_ms = median_ms(lambda: batches[0].to("cuda", non_blocking=True))
        cycles = sleep_cycles_for(1.5 * copy_ms)  # median of three probes, warm
        sums: dict[str, list[torch.Tensor]] = {"plain": [], "prefetched": []}

        def step(x: torch.Tensor, into: str) -> None:
            torch.cuda._sleep(cycles)  # the compute, longer than the copy
            sums[into].append(x[:1].clone())

        def plain() -> None:
            for host in batches:
                step(host.to("cuda", non_blocking=True), "plain")

        def prefetched() -> None:
            for batch in CudaPrefetcher(batches):
                step(batch, "prefetched")

        elapsed_ms(plain), elapsed_ms(prefetched)  # warm up
        sums = {"plain": [], "prefetched": []}
        plain_ms, prefetched_ms = elapsed_ms(plain), elapsed_ms(prefetched)
        step_ms = median_ms(lambda: torch.cuda._sleep(cycles))  # the step as it ran
        print(
            f"copy {copy_ms:.2f} ms/batch, step {step_ms:.2f} ms (aimed at {1.5 * copy_ms:.2f}); "
            f"epoch plain {plain_ms:.1f} ms, prefetched {prefetched_ms:.1f} ms "
            f"({prefetched_ms / plain_ms:.2f})"
        )
        assert [s.item() for s in sums["prefetched"]] == [s.item() for s in sums["plain"]]
        assert step_ms >= copy_ms, "the spin got shorter than the copy: the clock changed"
        assert prefetched_ms <= 0.75 * plain_ms


class TestPinningThread:
    """Unpinned input pinned by BackgroundLoader's thread; one stream; flat memory."""

    def test_thread_pins_host_tensors(self) -> None:
        """Items come out of BackgroundLoader(pin_memory=True) pinned, from unpinned input."""
        source = host_batches(4, pinned=False)
        assert not any(t.is_pinned() for t in source)
        assert all(t.is_pinned() for t in BackgroundLoader(source, pin_memory=True))

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_stream_stable_and_memory_flat(self, lifetime: Any) -> None:
        """Through the pinning thread: no unpinned warning, one stream, reserved memory flat."""
        loader = CudaPrefetcher(
            BackgroundLoader(host_batches(6, 1 << 18, pinned=False), pin_memory=True),
            lifetime=lifetime,
        )
        consumer = torch.cuda.current_stream()
        streams, reserved = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an unpinned batch would warn here
            for _ in range(40):
                values = [batch[0].item() for batch in loader]
                assert values == expected(6)
                streams.append(loader.stream)
                torch.cuda.synchronize()
                reserved.append(torch.cuda.memory_reserved())
        print(f"{lifetime}: reserved bytes, epochs 2 / 40: {reserved[1]} / {reserved[-1]}")
        assert all(s is streams[0] for s in streams) and streams[0] != consumer
        assert torch.cuda.current_stream() == consumer
        assert reserved[-1] == reserved[1]


def uint8_images(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pinned uint8 image batches with labels."""
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(
                0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=generator
            ).pin_memory(),
            torch.arange(8).pin_memory(),
        )
        for _ in range(n)
    ]


class TestNormalizeOnGpu:
    """Normalize on the side stream matches the CPU computation."""

    MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    @pytest.mark.parametrize("channels_last", [False, True])
    def test_matches_cpu_reference(self, channels_last: bool) -> None:
        """Each normalised batch equals ((x / 255) - mean) / std computed in float64 on the CPU."""
        batches = uint8_images(4)
        normalize = Normalize(self.MEAN, self.STD, channels_last=channels_last)
        mean = torch.tensor(self.MEAN, dtype=torch.float64).view(-1, 1, 1)
        std = torch.tensor(self.STD, dtype=torch.float64).view(-1, 1, 1)
        for (x, labels), (y, got) in zip(
            batches, CudaPrefetcher(batches, transform=normalize), strict=True
        ):
            reference = (x.double() / 255 - mean) / std
            assert y.is_cuda and y.dtype == torch.float32
            assert y.is_contiguous(memory_format=torch.channels_last) == channels_last
            assert torch.allclose(y.cpu().double(), reference, atol=1e-5)
            assert torch.equal(got.cpu(), labels)

    def test_first_call_does_not_synchronize(self) -> None:
        """Under sync debug mode 'error', a first epoch with a fresh Normalize does not sync."""
        skip_unless_sync_debug_raises()
        loader = CudaPrefetcher(uint8_images(3), transform=Normalize(self.MEAN, self.STD))
        with sync_debug_error():
            outputs = [images for images, _ in loader]
        assert len(outputs) == 3 and all(o.dtype == torch.float32 for o in outputs)

    def test_control_a_synchronizing_transform_raises(self) -> None:
        """Control: the same loop, with a transform that reads a value back, raises there."""
        skip_unless_sync_debug_raises()
        normalize = Normalize(self.MEAN, self.STD)

        def reads_back(batch: Any) -> Any:
            batch[0].sum().item()  # waits for the GPU: a synchronizing call on the side stream
            return normalize(batch)

        loader = CudaPrefetcher(uint8_images(3), transform=reads_back)
        with sync_debug_error(), pytest.raises(RuntimeError, match="synchroniz"):
            [images for images, _ in loader]


@contextlib.contextmanager
def sync_debug_error() -> Iterator[None]:
    """Make every synchronizing CUDA call torch checks raise (process-wide), then restore it."""
    torch.cuda.synchronize()  # not checked by the mode: only reads back and waits are
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def skip_unless_sync_debug_raises() -> None:
    """Skip, saying why, unless sync debug mode 'error' raises on ``.item()`` in this build.

    Without that, a loop that runs cleanly under the mode shows nothing.
    torch checks the calls that copy to the host and wait (``.item()``,
    ``.cpu()``, ``nonzero``), not ``torch.cuda.synchronize()``.
    """
    probe = torch.ones(1, device="cuda")
    with sync_debug_error():
        try:
            probe.item()
        except RuntimeError as error:
            if "synchroniz" in str(error):
                return
            pytest.skip(f"sync debug mode 'error': .item() raised another error: {error}")
    pytest.skip(
        f"torch {torch.__version__}: .item() under set_sync_debug_mode('error') did not "
        "raise, so a loop running under that mode proves nothing"
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
class TestSecondGpu:
    """device='cuda:1' from a caller on GPU 0: batches, stream and pinning on GPU 1."""

    def test_copies_to_cuda1_without_moving_the_caller(self) -> None:
        """Batches land on cuda:1 with the right values; the caller stays on GPU 0."""
        torch.cuda.set_device(0)
        loader = CudaPrefetcher(
            BackgroundLoader(host_batches(5, pinned=False), pin_memory=True), device="cuda:1"
        )
        got = [(batch.device, batch[0].item()) for batch in loader]
        assert got == [(torch.device("cuda", 1), value) for value in expected(5)]
        assert loader.stream.device == torch.device("cuda", 1)
        assert torch.cuda.current_device() == 0
