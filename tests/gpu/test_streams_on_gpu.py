"""On a real GPU: each ordering and lifetime protection matters.

Every guarded test has a control with its protection switched off that must
read a wrong value (the sabotage pattern of the CPU protocol tests), so a
pass means the protection, not luck, gave the right answer. Batches hold
``BASE + k`` and the pools are poisoned first (see ``gpu_helpers``): fresh
zeroed memory cannot pass for batch 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from prefetch import CudaPrefetcher
from prefetch._device.copier import StreamCopier

from .gpu_helpers import (
    BASE,
    ELEMENTS,
    SLOW_CYCLES,
    Packed,
    Sample,
    disable,
    expected,
    host_batches,
    poison,
    poisoned_iter,
    slow_copy,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def read_at_once(prefetcher: CudaPrefetcher[Any]) -> list[float]:
    """Read each batch on the consumer stream right after the hand-off."""
    results = [batch.mean() for batch in poisoned_iter(prefetcher)]
    torch.cuda.synchronize()
    return [r.item() for r in results]


class TestConsumerWait:
    """The consumer stream waits for each batch's copy and transform."""

    def test_immediate_read_is_correct(self) -> None:
        """Reading right after the hand-off sees the finished batch."""
        assert read_at_once(CudaPrefetcher(host_batches(8), transform=slow_copy)) == expected(8)

    def test_control_without_wait_reads_early(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: without the wait, some read sees an unfinished batch."""
        disable(monkeypatch, "_consumer_wait")
        assert read_at_once(CudaPrefetcher(host_batches(8), transform=slow_copy)) != expected(8)

    def test_consumer_on_its_own_stream(self) -> None:
        """A loop on a non-default stream waits on that stream, not on the default one."""
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            got = read_at_once(CudaPrefetcher(host_batches(8), transform=slow_copy))
        assert got == expected(8)

    def test_control_waiting_on_the_default_stream(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: a wait queued on the default stream does not protect the user's stream."""

        def wrong_stream(self: Any, consumer: Any, event: Any) -> None:
            torch.cuda.default_stream().wait_event(event)

        monkeypatch.setattr(StreamCopier, "_consumer_wait", wrong_stream)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            got = read_at_once(CudaPrefetcher(host_batches(8), transform=slow_copy))
        assert got != expected(8)


def nested_batches(n: int) -> list[dict[str, Any]]:
    """Batches with ``BASE + k`` in a list, a tuple, a dataclass and a ``.to()`` object."""
    return [
        {
            "a": [torch.full((ELEMENTS,), BASE + k).pin_memory()],
            "b": (Sample(torch.full((ELEMENTS,), BASE + k).pin_memory()),),
            "p": Packed(torch.full((ELEMENTS,), BASE + k).pin_memory()),
        }
        for k in range(n)
    ]


def leaves(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch from :func:`nested_batches` (or a plain tensor)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    return [batch["a"][0], batch["b"][0].features, batch["p"].tensor]


def read_far_behind(prefetcher: CudaPrefetcher[Any]) -> list[list[float]]:
    """Queue slow work before each read and drop each batch at once (its memory is freed)."""
    results = []
    for batch in poisoned_iter(prefetcher):
        torch.cuda._sleep(SLOW_CYCLES)
        results.append([t.mean() for t in leaves(batch)])
        del batch
    torch.cuda.synchronize()
    return [[r.item() for r in row] for row in results]


def correct(rows: list[list[float]]) -> bool:
    """Whether every leaf of batch ``k`` read ``BASE + k``."""
    return all(all(v == BASE + k for v in row) for k, row in enumerate(rows))


class TestLifetime:
    """Memory the consumer still reads is never recycled for a later copy."""

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_far_behind_consumer_reads_its_own_batch(self, lifetime: Any) -> None:
        """With either lifetime, every read sees its own batch."""
        loader = CudaPrefetcher(host_batches(12), lifetime=lifetime, depth=2)
        assert correct(read_far_behind(loader))

    @pytest.mark.parametrize(
        ("lifetime", "guard"),
        [("fence", "_fence"), ("record_stream", "_record_leaves")],
    )
    def test_control_without_protection(
        self, monkeypatch: pytest.MonkeyPatch, lifetime: Any, guard: str
    ) -> None:
        """Control: without the fence (or record_stream), a read sees recycled memory."""
        disable(monkeypatch, guard)
        loader = CudaPrefetcher(host_batches(12), lifetime=lifetime, depth=2)
        assert not correct(read_far_behind(loader))

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_nested_dataclass_and_to_objects(self, lifetime: Any) -> None:
        """Leaves in lists, tuples, dataclasses and ``.to()`` objects are all protected."""
        assert correct(read_far_behind(CudaPrefetcher(nested_batches(12), lifetime=lifetime)))

    def test_control_to_objects_unprotected(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: record_stream alone (no automatic fence) lets ``.to()`` memory be recycled."""
        disable(monkeypatch, "_fence")
        rows = read_far_behind(CudaPrefetcher(nested_batches(12), lifetime="record_stream"))
        assert all(row[0] == row[1] == BASE + k for k, row in enumerate(rows))  # recorded leaves
        assert not correct(rows)  # the .to() object's tensor was recycled


Source = Callable[[int], Iterator[dict[str, torch.Tensor]]]


def late_device_inputs(n: int) -> Iterator[dict[str, torch.Tensor]]:
    """Yield inputs already on the GPU, written by a slow kernel on the consumer stream."""
    for k in range(n):
        torch.cuda._sleep(SLOW_CYCLES)
        yield {"x": torch.full((ELEMENTS,), BASE + k, device="cuda")}


def device_inputs(n: int) -> Iterator[dict[str, torch.Tensor]]:
    """Yield inputs already on the GPU, each freed soon after the prefetcher took it."""
    for k in range(n):
        yield {"x": torch.full((ELEMENTS,), BASE + k, device="cuda")}


def quick_read(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A transform that reads the input at once (on the side stream)."""
    return batch["x"] * 1.0


def slow_read(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A transform that spins, then reads the input (on the side stream)."""
    torch.cuda._sleep(SLOW_CYCLES)
    return batch["x"] * 1.0


Transform = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def through_transform(
    source: Source, transform: Transform, lifetime: Any, depth: int
) -> list[float]:
    """Prefetch ``source(10)`` through ``transform``; return each batch's mean."""
    poison(torch.cuda.current_stream())
    loader = CudaPrefetcher(source(10), lifetime=lifetime, depth=depth, transform=transform)
    results = [batch.mean() for batch in loader]
    torch.cuda.synchronize()
    return [r.item() for r in results]


class TestDeviceResidentInputs:
    """A transform reads inputs already on the GPU after they are written, before reuse."""

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    @pytest.mark.parametrize(
        ("source", "transform"),
        [(late_device_inputs, quick_read), (device_inputs, slow_read)],
        ids=["written-late", "freed-early"],
    )
    def test_transform_reads_finished_live_inputs(
        self, lifetime: Any, source: Source, transform: Transform
    ) -> None:
        """Written by a slow kernel, or freed at once: the transform reads the right values."""
        assert through_transform(source, transform, lifetime, depth=3) == expected(10)

    def test_control_without_ordering(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: without the fence the transform reads an input before it is written."""
        disable(monkeypatch, "_fence")
        got = through_transform(late_device_inputs, quick_read, "record_stream", depth=1)
        assert got != expected(10)

    def test_control_without_keeping_inputs(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: not recorded on the side stream, an input is reused before it is read."""
        disable(monkeypatch, "_keep_inputs_alive")
        assert through_transform(device_inputs, slow_read, "fence", depth=3) != expected(10)
