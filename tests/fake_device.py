"""A recording stand-in for a CUDA device, so the stream protocol can be checked on a CPU.

"Device memory" is every tensor :class:`FakeOps` made by a copy, plus the
tensors a test marks as already on the device (:func:`on_device`):
copying those returns them unchanged, as ``Tensor.to`` does. :class:`Packed`
is a batch object with ``.to()`` whose tensors the structure walker cannot
see; the fake copies them like a real ``.to()`` would, so the checks below
know about its device memory even though the prefetcher does not.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from prefetch._device import prefetcher as cuda_prefetcher
from prefetch._device import streams
from prefetch._shared.structure import iter_leaves, iter_tensors, map_leaves

Log = list[tuple[Any, ...]]


class FakeStream:
    """A stream that logs what is queued on it."""

    def __init__(self, log: Log, name: str) -> None:
        self.log = log
        self.name = name

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait_event", self.name, event.ident))

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait_stream", self.name, other.name))


class FakeEvent:
    """An event that logs where it is recorded."""

    def __init__(self, log: Log, ident: int) -> None:
        self.log = log
        self.ident = ident

    def record(self, stream: FakeStream) -> None:
        self.log.append(("record_event", self.ident, stream.name))

    def synchronize(self) -> None:
        """The CPU waits for the event."""
        self.log.append(("synchronize", self.ident))


RESIDENT = "_fake_device_resident"


def on_device(tensor: torch.Tensor) -> torch.Tensor:
    """Mark ``tensor`` as living on the fake device already (a device-resident input)."""
    setattr(tensor, RESIDENT, True)
    return tensor


class Packed:
    """An object with ``.to()`` holding tensors (like a custom batch class): opaque to walkers."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self._tensors = tensors

    def to(self, device: Any, non_blocking: bool = False) -> Packed:
        return Packed(*(t.to(device, non_blocking=non_blocking) for t in self._tensors))

    def fake_tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors inside (only the fake device and the checks look)."""
        return self._tensors


def memory(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor of ``batch``, those inside :class:`Packed` leaves included."""
    yield from iter_tensors(batch)
    for leaf in iter_leaves(batch):
        if isinstance(leaf, Packed):
            yield from leaf.fake_tensors()


