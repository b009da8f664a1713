"""The ``next()`` that finds the end is made where the plain loop makes it (issue 33).

A wrapper reads ahead of the loop; over a sized loader it reads ahead to the
last item and no further. The call past it (a ``RandomSampler`` draws its
next permutation there; a one-shot source gives up its end) waits until the
loop asks past the last item, and a framework that stops at ``len(loader)``
(Lightning) never makes it, so a seeded shuffle's later epochs match the
plain loader's.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from prefetch import BackgroundLoader, CudaPrefetcher

from . import fake_device
from .fake_device import FakeOps
from .liveness import describe, engine_of, take, wait_for, wait_went_ahead

pytestmark = pytest.mark.timeout(60)


class Counted:
    """``n`` ints whose iterators count every ``next()``, the end's too; ``len`` is ``length``."""

    def __init__(self, n: int, length: int | None = None) -> None:
        self.n = n
        self.length = n if length is None else length
        self.calls = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        for index in range(self.n + 1):
            with self.lock:
                self.calls += 1
            if index == self.n:
                return
            yield index


THREAD_STACKS: dict[str, Callable[[Any], Any]] = {
    "background": lambda loader: BackgroundLoader(loader),
    "background-depth-8": lambda loader: BackgroundLoader(loader, depth=8),
    "background(background)": lambda loader: BackgroundLoader(BackgroundLoader(loader, depth=8)),
}


class TestBackgroundLoader:
    """The thread reads the whole epoch ahead, then waits for the loop to ask past it."""

    @pytest.mark.parametrize("stack", sorted(THREAD_STACKS))
    def test_the_end_is_found_when_the_loop_asks(self, stack: str) -> None:
        """Five items taken, the thread idle: five calls; the sixth next() makes the sixth."""
        source = Counted(5)
        iterator = iter(THREAD_STACKS[stack](source))
        assert [take(iterator) for _ in range(5)] == list(range(5))
        engine = engine_of(iterator)
        wait_for(lambda: engine.snapshot().waiting_threads > 0, lambda: describe(engine))
        assert source.calls == 5
        with pytest.raises(StopIteration):
            next(iterator)
        assert source.calls == 6

    def test_a_short_epoch_ends_without_waiting(self) -> None:
        """A source shorter than its len ends where it ends: the loop gets the end."""
        source = Counted(3, length=5)
        assert list(BackgroundLoader(source)) == [0, 1, 2]
        assert source.calls == 4

    def test_a_longer_epoch_goes_on_past_its_len(self) -> None:
        """A source longer than its len: every item comes, the later ones when asked for."""
        source = Counted(6, length=2)
        assert list(BackgroundLoader(source, depth=4)) == list(range(6))
        assert source.calls == 7


def seeded_orders(make: Callable[[DataLoader[int]], Any], epochs: int = 3) -> list[list[int]]:
    """Each epoch's order, taking exactly ``len(loader)`` batches (as Lightning does)."""
    generator = torch.Generator().manual_seed(0)
    loader = make(DataLoader(list(range(12)), batch_size=2, shuffle=True, generator=generator))
    orders = []
    for _ in range(epochs):
        iterator = iter(loader)
        orders.append([value for _ in range(len(loader)) for value in next(iterator).tolist()])
        del iterator  # dropped after len(loader) batches, never asked past
    return orders


SEEDED_STACKS: dict[str, Callable[[Any], Any]] = {
    **THREAD_STACKS,
    "fetch_threads": lambda loader: BackgroundLoader(loader, fetch_threads=3),
    "fetch_threads-batch": lambda loader: BackgroundLoader(
        loader, fetch_threads=2, fetch_grain="batch"
    ),
    "cuda(background)": lambda loader: CudaPrefetcher(BackgroundLoader(loader), device="cpu"),
}


class TestSeededShuffle:
    """Stopping at len(loader) leaves the sampler's generator where the plain loader leaves it."""

    @pytest.mark.parametrize("stack", sorted(SEEDED_STACKS))
    def test_three_epochs_in_the_plain_order(self, stack: str) -> None:
        """Every epoch's order equals the plain loader's, not only the first."""
        plain = seeded_orders(lambda loader: loader)
        assert seeded_orders(SEEDED_STACKS[stack]) == plain
        assert plain[0] != plain[1]  # the shuffle differs between epochs: the check can fail


def cut_short_then_whole(make: Callable[[DataLoader[int]], Any]) -> list[list[int]]:
    """Epoch 0 cut after its first batch, then two whole epochs: their orders.

    Ten samples in batches of four: the last batch is short, and drawing it
    makes ``RandomSampler`` draw its next permutation from the generator. A
    wrapper's epoch 0 is cut only once its thread went as far ahead as it may
    (the short batch drawn), so that the outcome does not depend on timing.
    """
    generator = torch.Generator().manual_seed(0)
    loader = make(DataLoader(list(range(10)), batch_size=4, shuffle=True, generator=generator))
    iterator = iter(loader)
    next(iterator)
    if isinstance(loader, BackgroundLoader):  # let it read ahead as far as it may
        wait_went_ahead(engine_of(iterator))
    del iterator  # a break after the first batch
    return [[value for batch in loader for value in batch.tolist()] for _ in range(2)]


class TestSeededShuffleCutShort:
    """Known gap: an epoch cut short after the read-ahead drew a short last batch."""

    @pytest.mark.xfail(
        strict=True,
        reason="known gap (found 2026-12-07): the read-ahead drew the short last batch, whose "
        "drawing made RandomSampler draw the next permutation from the generator; the plain "
        "loop that breaks before it never does, so later epochs differ",
    )
    def test_later_epochs_in_the_plain_order(self) -> None:
        """The epochs after a cut-short one come in the plain loader's order."""
        plain = cut_short_then_whole(lambda loader: loader)
        assert plain[0] != plain[1]  # the shuffle differs between epochs: the check can fail
        assert cut_short_then_whole(lambda loader: BackgroundLoader(loader, depth=4)) == plain


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch) -> list[FakeOps]:
    """Make every CudaPrefetcher see a fake 'cuda:0'."""
    return fake_device.install(monkeypatch)


class TestCudaPrefetcher:
    """On a device the copies run ahead to the last batch, and the end waits for the loop."""

    @pytest.mark.usefixtures("fake_ops")
    @pytest.mark.parametrize("depth", [1, 3])
    def test_the_end_is_found_when_the_loop_asks(self, depth: int) -> None:
        """Four batches taken with copies in flight: four calls; the fifth next() makes one more."""
        source = Counted(4)
        batches = [torch.full((2,), float(i)) for i in range(4)]
        loader = CudaPrefetcher(_Mapped(source, batches), depth=depth)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # unpinned CPU tensors
            iterator = iter(loader)
            got = [float(next(iterator)[0]) for _ in range(4)]
            assert got == [0.0, 1.0, 2.0, 3.0] and source.calls == 4
            with pytest.raises(StopIteration):
                next(iterator)
        assert source.calls == 5


class _Mapped:
    """``Counted``'s ints as tensors (the fake device copies tensors), sized like it."""

    def __init__(self, source: Counted, batches: list[torch.Tensor]) -> None:
        self.source, self.batches = source, batches

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self.batches[index] for index in self.source)
