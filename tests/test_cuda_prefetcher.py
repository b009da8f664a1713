"""CudaPrefetcher on the CPU path (what CI runs): protocol, pass-through and errors."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections import OrderedDict, namedtuple
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._device import ops as device_ops
from prefetch._device import prefetcher as cuda_prefetcher
from prefetch._device.ops import DeviceOps, resolve_device

from .processes import prefetch_threads, wait_until
from .sources import Stateful

pytestmark = pytest.mark.timeout(30)

Pair = namedtuple("Pair", "image label")


@dataclasses.dataclass(frozen=True)
class Sample:
    image: torch.Tensor
    name: str


class Movable:
    """A leaf with its own .to(), like a HuggingFace BatchEncoding."""

    def __init__(self) -> None:
        self.moved_to: list[Any] = []

    def to(self, device: Any, non_blocking: bool = False) -> Movable:
        self.moved_to.append((device, non_blocking))
        return self


class OldMovable:
    """A .to() that takes no non_blocking argument."""

    def __init__(self) -> None:
        self.moved_to: list[Any] = []

    def to(self, device: Any) -> OldMovable:
        self.moved_to.append(device)
        return self


class Boom(Exception):
    """A source error."""


@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the CPU path")
class TestCpuPath:
    """Without an accelerator the same code runs, touching no stream, event or pinning."""

    def test_device_none_is_cpu(self) -> None:
        """device=None resolves to the CPU on a machine without an accelerator."""
        assert CudaPrefetcher([]).device == torch.device("cpu")

    def test_batches_pass_through(self) -> None:
        """Batches arrive as the same objects, in order."""
        batches = [{"x": torch.ones(2)}, (torch.zeros(1), 3), None]
        assert [b for b in CudaPrefetcher(batches)] == batches
        assert all(a is b for a, b in zip(CudaPrefetcher(batches), batches, strict=True))

    def test_no_stream_event_record_or_pin(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The CPU path never creates device ops, streams, events, or pins."""

        def forbidden(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the CPU path touched the accelerator")

        monkeypatch.setattr(device_ops, "make_device_ops", forbidden)
        monkeypatch.setattr(torch.cuda, "Stream", forbidden)
        monkeypatch.setattr(torch.cuda, "Event", forbidden)
        monkeypatch.setattr(torch.cuda, "current_stream", forbidden)
        monkeypatch.setattr(torch.Tensor, "record_stream", forbidden)
        monkeypatch.setattr(torch.Tensor, "pin_memory", forbidden)
        for lifetime in ("fence", "record_stream"):
            prefetcher = CudaPrefetcher([{"x": torch.ones(2)}] * 3, lifetime=lifetime, depth=2)  # type: ignore[arg-type]
            assert len(list(prefetcher)) == 3
            assert prefetcher.stream is None

    def test_transform_applies(self) -> None:
        """The transform runs on each batch on the CPU path too."""
        out = list(CudaPrefetcher([torch.ones(1), torch.zeros(1)], transform=lambda b: b + 1))
        assert [t.item() for t in out] == [2.0, 1.0]

    def test_explicit_cuda_is_an_error(self) -> None:
        """Asking for CUDA on a machine without it is a clear RuntimeError."""
        with pytest.raises(RuntimeError, match=r"device='cuda'.*not available"):
            CudaPrefetcher([], device="cuda")
        with pytest.raises(RuntimeError, match="not available"):
            CudaPrefetcher([], device="cuda:3")
        with pytest.raises(RuntimeError, match="no accelerator"):
            CudaPrefetcher([], device=0)


class TestArguments:
    """Bad arguments are errors that name the argument and the value."""

    def test_bad_device_string(self) -> None:
        """An unparsable device string is a ValueError naming it."""
        with pytest.raises(ValueError, match=r"device=.*got 'gpu0'"):
            CudaPrefetcher([], device="gpu0")

    def test_device_without_a_module(self) -> None:
        """A device torch has no module for (meta) says what is expected."""
        with pytest.raises(ValueError, match=r"device='meta'\) expects an accelerator .*'cpu'"):
            CudaPrefetcher([], device="meta")

    def test_bad_device_type(self) -> None:
        """A device of the wrong type is a TypeError naming the type."""
        with pytest.raises(TypeError, match=r"got 1\.5 of type float"):
            CudaPrefetcher([], device=1.5)  # type: ignore[arg-type]

    def test_bad_depth(self) -> None:
        """depth follows BackgroundLoader's rules."""
        with pytest.raises(ValueError, match=r"CudaPrefetcher\(depth=...\).*got 0"):
            CudaPrefetcher([], depth=0)
        with pytest.raises(TypeError, match="depth"):
            CudaPrefetcher([], depth=1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="depth='auto' is a BackgroundLoader option"):
            CudaPrefetcher([], depth="auto")  # type: ignore[arg-type]

    def test_bad_lifetime(self) -> None:
        """lifetime must be 'fence' or 'record_stream'."""
        with pytest.raises(ValueError, match=r"lifetime=.*got 'forever'"):
            CudaPrefetcher([], device="cpu", lifetime="forever")  # type: ignore[arg-type]

    def test_bad_transform(self) -> None:
        """A non-callable transform is a TypeError."""
        with pytest.raises(TypeError, match="transform"):
            CudaPrefetcher([], device="cpu", transform=3)  # type: ignore[arg-type]

    def test_not_iterable(self) -> None:
        """A non-iterable loader is a TypeError at construction."""
        with pytest.raises(TypeError, match="CudaPrefetcher"):
            CudaPrefetcher(3.0)  # type: ignore[arg-type]

    def test_resolve_cpu(self) -> None:
        """'cpu' and torch.device('cpu') resolve to the CPU."""
        assert resolve_device("cpu") == resolve_device(torch.device("cpu")) == torch.device("cpu")


class TestResolveDevice:
    """resolve_device picks a concrete device without calling what a backend lacks."""

    def test_mps_without_current_device(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """device='mps' resolves to mps:0 although torch.mps has no current_device()."""
        assert not hasattr(torch.mps, "current_device")
        monkeypatch.setattr(torch.mps, "is_available", lambda: True)
        monkeypatch.setattr(torch.mps, "device_count", lambda: 1)
        assert resolve_device("mps") == torch.device("mps", 0)
        with pytest.raises(ValueError, match="index 1 is out of range"):
            resolve_device("mps:1")


class TestStructure:
    """DeviceOps.copy keeps every container type; .to() leaves are moved."""

    def test_types_survive_the_copy(self) -> None:
        """dict, OrderedDict, list, tuple, namedtuple, frozen dataclass, .to() objects."""
        ops = DeviceOps(torch.device("cpu"))
        movable, old = Movable(), OldMovable()
        batch = {
            "o": OrderedDict(a=torch.ones(1)),
            "l": [Pair(torch.zeros(2), 1), (torch.ones(1),)],
            "d": Sample(torch.ones(3), "n"),
            "m": movable,
            "old": old,
            "s": "label",
        }
        out = ops.copy(batch)
        assert type(out["o"]) is OrderedDict
        assert type(out["l"][0]) is Pair and out["l"][0].label == 1
        assert type(out["d"]) is Sample and out["d"].name == "n"
        assert movable.moved_to == [(torch.device("cpu"), True)]
        assert old.moved_to == [torch.device("cpu")]
        assert out["s"] == "label"
        assert torch.equal(out["d"].image, torch.ones(3))


class RaisingMove:
    """A .to() that takes non_blocking and raises a TypeError of its own."""

    calls = 0

    def to(self, device: Any, non_blocking: bool = False) -> RaisingMove:
        RaisingMove.calls += 1
        raise TypeError("the user's own bug")


class KeywordMove:
    """A .to(device, **kwargs), like a HuggingFace BatchEncoding's."""

    def __init__(self) -> None:
        self.kwargs: list[dict[str, Any]] = []

    def to(self, device: Any, **kwargs: Any) -> KeywordMove:
        self.kwargs.append(kwargs)
        return self


class TestToFallback:
    """Only a .to() that does not take non_blocking is called without it."""

    def test_a_users_type_error_propagates_once(self) -> None:
        """A TypeError raised inside .to() reaches the caller; the move does not run twice."""
        RaisingMove.calls = 0
        with pytest.raises(TypeError, match="the user's own bug"):
            DeviceOps(torch.device("cpu")).copy({"m": RaisingMove()})
        assert RaisingMove.calls == 1

    def test_keyword_arguments_get_non_blocking(self) -> None:
        """A .to() with **kwargs is passed non_blocking."""
        move = KeywordMove()
        DeviceOps(torch.device("cpu")).copy([move])
        assert move.kwargs == [{"non_blocking": True}]

    def test_signature_read_once_per_type(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The signature is inspected once per type, not per batch."""
        reads: list[Any] = []
        signature = device_ops.inspect.signature
        monkeypatch.setattr(device_ops, "_TAKES_NON_BLOCKING", {})
        monkeypatch.setattr(
            device_ops.inspect, "signature", lambda f: reads.append(f) or signature(f)
        )
        ops = DeviceOps(torch.device("cpu"))
        for _ in range(3):
            ops.copy([OldMovable(), Movable()])
        assert len(reads) == 2


class TestProtocolOnCpu:
    """Epochs, errors, close and pass-through behave as BackgroundLoader's do."""

    def test_empty_loader(self) -> None:
        """An empty loader yields nothing (no crash, no None)."""
        assert list(CudaPrefetcher([], device="cpu")) == []

    def test_epochs_repeat(self) -> None:
        """Each iter() is a new epoch over a re-iterable loader."""
        prefetcher = CudaPrefetcher(range(4), device="cpu", depth=2)
        assert [list(prefetcher) for _ in range(3)] == [[0, 1, 2, 3]] * 3

    @pytest.mark.parametrize("depth", [1, 3])
    def test_error_at_its_batch(self, depth: int) -> None:
        """A source error arrives after the batches before it, as the same object."""
        error = Boom()

        def source() -> Iterator[int]:
            yield from range(3)
            raise error

        got: list[int] = []
        with pytest.raises(Boom) as caught:
            for batch in CudaPrefetcher(source(), device="cpu", depth=depth):
                got.append(batch)
        assert caught.value is error and got == [0, 1, 2]

    def test_transform_error_at_its_batch(self) -> None:
        """A transform error arrives at the batch it failed on."""

        def transform(batch: int) -> int:
            if batch == 2:
                raise Boom
            return batch

        got: list[int] = []
        with pytest.raises(Boom):
            for batch in CudaPrefetcher(range(5), device="cpu", depth=2, transform=transform):
                got.append(batch)
        assert got == [0, 1]

    def test_len_set_epoch_dataset(self) -> None:
        """len, set_epoch (DistributedSampler) and dataset pass through both wrappers."""
        dataset = list(range(32))
        sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=0)
        data = DataLoader(dataset, sampler=sampler, batch_size=4)
        loader = CudaPrefetcher(BackgroundLoader(data), device="cpu")
        assert len(loader) == 4
        assert loader.dataset is dataset
        assert loader.batch_size == 4
        epochs = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            epochs.append(torch.cat(list(loader)).tolist())
        assert sampler.epoch == 2
        assert len({tuple(e) for e in epochs}) == 3
        assert all(len(e) == 16 for e in epochs)

    def test_break_stops_the_inner_thread(self) -> None:
        """An early break through the stack stops BackgroundLoader's thread."""
        loader = CudaPrefetcher(BackgroundLoader(range(1000), depth=4), device="cpu")
        for i in loader:
            if i == 3:
                break
        loader.close()
        assert prefetch_threads() == []

    def test_with_block_closes(self) -> None:
        """Leaving a with block closes the epoch and its source."""
        with CudaPrefetcher(BackgroundLoader(range(1000)), device="cpu") as loader:
            iterator = iter(loader)
            assert next(iterator) == 0
        assert prefetch_threads() == []
        with pytest.raises(StopIteration):
            next(iterator)

    def test_gc_of_abandoned_iterator(self) -> None:
        """Dropping an abandoned stacked iterator stops the thread."""
        iterator = iter(CudaPrefetcher(BackgroundLoader(range(1000)), device="cpu"))
        next(iterator)
        (thread,) = prefetch_threads()
        del iterator
        gc.collect()
        assert wait_until(lambda: not thread.is_alive(), 2.0, collect=False)

    def test_stats(self) -> None:
        """stats counts the batches of the latest epoch."""
        loader = CudaPrefetcher(range(7), device="cpu")
        list(loader)
        assert loader.stats.items == 7
        assert loader.stats.wait_seconds >= 0 and "7 items" in loader.stats.summary()

    def test_stats_sum_every_read_and_wait(self) -> None:
        """Each read's time adds to source_seconds and the loop's wait; the epoch ends stamped."""

        def slow() -> Iterator[int]:
            for index in range(3):
                time.sleep(0.02)  # a read of known length (latency, not a wait for a thread)
                yield index

        loader = CudaPrefetcher(slow(), device="cpu")
        started = time.perf_counter()
        assert list(loader) == [0, 1, 2]
        elapsed = time.perf_counter() - started
        stats = loader.stats
        assert 3 * 0.02 <= stats.source_seconds <= elapsed  # every read counted, once
        assert 3 * 0.02 <= stats.wait_seconds <= elapsed  # on the CPU the loop waits for each
        assert stats.last_handoff is not None and stats.finished is not None
        assert stats.finished >= stats.last_handoff

    def test_stacked_on_multiworker_dataloader(self) -> None:
        """The one-line stack over DataLoader(num_workers=2) delivers every batch."""
        data = DataLoader(torch.arange(40.0), batch_size=4, num_workers=2)
        loader = CudaPrefetcher(BackgroundLoader(data, depth=3), device="cpu")
        assert torch.equal(torch.cat(list(loader)), torch.arange(40.0))
        assert torch.multiprocessing.active_children() == []


def test_module_layout() -> None:
    """The device module exposes the seam the protocol tests replace."""
    assert cuda_prefetcher.device_ops is device_ops


class CountsCalls:
    """A stateful loader whose state counts ``next()`` calls, the one that ends it included."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __iter__(self) -> Iterator[int]:
        self.calls = 0
        return self

    def __next__(self) -> int:
        self.calls += 1
        if self.calls > self.n:
            raise StopIteration
        return self.calls - 1

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.calls = state["calls"]


class TestCheckpoint:
    """state_dict counts only batches handed over, through both wrappers."""

    @pytest.mark.parametrize("stacked", [False, True])
    def test_the_state_at_the_end_is_read_after_stop_iteration(self, stacked: bool) -> None:
        """After the last batch the state is the source's; at the end, the one after its end."""
        source: Any = CountsCalls(4)
        if stacked:
            source = BackgroundLoader(source, depth=2)
        loader = CudaPrefetcher(source, device="cpu", depth=2)
        iterator = iter(loader)
        assert [next(iterator) for _ in range(4)] == [0, 1, 2, 3]
        assert loader.state_dict() == {"calls": 4}
        assert list(iterator) == []
        assert loader.state_dict() == {"calls": 5}

    @pytest.mark.parametrize("depth", [1, 3])
    @pytest.mark.parametrize("stacked", [False, True])
    @pytest.mark.parametrize("stop_after", [0, 1, 4, 9, 10])
    def test_resume_is_exact(self, depth: int, stacked: bool, stop_after: int) -> None:
        """Batches seen before the checkpoint plus those after resume are the epoch, once each."""

        def build() -> CudaPrefetcher[int]:
            source: Any = Stateful(10)
            if stacked:
                source = BackgroundLoader(source, depth=4)
            return CudaPrefetcher(source, device="cpu", depth=depth)

        loader = build()
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(stop_after)]
        state = loader.state_dict()
        loader.close()
        resumed = build()
        resumed.load_state_dict(state)
        assert seen + list(resumed) == list(range(10))

    def test_needs_a_stateful_loader(self) -> None:
        """state_dict over a loader without one is a TypeError naming the loader type."""
        with pytest.raises(TypeError, match=r"CudaPrefetcher\.state_dict\(\).*got list"):
            CudaPrefetcher([1], device="cpu").state_dict()
