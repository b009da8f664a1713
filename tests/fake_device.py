"""A recording stand-in for a CUDA device, so the stream protocol can be checked on a CPU."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from prefetch import _cuda_prefetcher as cuda_prefetcher
from prefetch._structure import iter_tensors, map_tensors

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


class FakeOps:
    """Implements prefetch._device_ops.DeviceOps over CPU tensors, logging every call."""

    has_streams = True
    non_blocking = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.log: Log = []
        self.consumer = FakeStream(self.log, "consumer")
        self.current = self.consumer
        self.streams: list[FakeStream] = []
        self.device_tensors: dict[int, torch.Tensor] = {}
        self._events = itertools.count()

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
            copied = tensor.clone()
            self.device_tensors[id(copied)] = copied
            self.log.append(("copy", self.current.name, id(copied)))
            return copied

        return map_tensors(move, batch)

    def tensors_on_device(self, batch: Any) -> Iterator[torch.Tensor]:
        yield from iter_tensors(batch)  # after the copy every leaf is "on the device"


def handed_over(log: Log, batch: Any) -> None:
    """Mark in the log that the consumer received ``batch``."""
    log.append(("handoff", tuple(id(t) for t in iter_tensors(batch))))


def copy_groups(log: Log) -> list[tuple[int, list[int], int]]:
    """Return (log index of first copy, tensor ids, event id) for each batch, in order."""
    groups: list[tuple[int, list[int], int]] = []
    start, ids = -1, []
    for index, entry in enumerate(log):
        if entry[0] == "copy":
            if not ids:
                start = index
            ids.append(entry[2])
        elif entry[0] == "record_event":
            groups.append((start, ids, entry[1]))
            ids = []
    return groups


def check_copies_on_side_stream(log: Log, side: str) -> None:
    """Every copy ran while the side stream was current."""
    streams = {entry[1] for entry in log if entry[0] == "copy"}
    assert streams == {side}, f"copies ran on {streams}, expected only {side}"
    events = {entry[2] for entry in log if entry[0] == "record_event"}
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


def install(monkeypatch: pytest.MonkeyPatch) -> list[FakeOps]:
    """Make every CudaPrefetcher see a fake 'cuda:0'; return the ops objects it creates."""
    created: list[FakeOps] = []

    def make(device: torch.device) -> FakeOps:
        ops = FakeOps(device)
        created.append(ops)
        return ops

    def resolve(device: object, owner: str = "") -> torch.device:
        return torch.device("cuda", 0)

    monkeypatch.setattr(cuda_prefetcher.device_ops, "resolve_device", resolve)
    monkeypatch.setattr(cuda_prefetcher.device_ops, "make_device_ops", make)
    return created