class FakeOps:
    """Implements prefetch._device.ops.DeviceOps over CPU tensors, logging every call."""

    has_streams = True
    non_blocking = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.log: Log = []
        self.consumer = FakeStream(self.log, "consumer")  # every thread's default stream
        self._local = threading.local()
        self.streams: list[FakeStream] = []
        self.device_tensors: dict[int, torch.Tensor] = {}
        self._events = itertools.count()

    @property
    def current(self) -> FakeStream:
        """The calling thread's current stream (a new thread starts on ``consumer``)."""
        return getattr(self._local, "stream", self.consumer)  # type: ignore[no-any-return]

    @current.setter
    def current(self, stream: FakeStream) -> None:
        self._local.stream = stream

    def new_stream(self) -> FakeStream:
        stream = FakeStream(self.log, f"side{len(self.streams)}")
        self.streams.append(stream)
        return stream

    def current_stream(self) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream) -> Iterator[FakeStream]:
        previous, self.current = self.current, stream
        try:
            yield stream
        finally:
            self.current = previous

    def new_event(self) -> FakeEvent:
        return FakeEvent(self.log, next(self._events))

    def record(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record_stream", id(tensor), stream.name))

    def copy(self, batch: Any) -> Any:
        def move(tensor: torch.Tensor) -> torch.Tensor:
            if self.is_on_device(tensor):
                return tensor  # already on the device: Tensor.to returns it as it is
            copied = tensor.clone()
            self.device_tensors[id(copied)] = copied
            self.log.append(("copy", self.current.name, id(copied)))
            return copied

        def leaf(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return move(value)
            if isinstance(value, Packed):
                return Packed(*(move(t) for t in value.fake_tensors()))
            return value

        return map_leaves(leaf, batch)

    def is_on_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is device memory: a copy this fake made, or marked resident."""
        return self.device_tensors.get(id(tensor)) is tensor or hasattr(tensor, RESIDENT)

    def tensors_on_device(self, batch: Any) -> Iterator[torch.Tensor]:
        for tensor in iter_tensors(batch):
            if self.is_on_device(tensor):
                yield tensor


def handed_over(log: Log, batch: Any) -> None:
    """Mark in the log that the consumer received ``batch``."""
    log.append(("handoff", tuple(id(t) for t in memory(batch))))


def copy_groups(log: Log) -> list[tuple[int, list[int], int]]:
    """Return (log index of first copy, tensor ids, event id) for each batch, in order."""
    groups: list[tuple[int, list[int], int]] = []
    start, ids = -1, []
    for index, entry in enumerate(log):
        if entry[0] == "copy":
            if not ids:
                start = index
            ids.append(entry[2])
        elif entry[0] == "record_event" and entry[2] != "consumer":
            groups.append((start, ids, entry[1]))
            ids = []
    return groups


def check_copies_on_side_stream(log: Log, side: str) -> None:
    """Every copy ran while the side stream was current."""
    streams = {entry[1] for entry in log if entry[0] == "copy"}
    assert streams == {side}, f"copies ran on {streams}, expected only {side}"
    events = {entry[2] for entry in log if entry[0] == "record_event"} - {"consumer"}
    assert events == {side}, f"events recorded on {events}"


def check_consumer_waits(log: Log, side: str) -> None:
    """Before each hand-off the consumer waited for that batch's event, never the whole stream."""
    groups = {tuple(ids): event for _, ids, event in copy_groups(log)}
    last_handoff = -1
    for index, entry in enumerate(log):
        if entry[0] == "wait_stream":
            assert entry[1] != "consumer", "the consumer waited for the whole side stream"
        if entry[0] != "handoff":
            continue
        event = groups[entry[1]]
        waits = [e for e in log[last_handoff + 1 : index] if e[0] == "wait_event"]
        assert ("wait_event", "consumer", event) in waits, f"hand-off {entry} without its wait"
        last_handoff = index


def check_fence_before_copies(log: Log, side: str) -> None:
    """Each batch's first copy is preceded by the side stream waiting for the consumer."""
    previous_end = -1
    for start, _ids, event in copy_groups(log):
        window = log[previous_end + 1 : start]
        assert ("wait_stream", side, "consumer") in window, f"copy at {start} without a fence"
        previous_end = log.index(("record_event", event, side))


def check_leaves_recorded(log: Log) -> None:
    """Every tensor leaf of every handed-over batch was recorded on the consumer stream."""
    recorded: set[int] = set()
    for entry in log:
        if entry[0] == "record_stream" and entry[2] == "consumer":
            recorded.add(entry[1])
        if entry[0] == "handoff":
            missing = [ident for ident in entry[1] if ident not in recorded]
            assert not missing, f"{len(missing)} leaves handed over without record_stream"


def check_memory_protected(log: Log) -> None:
    """The device memory of every handed-over batch is safe from early reuse.

    Each tensor (those inside ``.to()`` objects too) was recorded on the
    consumer stream before its hand-off, or every batch copied after that
    hand-off was fenced (the side stream waited for the consumer first).
    """
    recorded = {e[1] for e in log if e[0] == "record_stream" and e[2] == "consumer"}
    groups = copy_groups(log)
    ends = [next(i for i, e in enumerate(log) if e[:2] == ("record_event", g[2])) for g in groups]
    for index, entry in enumerate(log):
        if entry[0] != "handoff" or all(ident in recorded for ident in entry[1]):
            continue
        for position, (start, _ids, _event) in enumerate(groups):
            if start < index:
                continue
            previous_end = ends[position - 1] if position else -1
            window = log[max(previous_end, index) + 1 : start]
            assert any(e[0] == "wait_stream" and e[2] == "consumer" for e in window), (
                f"memory handed over at {index} neither recorded nor fenced before copy {start}"
            )


def check_resident_inputs(log: Log, side: str) -> None:
    """Inputs already on the device, read by the transform, are ordered and kept alive.

    Before the transform reads one, the side stream waited for the consumer
    stream (which wrote it) since the previous batch; afterwards the input
    was recorded on the side stream, so its memory is not reused before the
    read. Transforms log ``("transform", stream, resident ids)``.
    """
    reads = [(i, e) for i, e in enumerate(log) if e[0] == "transform" and e[2]]
    assert reads, "no transform read a device-resident input"
    for index, entry in reads:
        ends = [
            i for i, e in enumerate(log[:index]) if e[0] == "record_event" and e[2] != "consumer"
        ]
        window = log[(ends[-1] if ends else -1) + 1 : index]
        assert ("wait_stream", side, "consumer") in window, f"transform at {index} not ordered"
        for ident in entry[2]:
            assert ("record_stream", ident, side) in log[index:], f"input {ident} not kept alive"


def install(monkeypatch: pytest.MonkeyPatch) -> list[FakeOps]:
    """Make every CudaPrefetcher see a fake 'cuda:0'; return the ops objects it creates.

    Side streams come from a fresh registry, so no stream of another test is recycled.
    """
    created: list[FakeOps] = []
    monkeypatch.setattr(streams, "REGISTRY", streams.StreamRegistry())

    def make(device: torch.device) -> FakeOps:
        ops = FakeOps(device)
        created.append(ops)
        return ops

    def resolve(device: object, owner: str = "") -> torch.device:
        if isinstance(device, str) and device.startswith("cuda:"):
            return torch.device(device)  # an explicit index is kept, e.g. "cuda:1"
        return torch.device("cuda", 0)

    monkeypatch.setattr(cuda_prefetcher.device_ops, "resolve_device", resolve)
    monkeypatch.setattr(cuda_prefetcher.device_ops, "make_device_ops", make)
    return created
