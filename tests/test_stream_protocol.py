"""CudaPrefetcher's stream protocol, checked on a CPU with a recording fake device.

Each check is also run against a prefetcher with one protection switched off,
to show the check would catch that bug.
"""

from __future__ import annotations

import gc
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._device.copier import StreamCopier

from . import fake_device
from .fake_device import FakeOps, Packed
from .sources import OneShot

pytestmark = pytest.mark.timeout(30)


def nested_batches(n: int) -> list[dict[str, Any]]:
    """Batches with tensors nested in a dict, a list and a tuple."""
    return [
        {"image": torch.full((2, 2), float(i)), "extra": [torch.tensor([i]), (torch.zeros(1), "s")]}
        for i in range(n)
    ]


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch) -> list[FakeOps]:
    """Make every CudaPrefetcher see a fake 'cuda:0'; return the ops objects it creates."""
    return fake_device.install(monkeypatch)


def run_epochs(prefetcher: CudaPrefetcher[Any], ops: FakeOps, epochs: int = 1) -> list[Any]:
    """Iterate, logging each hand-off; return every batch received."""
    received = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unpinned CPU tensors: expected here
        for _ in range(epochs):
            for batch in prefetcher:
                fake_device.handed_over(ops.log, batch)
                received.append(batch)
    return received


Sabotage = Callable[[pytest.MonkeyPatch], None]


def no_consumer_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamCopier, "_consumer_wait", lambda self, consumer, event: None)


def no_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamCopier, "_fence", lambda self, ops, stream: None)


def no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamCopier, "_record_leaves", lambda self, consumer, batch: None)


def copy_on_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        FakeOps, "use_stream", lambda self, stream: __import__("contextlib").nullcontext()
    )


class TestProtocol:
    """The protocol holds for the real code, for depth 1 to 3 and both lifetimes."""

    @pytest.mark.parametrize("depth", [1, 2, 3])
    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_copies_on_side_stream_and_waits(
        self, fake_ops: list[FakeOps], depth: int, lifetime: Any
    ) -> None:
        """Copies run on the side stream; the consumer waits on each batch's own event."""
        prefetcher = CudaPrefetcher(nested_batches(6), depth=depth, lifetime=lifetime)
        received = run_epochs(prefetcher, fake_ops[0], epochs=2)
        (ops,) = fake_ops
        assert len(received) == 12
        assert [int(b["image"][0, 0]) for b in received] == list(range(6)) * 2
        fake_device.check_copies_on_side_stream(ops.log, "side0")
        fake_device.check_consumer_waits(ops.log, "side0")
        if lifetime == "fence":
            fake_device.check_fence_before_copies(ops.log, "side0")
            assert not any(entry[0] == "record_stream" for entry in ops.log)
        else:
            fake_device.check_leaves_recorded(ops.log)
            assert not any(entry[0] == "wait_stream" for entry in ops.log)

    def test_one_side_stream_across_epochs(self, fake_ops: list[FakeOps]) -> None:
        """Exactly one side stream is created, and reused, across three epochs."""
        prefetcher = CudaPrefetcher(nested_batches(3))
        run_epochs(prefetcher, fake_ops[0], epochs=3)
        assert len(fake_ops[0].streams) == 1
        assert prefetcher.stream is fake_ops[0].streams[0]

    def test_depth_batches_in_flight(self, fake_ops: list[FakeOps]) -> None:
        """With depth=3, three batches are already copying behind the one handed over."""
        prefetcher = CudaPrefetcher(nested_batches(5), depth=3)
        run_epochs(prefetcher, fake_ops[0])
        log = fake_ops[0].log
        first_handoff = next(i for i, e in enumerate(log) if e[0] == "handoff")
        assert sum(1 for e in log[:first_handoff] if e[0] == "record_event") == 1 + 3

    def test_transform_runs_on_side_stream(self, fake_ops: list[FakeOps]) -> None:
        """The transform runs while the side stream is current, after the copy."""
        seen: list[str] = []

        def transform(batch: dict[str, Any]) -> dict[str, Any]:
            seen.append(fake_ops[0].current.name)
            return {**batch, "image": batch["image"] * 2}

        prefetcher = CudaPrefetcher(nested_batches(3), transform=transform)
        received = run_epochs(prefetcher, fake_ops[0])
        assert seen == ["side0"] * 3
        assert [float(b["image"][0, 0]) for b in received] == [0.0, 2.0, 4.0]


