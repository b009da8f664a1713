"""Side streams of our own, the record_stream run-ahead bound, and inputs a failed transform read.

Checked on a CPU with the recording fake device (``fake_device``); each
check also runs against the code with its protection switched off, to show
it would catch that bug. ``tests/gpu/test_defects_on_gpu.py`` and
``test_inputs_on_gpu.py`` check the same protections on a real GPU.
"""

from __future__ import annotations

import gc
import shutil
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from prefetch import CudaPrefetcher
from prefetch._device import ops as device_ops
from prefetch._device import prefetcher as cuda_prefetcher
from prefetch._device import streams
from prefetch._device.copier import KeepAlive, StreamCopier

from . import fake_device
from .fake_device import FakeOps, FakeStream, Log, Packed

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch) -> list[FakeOps]:
    return fake_device.install(monkeypatch)


def tensors(n: int) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.full((2,), float(k))} for k in range(n)]


def drain(loader: CudaPrefetcher[Any], log: Log) -> list[Any]:
    received = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unpinned CPU tensors
        for batch in loader:
            fake_device.handed_over(log, batch)
            received.append(batch)
    return received


class TestOwnStream:
    """DeviceOps makes CUDA side streams with the driver, outside torch's pool."""

    def test_cuda_stream_comes_from_the_driver(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """new_stream wraps a driver-made handle in ExternalStream, on the prefetcher's device."""
        made: list[tuple[int, Any]] = []
        monkeypatch.setattr(streams, "create_cuda_stream", lambda index: 0x5000 + index)
        monkeypatch.setattr(
            torch.cuda, "ExternalStream", lambda handle, device: made.append((handle, device))
        )
        monkeypatch.setattr(torch.version, "hip", None)
        device_ops.DeviceOps(torch.device("cuda", 1)).new_stream()
        assert made == [(0x5001, torch.device("cuda", 1))]

    def test_falls_back_to_a_pool_stream_with_a_warning(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without the driver library: a pool stream, and a warning saying it may be shared."""

        def no_driver(index: int) -> int:
            raise streams.DriverError("cannot load the CUDA driver library")

        pool: list[Any] = []
        monkeypatch.setattr(streams, "create_cuda_stream", no_driver)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device: pool.append(device))
        monkeypatch.setattr(device_ops, "_warned_pool_stream", False)
        with pytest.warns(RuntimeWarning, match="pool streams, which other code may be handed"):
            device_ops.DeviceOps(torch.device("cuda", 0)).new_stream()
        assert pool == [torch.device("cuda", 0)]

    @pytest.mark.skipif(
        shutil.which("nvidia-smi") is not None, reason="a machine with the CUDA driver"
    )
    def test_without_a_driver_the_error_says_so(self) -> None:
        """On a machine without the driver library the error names it."""
        with pytest.raises(streams.DriverError, match="CUDA driver library"):
            streams.create_cuda_stream(0)


def shared_ops(monkeypatch: pytest.MonkeyPatch) -> FakeOps:
    """One fake device for every prefetcher of the test (so one log shows them all)."""
    fake_device.install(monkeypatch)
    ops = FakeOps(torch.device("cuda", 0))
    monkeypatch.setattr(cuda_prefetcher.device_ops, "make_device_ops", lambda device: ops)
    return ops


def fences_before_copies(log: Log, side: str) -> list[set[str]]:
    """For each batch, the streams ``side`` waited for since the previous batch's event."""
    result, waited = [], set()
    for entry in log:
        if entry[:2] == ("wait_stream", side):
            waited.add(entry[2])
        elif entry[0] == "record_event" and entry[2] == side:
            result.append(waited)
            waited = set()
    return result


def collected_owner(ops: FakeOps) -> Any:
    """Run a fencing prefetcher's epoch on the current stream, let it go; return its stream."""
    first = CudaPrefetcher(tensors(2))
    drain(first, ops.log)
    stream = first.stream
    del first
    gc.collect()
    return stream


def two_owners(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeOps, Any, CudaPrefetcher[Any]]:
    """A prefetcher read on "consumer" and collected, then one whose loop runs on "user".

    Returns the device (its log holds the second owner's epoch only), the
    first owner's stream and the second prefetcher.
    """
    ops = shared_ops(monkeypatch)
    stream = collected_owner(ops)
    ops.current = FakeStream(ops.log, "user")
    second = CudaPrefetcher(tensors(3))
    ops.log.clear()
    drain(second, ops.log)
    return ops, stream, second


class TestRecycling:
    """A collected prefetcher's stream goes to the next one, which fences its readers too."""

    def test_live_prefetchers_never_share(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Two prefetchers alive at once have two streams."""
        ops = shared_ops(monkeypatch)
        first, second = CudaPrefetcher(tensors(2)), CudaPrefetcher(tensors(2))
        drain(first, ops.log), drain(second, ops.log)
        assert first.stream is not second.stream and len(ops.streams) == 2

    def test_next_owner_fences_the_previous_readers(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Read on "consumer" by the first owner, the stream also waits for it under the second."""
        ops, first_stream, second = two_owners(monkeypatch)
        assert second.stream is first_stream and len(ops.streams) == 1
        assert fences_before_copies(ops.log, "side0") == [{"consumer", "user"}] * 3

    def test_control_fencing_only_the_current_stream(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: a fence of the current stream alone leaves the first owner's reads unordered."""
        monkeypatch.setattr(streams.SideStream, "fence_targets", lambda self, consumer: [consumer])
        ops, _stream, _second = two_owners(monkeypatch)
        assert fences_before_copies(ops.log, "side0") == [{"user"}] * 3

    def test_record_stream_never_takes_a_fenced_stream(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """record_stream does not fence, so it gets a new stream; a fencing owner reuses."""
        ops = shared_ops(monkeypatch)
        fenced = collected_owner(ops)
        recorder = CudaPrefetcher(tensors(2), lifetime="record_stream")
        drain(recorder, ops.log)
        fencer = CudaPrefetcher(tensors(2))
        drain(fencer, ops.log)
        assert recorder.stream is not fenced and fencer.stream is fenced


def outstanding_at_copies(log: Log) -> list[int]:
    """At each batch's first copy: consumer-side events recorded and not yet waited for."""
    recorded: list[int] = []
    waited: set[int] = set()
    counts = []
    previous = None
    for entry in log:
        if entry[0] == "record_event" and entry[2] == "consumer":
            recorded.append(entry[1])
        elif entry[0] == "synchronize":
            assert entry[1] == next(e for e in recorded if e not in waited), "not the oldest"
            waited.add(entry[1])
        elif entry[0] == "copy" and previous != "copy":
            counts.append(len([e for e in recorded if e not in waited]))
        previous = entry[0]
    return counts


class TestRunAheadBound:
    """record_stream keeps the CPU at most depth + 1 hand-overs ahead of the consumer stream."""

    @pytest.mark.parametrize("depth", [1, 3])
    def test_cpu_waits_for_the_oldest(self, fake_ops: list[FakeOps], depth: int) -> None:
        """Before each copy at most depth + 1 hand-overs are unwaited; the oldest goes first."""
        loader = CudaPrefetcher(tensors(12), lifetime="record_stream", depth=depth)
        assert len(drain(loader, fake_ops[0].log)) == 12
        counts = outstanding_at_copies(fake_ops[0].log)
        assert max(counts) == depth + 1 and len(counts) == 12

    def test_fence_lifetime_never_holds_the_cpu(self, fake_ops: list[FakeOps]) -> None:
        """Fencing bounds memory on the GPU: no CPU wait, no consumer events."""
        drain(CudaPrefetcher(tensors(12), depth=2), fake_ops[0].log)
        assert not any(e[0] == "synchronize" for e in fake_ops[0].log)

    def test_control_without_the_bound(
        self, fake_ops: list[FakeOps], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: without it the CPU runs as far ahead as the epoch."""
        monkeypatch.setattr(StreamCopier, "_bound_run_ahead", lambda self: None)
        drain(CudaPrefetcher(tensors(12), lifetime="record_stream"), fake_ops[0].log)
        assert max(outstanding_at_copies(fake_ops[0].log)) == 10  # copy 11, after 10 hand-overs


class Boom(Exception):
    """A transform's error."""


def resident_source(n: int) -> Iterator[dict[str, Any]]:
    for k in range(n):
        yield {"x": torch.full((2,), float(k)), "mask": fake_device.on_device(torch.ones(2))}


def raising_read(get_ops: Any) -> Any:
    """A transform that reads every input on the side stream, then raises."""

    def transform(batch: dict[str, Any]) -> Any:
        ops = get_ops()
        ops.log.append(("transform", ops.current.name, ()))
        raise Boom

    return transform


def errors_of(loader: CudaPrefetcher[Any]) -> int:
    count = 0
    iterator = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        while True:
            try:
                next(iterator)
            except Boom:
                count += 1
            except StopIteration:
                return count


class TestFailedTransform:
    """A transform that raised may have queued reads of its inputs: they stay protected."""

    def test_resident_inputs_recorded_on_the_side_stream(self, fake_ops: list[FakeOps]) -> None:
        """Each device-resident input is recorded on the side stream though the transform raised."""
        source = list(resident_source(3))
        loader = CudaPrefetcher(iter(source), transform=raising_read(lambda: fake_ops[0]))
        assert errors_of(loader) == 3
        log = fake_ops[0].log
        for batch in source:
            assert ("record_stream", id(batch["mask"]), "side0") in log

    def test_control_without_keeping_inputs(
        self, fake_ops: list[FakeOps], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: the check sees the record missing."""
        monkeypatch.setattr(StreamCopier, "_keep_inputs_alive", lambda self, ops, stream, r: None)
        source = list(resident_source(3))
        loader = CudaPrefetcher(iter(source), transform=raising_read(lambda: fake_ops[0]))
        assert errors_of(loader) == 3
        assert not any(entry[0] == "record_stream" for entry in fake_ops[0].log)

    def test_opaque_inputs_ordered_before_release(self, fake_ops: list[FakeOps]) -> None:
        """The consumer stream waits for what the failed transform queued on the side stream."""
        batches = [{"p": Packed(torch.full((2,), float(k)))} for k in range(3)]
        loader = CudaPrefetcher(batches, transform=raising_read(lambda: fake_ops[0]))
        assert errors_of(loader) == 3
        assert waits_after_transforms(fake_ops[0].log) == [True] * 3

    def test_control_opaque_inputs_released_unordered(
        self, fake_ops: list[FakeOps], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: without the consumer's wait the check fails."""
        monkeypatch.setattr(KeepAlive, "order_consumer", lambda self: None)
        batches = [{"p": Packed(torch.full((2,), float(k)))} for k in range(3)]
        loader = CudaPrefetcher(batches, transform=raising_read(lambda: fake_ops[0]))
        assert errors_of(loader) == 3
        assert waits_after_transforms(fake_ops[0].log) == [False] * 3


def waits_after_transforms(log: Log) -> list[bool]:
    """For each transform: did the consumer then wait for an event recorded on the side stream?"""
    result = []
    for index, entry in enumerate(log):
        if entry[0] != "transform":
            continue
        after = log[index + 1 :]
        events = [e[1] for e in after if e[0] == "record_event" and e[2] == "side0"]
        result.append(bool(events) and ("wait_event", "consumer", events[0]) in after)
    return result


class TestDroppedInFlight:
    """Closing an epoch drops batches in flight; their opaque inputs go only after a wait."""

    def test_close_orders_the_consumer_after_each_dropped_batch(
        self, fake_ops: list[FakeOps]
    ) -> None:
        """After close(), the consumer waited for the event of every batch still in flight."""
        batches = [{"p": Packed(torch.full((2,), float(k)))} for k in range(5)]
        loader = CudaPrefetcher(batches, depth=3, transform=lambda batch: batch)
        iterator = iter(loader)
        next(iterator)
        log = fake_ops[0].log
        closed_at = len(log)
        iterator.close()
        gc.collect()
        in_flight = [event for _start, _ids, event in fake_device.copy_groups(log)[1:]]
        assert len(in_flight) == 3
        assert [("wait_event", "consumer", e) in log[closed_at:] for e in in_flight] == [True] * 3

    def test_control_without_the_wait(
        self, fake_ops: list[FakeOps], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: without KeepAlive's wait the dropped batches' inputs go unordered."""
        monkeypatch.setattr(KeepAlive, "order_consumer", lambda self: None)
        batches = [{"p": Packed(torch.full((2,), float(k)))} for k in range(5)]
        iterator = iter(CudaPrefetcher(batches, depth=3, transform=lambda batch: batch))
        next(iterator)
        closed_at = len(fake_ops[0].log)
        iterator.close()
        gc.collect()
        assert not any(e[0] == "wait_event" for e in fake_ops[0].log[closed_at:])