def packed_batches(n: int) -> list[dict[str, Any]]:
    """Batches holding a plain tensor and a ``.to()`` object with tensors inside."""
    return [
        {"x": torch.full((2,), float(i)), "boxes": Packed(torch.full((3,), float(i)))}
        for i in range(n)
    ]


def resident_batches(n: int) -> list[dict[str, Any]]:
    """Batches whose "mask" is already on the (fake) device, next to a host tensor."""
    return [
        {"x": torch.full((2,), float(i)), "mask": fake_device.on_device(torch.full((2,), float(i)))}
        for i in range(n)
    ]


def logging_transform(get_ops: Callable[[], FakeOps]) -> Callable[[Any], Any]:
    """A transform that reads the whole batch and logs the device-resident inputs it read."""

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        ops = get_ops()
        resident = tuple(id(t) for t in ops.tensors_on_device({"mask": batch["mask"]}))
        ops.log.append(("transform", ops.current.name, resident))
        return {**batch, "x": batch["x"] + batch["mask"]}

    return transform


class TestOpaqueAndResident:
    """The protocol also protects ``.to()`` objects and inputs already on the device."""

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_to_objects_memory_protected(self, fake_ops: list[FakeOps], lifetime: Any) -> None:
        """Tensors inside ``.to()`` objects are recorded or fenced in both lifetimes."""
        prefetcher = CudaPrefetcher(packed_batches(5), depth=2, lifetime=lifetime)
        received = run_epochs(prefetcher, fake_ops[0])
        assert [float(b["boxes"].fake_tensors()[0][0]) for b in received] == [0, 1, 2, 3, 4]
        fake_device.check_memory_protected(fake_ops[0].log)

    def test_record_stream_fences_from_first_opaque_batch(self, fake_ops: list[FakeOps]) -> None:
        """record_stream: no fence before the first ``.to()`` object, a fence from it on."""
        batches = nested_batches(2) + packed_batches(2)
        run_epochs(CudaPrefetcher(batches, lifetime="record_stream"), fake_ops[0])
        log = fake_ops[0].log
        starts = [start for start, _ids, _event in fake_device.copy_groups(log)]
        fences = [i for i, e in enumerate(log) if e == ("wait_stream", "side0", "consumer")]
        assert len(starts) == 4
        assert [any(starts[k - 1] < f < starts[k] for f in fences) for k in (1, 3)] == [
            False,
            True,
        ]
        assert fences[0] < starts[2]

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_resident_inputs_ordered_and_kept(self, fake_ops: list[FakeOps], lifetime: Any) -> None:
        """A transform reads device-resident inputs after the consumer stream, and keeps them."""
        transform = logging_transform(lambda: fake_ops[0])
        prefetcher = CudaPrefetcher(
            resident_batches(4), depth=2, lifetime=lifetime, transform=transform
        )
        (ops,) = fake_ops
        received = run_epochs(prefetcher, ops)
        assert [float(b["x"][0]) for b in received] == [0.0, 2.0, 4.0, 6.0]
        fake_device.check_resident_inputs(ops.log, "side0")

    def test_resident_inputs_without_transform_are_not_fenced(
        self, fake_ops: list[FakeOps]
    ) -> None:
        """Without a transform nothing reads resident inputs on the side stream: no fence needed."""
        batches = resident_batches(3)
        prefetcher = CudaPrefetcher(batches, lifetime="record_stream")
        received = run_epochs(prefetcher, fake_ops[0])
        assert all(b["mask"] is a["mask"] for a, b in zip(batches, received, strict=True))
        assert not any(e[0] == "wait_stream" for e in fake_ops[0].log)


def no_resident_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamCopier, "_keep_inputs_alive", lambda self, ops, stream, r: None)


class TestChecksCatchSabotage:
    """Each protocol check fails when the protection it guards is switched off."""

    @pytest.mark.parametrize(
        ("sabotage", "lifetime", "check"),
        [
            (no_consumer_wait, "fence", fake_device.check_consumer_waits),
            (no_fence, "fence", fake_device.check_fence_before_copies),
            (no_record, "record_stream", lambda log, side: fake_device.check_leaves_recorded(log)),
            (copy_on_consumer, "fence", fake_device.check_copies_on_side_stream),
        ],
        ids=["wait", "fence", "record_stream", "side-stream"],
    )
    def test_check_fails_without_protection(
        self,
        fake_ops: list[FakeOps],
        monkeypatch: pytest.MonkeyPatch,
        sabotage: Sabotage,
        lifetime: Any,
        check: Callable[[Any, str], None],
    ) -> None:
        """With the protection removed, the corresponding check raises."""
        sabotage(monkeypatch)
        prefetcher = CudaPrefetcher(nested_batches(4), depth=2, lifetime=lifetime)
        run_epochs(prefetcher, fake_ops[0])
        with pytest.raises(AssertionError):
            check(fake_ops[0].log, "side0")


class TestUnpinnedWarning:
    """Unpinned host batches on a CUDA device warn once, with advice."""

    def test_warns_once_and_names_background_loader(self, fake_ops: list[FakeOps]) -> None:
        """One warning per prefetcher, suggesting pin_memory on the BackgroundLoader."""
        from prefetch import BackgroundLoader

        prefetcher = CudaPrefetcher(BackgroundLoader(nested_batches(3)))
        with pytest.warns(UserWarning, match="pin_memory=True to the BackgroundLoader") as record:
            list(prefetcher)
            list(prefetcher)
        assert len([w for w in record if "unpinned" in str(w.message)]) == 1

    def test_warning_for_plain_loader(self, fake_ops: list[FakeOps]) -> None:
        """For another loader the advice is to wrap it in BackgroundLoader(pin_memory=True)."""
        with pytest.warns(UserWarning, match=r"BackgroundLoader\(loader, pin_memory=True\)"):
            list(CudaPrefetcher(nested_batches(1)))


class TestHoleChecksCatchSabotage:
    """The opaque-object and resident-input checks fail when their protection is removed."""

    @pytest.mark.parametrize("lifetime", ["fence", "record_stream"])
    def test_opaque_check_fails_without_fence(
        self, fake_ops: list[FakeOps], monkeypatch: pytest.MonkeyPatch, lifetime: Any
    ) -> None:
        """Without the fence, ``.to()`` objects' memory is unprotected in both lifetimes."""
        no_fence(monkeypatch)
        run_epochs(CudaPrefetcher(packed_batches(4), depth=2, lifetime=lifetime), fake_ops[0])
        with pytest.raises(AssertionError, match="neither recorded nor fenced"):
            fake_device.check_memory_protected(fake_ops[0].log)

    @pytest.mark.parametrize(
        ("sabotage", "match"),
        [(no_fence, "not ordered"), (no_resident_keepalive, "not kept alive")],
        ids=["fence", "keep-alive"],
    )
    def test_resident_check_fails_without_protection(
        self,
        fake_ops: list[FakeOps],
        monkeypatch: pytest.MonkeyPatch,
        sabotage: Sabotage,
        match: str,
    ) -> None:
        """Without the fence or the side-stream record, the resident-input check raises."""
        sabotage(monkeypatch)
        transform = logging_transform(lambda: fake_ops[0])
        prefetcher = CudaPrefetcher(
            resident_batches(3), depth=2, lifetime="record_stream", transform=transform
        )
        run_epochs(prefetcher, fake_ops[0])
        with pytest.raises(AssertionError, match=match):
            fake_device.check_resident_inputs(fake_ops[0].log, "side0")


class TestPinDevice:
    """A BackgroundLoader under a CudaPrefetcher pins for the prefetcher's device."""

    @pytest.fixture
    def selected(self, monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
        """Pretend an accelerator (current device 0); record what the thread selects."""
        from prefetch._shared import pinning as _pinning
        from prefetch._threads import fetch_options as _fetch_options
        from prefetch._threads import loader as _background

        chosen: list[int | None] = []
        monkeypatch.setattr(_pinning, "accelerator_available", lambda: True)
        monkeypatch.setattr(_background, "current_device_index", lambda: 0)
        monkeypatch.setattr(_fetch_options, "select_device", chosen.append)
        monkeypatch.setattr(_background, "pin_batch", lambda batch: batch)
        return chosen

    def test_thread_selects_prefetcher_device(
        self, fake_ops: list[FakeOps], selected: list[int | None]
    ) -> None:
        """device='cuda:1' while the caller is on device 0: the thread selects device 1."""
        from prefetch import BackgroundLoader

        loader = CudaPrefetcher(
            BackgroundLoader(nested_batches(3), pin_memory=True), device="cuda:1"
        )
        assert loader.device == torch.device("cuda", 1)
        assert len(run_epochs(loader, fake_ops[0], epochs=2)) == 6
        assert selected == [1, 1]

    def test_alone_it_selects_current_device(self, selected: list[int | None]) -> None:
        """Without a prefetcher naming a device, the thread selects the caller's current one."""
        from prefetch import BackgroundLoader

        assert len(list(BackgroundLoader(nested_batches(2), pin_memory=True))) == 2
        assert selected == [0]


class TestOpaqueInputsKeptAlive:
    """With a transform, ``.to()`` inputs (maybe on the device) live until their hand-over."""

    def test_inputs_released_after_hand_over(self, fake_ops: list[FakeOps]) -> None:
        """Inputs of the batches in flight are still referenced; those handed over are not."""
        inputs: list[weakref.ref[Packed]] = []

        def source() -> Any:
            for k in range(4):
                packed = Packed(torch.full((2,), float(k)))
                inputs.append(weakref.ref(packed))
                yield {"p": packed}
                del packed

        prefetcher = CudaPrefetcher(source(), depth=2, transform=lambda batch: batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            iterator = iter(prefetcher)
            first = next(iterator)
        gc.collect()
        assert float(first["p"].fake_tensors()[0][0]) == 0.0
        assert [ref() is not None for ref in inputs] == [False, True, True]
        iterator.close()


@pytest.mark.filterwarnings("ignore:CudaPrefetcher.*unpinned:UserWarning")
class TestOneShotReadAhead:
    """Over a one-shot source, the batches copied ahead are the next epoch's, in order."""

    @pytest.mark.parametrize("how", ["break", "close"])
    @pytest.mark.parametrize("taken", [1, 3, 5])
    def test_the_rest_the_error_and_the_end_carry_over(
        self, fake_ops: list[FakeOps], how: str, taken: int
    ) -> None:
        """The loop takes ``taken`` of 5 batches, 2 copied ahead, then drops the iterator
        (``break``) or closes it: the next epoch gives the rest, the source's error in its
        place, then ends without asking the source past its end again; the one after is
        empty and says why."""
        source = OneShot(5, tensors=True)
        prefetcher = CudaPrefetcher(source, depth=2)
        iterator = iter(prefetcher)
        assert [int(next(iterator)) for _ in range(taken)] == list(range(taken))
        assert source.drawn == min(taken + 2, 5)  # copied ahead: what is carried
        if how == "close":
            iterator.close()
        else:
            del iterator
        rest = iter(prefetcher)
        assert [int(next(rest)) for _ in range(taken, 5)] == list(range(taken, 5))
        with pytest.raises(ValueError, match="bad"):
            next(rest)
        assert list(rest) == []
        assert source.ends == 1, "the source was asked past its end again"
        with pytest.warns(UserWarning, match="consumed by an earlier epoch"):
            assert list(prefetcher) == []


class Sized:
    """A re-iterable of ``size`` 1-element tensors with a length; counts what each epoch asks.

    ``ends``: calls that found the end; ``closed``: epochs whose iterator was closed early
    (each iterator is kept in ``made``: only a ``close()`` runs its ``finally``, not its
    collection).
    """

    def __init__(self, size: int, *, final: BaseException | None = None) -> None:
        self.size, self.ends, self.closed, self.drawn = size, 0, 0, 0
        self.final = final  # raised instead of the item after the first, then it goes on
        self.made: list[Iterator[torch.Tensor]] = []

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[torch.Tensor]:
        made = self._items()
        self.made.append(made)
        return made

    def _items(self) -> Iterator[torch.Tensor]:
        finished = False
        try:
            for index in range(self.size):
                self.drawn += 1
                if index == 1 and self.final is not None:
                    raise self.final
                yield torch.tensor([index])
            finished = True
            self.ends += 1
        finally:
            self.closed += not finished


@pytest.mark.filterwarnings("ignore:CudaPrefetcher.*unpinned:UserWarning")
class TestDeviceEpoch:
    """The epoch over a sized source on the (fake) device: its end, its source, its figures."""

    def test_the_end_is_found_when_the_loop_asks_past_it(self, fake_ops: list[FakeOps]) -> None:
        """With 2 copied ahead, the source is asked for its end only by the next() after
        its last item, as a plain loop over it would."""
        source = Sized(4)
        iterator = iter(CudaPrefetcher(source, depth=2))
        taken = [int(next(iterator)) for _ in range(4)]
        assert taken == [0, 1, 2, 3]
        assert (source.drawn, source.ends) == (4, 0)
        assert next(iterator, "over") == "over"
        assert source.ends == 1

    def test_an_epoch_closed_early_closes_the_iterator_it_made(
        self, fake_ops: list[FakeOps]
    ) -> None:
        """The iterator made by ``iter(loader)`` is closed at close() (its finally runs)."""
        source = Sized(6)
        iterator = iter(CudaPrefetcher(source, depth=2))
        assert int(next(iterator)) == 0
        assert source.closed == 0
        iterator.close()
        assert source.closed == 1

    def test_an_error_that_ends_the_epoch_ends_it(self, fake_ops: list[FakeOps]) -> None:
        """A ``BaseException`` the source raised (a ``BackgroundLoader`` below marks it as
        the source's, not a Ctrl-C on this thread) is raised in its place and ends the
        epoch there: its end is stamped before another next()."""
        source = Sized(6, final=SystemExit(3))
        prefetcher = CudaPrefetcher(BackgroundLoader(source, depth=1), depth=2)
        iterator = iter(prefetcher)
        assert int(next(iterator)) == 0
        assert prefetcher.stats.finished is None
        with pytest.raises(SystemExit):
            next(iterator)
        assert prefetcher.stats.finished is not None
        assert next(iterator, "over") == "over"
        assert source.drawn == 2

    def test_the_wait_at_the_end_is_counted(self, fake_ops: list[FakeOps]) -> None:
        """The next() that finds the end adds its time to ``end_wait_seconds`` (more than 0,
        less than the epoch took) and the epoch's end is stamped."""
        prefetcher = CudaPrefetcher(Sized(3), depth=2)
        started = time.perf_counter()
        assert len(list(prefetcher)) == 3
        took = time.perf_counter() - started
        stats = prefetcher.stats
        assert 0.0 < stats.end_wait_seconds < took
        assert stats.finished is not None and started < stats.finished <= time.perf_counter()

    def test_a_break_sets_a_seeded_shuffle_back(self, fake_ops: list[FakeOps]) -> None:
        """Dropped after one batch, the last (short) batch copied ahead, the prefetcher leaves
        the shuffle's generator where the plain loop's break leaves it (reading the short
        batch drew the next permutation)."""

        def after_a_break(make: Callable[[DataLoader[int]], Any]) -> torch.Tensor:
            generator = torch.Generator().manual_seed(0)
            loader = DataLoader(list(range(10)), batch_size=4, shuffle=True, generator=generator)
            iterator = iter(make(loader))
            next(iterator)
            del iterator  # a break
            return generator.get_state()

        plain = after_a_break(lambda loader: loader)
        read_ahead = after_a_break(lambda loader: iter(list(loader)))  # read to the end
        assert not torch.equal(read_ahead, plain)  # the check can fail
        assert torch.equal(after_a_break(lambda loader: CudaPrefetcher(loader, depth=4)), plain)
