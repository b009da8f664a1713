"""The ``next()`` that finds the end is made where the plain loop makes it (issue 33).

A wrapper reads ahead of the loop; over a sized loader it reads ahead to the
last item and no further. The call past it (a ``RandomSampler`` draws its
next permutation there; a one-shot source gives up its end) waits until the
loop asks past the last item, and a framework that stops at ``len(loader)``
(Lightning) never makes it, so a seeded shuffle's later epochs match the
plain loader's.
"""

from __future__ import annotations

import pickle
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._shared.sampling import SamplingGenerators, generators_of

from . import fake_device
from .fake_device import FakeOps
from .liveness import LIVENESS_SECONDS, describe, engine_of, take, wait_for, wait_read_ahead

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


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch) -> list[FakeOps]:
    """Make every CudaPrefetcher see a fake 'cuda:0'."""
    return fake_device.install(monkeypatch)


def shuffled_ten(generator: torch.Generator) -> DataLoader[int]:
    """Ten samples in batches of four: drawing the short last batch draws the next permutation."""
    return DataLoader(list(range(10)), batch_size=4, shuffle=True, generator=generator)


def drawn_with_replacement(generator: torch.Generator) -> DataLoader[int]:
    """100 samples drawn with replacement: ``RandomSampler`` draws 32 indices at a time."""
    sampler = RandomSampler(range(100), replacement=True, generator=generator)
    return DataLoader(list(range(100)), batch_size=8, sampler=sampler)


def with_workers(generator: torch.Generator) -> DataLoader[int]:
    """42 samples in 11 batches over two workers (which draw 4 batches ahead themselves)."""
    return DataLoader(
        list(range(42)), batch_size=4, shuffle=True, generator=generator, num_workers=2
    )


def nothing(generator: torch.Generator) -> None:
    """A hook that does nothing."""


def cut_short_then_whole(
    make: Callable[[DataLoader[int]], Any],
    build: Callable[[torch.Generator], DataLoader[int]] = shuffled_ten,
    stop: Callable[[Any], object] = wait_read_ahead,
    during: Callable[[torch.Generator], object] = nothing,
    between: Callable[[torch.Generator], object] = nothing,
    taken: int = 1,
) -> list[list[int]]:
    """Epoch 0 cut after ``taken`` batches, then two whole epochs: their orders.

    ``stop`` runs before the cut epoch is dropped; by default it waits until
    the wrapper's thread went as far ahead as it may, so that the outcome does
    not depend on timing. ``during`` runs, with the generator, after it and
    before the drop; ``between`` after the drop, before the next epoch.
    """
    generator = torch.Generator().manual_seed(0)
    loader = make(build(generator))
    iterator = iter(loader)
    for _ in range(taken):
        next(iterator)
    stop(iterator)
    during(generator)
    del iterator  # a break
    between(generator)
    return [[value for batch in loader for value in batch.tolist()] for _ in range(2)]


def whole_epochs(
    make: Callable[[DataLoader[int]], Any], build: Callable[[torch.Generator], DataLoader[int]]
) -> list[list[int]]:
    """Three whole epochs, each asked past its last batch (a ``for`` loop): their orders."""
    loader = make(build(torch.Generator().manual_seed(0)))
    return [[value for batch in loader for value in batch.tolist()] for _ in range(3)]


def shuffled_twelve(generator: torch.Generator) -> DataLoader[int]:
    """Twelve samples in batches of four: no short batch, the end draws the next permutation."""
    return DataLoader(list(range(12)), batch_size=4, shuffle=True, generator=generator)


def short_batch_dropped(generator: torch.Generator) -> DataLoader[int]:
    """Ten samples in batches of four, the short one dropped: the end draws the permutation."""
    return DataLoader(
        list(range(10)), batch_size=4, shuffle=True, generator=generator, drop_last=True
    )


def validate(generator: torch.Generator) -> object:
    """Another loader on the same generator: its ``iter()`` draws a seed from it."""
    return [batch.tolist() for batch in DataLoader([0, 1, 2], generator=generator)]


CUT_SHORT_STACKS: dict[str, Callable[[Any], Any]] = {
    "background-depth-4": lambda loader: BackgroundLoader(loader, depth=4),
    "background(background)": lambda loader: BackgroundLoader(BackgroundLoader(loader, depth=8)),
    "fetch_threads": lambda loader: BackgroundLoader(loader, fetch_threads=3, depth=8),
    "fetch_threads-batch": lambda loader: BackgroundLoader(
        loader, fetch_threads=2, fetch_grain="batch", depth=8
    ),
    "cuda": lambda loader: CudaPrefetcher(loader, depth=4),
    "cuda(background)": lambda loader: CudaPrefetcher(BackgroundLoader(loader, depth=8), depth=1),
}
"""Read ahead past the short last batch (a CudaPrefetcher on a fake device, see fake_ops)."""


@pytest.mark.usefixtures("fake_ops")
@pytest.mark.filterwarnings("ignore:CudaPrefetcher.*unpinned:UserWarning")
class TestSeededShuffleCutShort:
    """An epoch cut short leaves a seeded shuffle's generator where the plain loop leaves it.

    The read-ahead may draw the short last batch (and with it the next
    permutation), or the next 32 indices with replacement; the epoch's end
    sets the generator back to where the loop's last batch left it.
    """

    @pytest.mark.parametrize("stack", sorted(CUT_SHORT_STACKS))
    def test_later_epochs_in_the_plain_order(self, stack: str) -> None:
        """The epochs after a cut-short one come in the plain loader's order."""
        plain = cut_short_then_whole(lambda loader: loader)
        assert plain[0] != plain[1]  # the shuffle differs between epochs: the check can fail
        assert cut_short_then_whole(CUT_SHORT_STACKS[stack]) == plain

    @pytest.mark.parametrize("stack", ["background-depth-4", "cuda(background)"])
    def test_with_replacement(self, stack: str) -> None:
        """A sampler drawing 32 indices at a time: its draws past the break are set back."""
        plain = cut_short_then_whole(lambda loader: loader, drawn_with_replacement)
        wrapped = cut_short_then_whole(CUT_SHORT_STACKS[stack], drawn_with_replacement)
        assert wrapped == plain

    def test_with_worker_processes(self) -> None:
        """Two workers: their own read-ahead is the plain loader's too; ours is set back."""
        plain = cut_short_then_whole(lambda loader: loader, with_workers)
        wrapped = cut_short_then_whole(
            lambda loader: BackgroundLoader(loader, depth=8), with_workers
        )
        assert wrapped == plain

    @pytest.mark.parametrize("stack", ["background-depth-4", "cuda", "cuda(background)"])
    def test_closed_rather_than_dropped(self, stack: str) -> None:
        """``close()`` on the cut epoch sets the generator back as dropping it does."""
        plain = cut_short_then_whole(lambda loader: loader)

        def close(iterator: Any) -> None:
            wait_read_ahead(iterator)
            iterator.close()

        closed = cut_short_then_whole(CUT_SHORT_STACKS[stack], stop=close)
        assert closed == plain

    @pytest.mark.parametrize("stack", ["background-depth-4", "cuda(background)"])
    def test_set_back_at_the_break(self, stack: str) -> None:
        """Another loader on the same generator, iterated between: it draws after the setting."""
        plain = cut_short_then_whole(lambda loader: loader, between=validate)
        wrapped = cut_short_then_whole(CUT_SHORT_STACKS[stack], between=validate)
        assert wrapped == plain

    @pytest.mark.parametrize("stack", sorted(CUT_SHORT_STACKS))
    @pytest.mark.parametrize("build", [shuffled_twelve, short_batch_dropped])
    def test_whole_epochs_keep_the_draw_at_their_end(
        self, stack: str, build: Callable[[torch.Generator], DataLoader[int]]
    ) -> None:
        """Asked past the last batch, the sampler draws the next permutation: it stays drawn."""
        plain = whole_epochs(lambda loader: loader, build)
        assert plain[1] != plain[2]  # each epoch its own order: the check can fail
        assert whole_epochs(CUT_SHORT_STACKS[stack], build) == plain

    @pytest.mark.parametrize("stack", ["background-depth-4", "cuda(background)"])
    def test_a_draw_by_another_loader_before_the_drop_is_kept(self, stack: str) -> None:
        """Another loader on the generator iterated while the cut epoch is still open: kept."""
        plain = cut_short_then_whole(lambda loader: loader, shuffled_twelve, during=validate)
        wrapped = cut_short_then_whole(CUT_SHORT_STACKS[stack], shuffled_twelve, during=validate)
        assert wrapped == plain

    def test_a_thread_still_inside_keeps_its_draws(self) -> None:
        """A thread inside the sampler at the break: nothing is set under its later draws.

        It drew before it blocked and draws the next permutation when it goes
        on: the generator ends as a loop that also took the last batch leaves it.
        """
        gated = GatedSampler(range(10))
        plain = cut_short_then_whole(lambda loader: loader, gated.loader, taken=3)
        gated.gate.clear()
        gated.blocked.clear()  # the plain epochs went past the gate

        def cut_while_blocked(iterator: Any) -> None:
            assert gated.blocked.wait(LIVENESS_SECONDS)  # the thread is inside the sampler
            engine = engine_of(iterator)
            iterator.close()  # gives up waiting for the thread after the stuck grace
            assert any(thread.is_alive() for thread in engine.threads)
            gated.gate.set()  # the thread draws the next permutation now, then leaves

        wrapped = cut_short_then_whole(
            lambda loader: BackgroundLoader(loader, depth=4), gated.loader, stop=cut_while_blocked
        )
        assert wrapped == plain

    def test_a_reseed_after_the_break_is_kept(self) -> None:
        """A thread still reading at the break, then ``manual_seed``: the next epochs follow it."""
        gated = GatedData(10, block_at=5)  # the thread's second batch waits in the dataset

        def reseed(generator: torch.Generator) -> None:
            generator.manual_seed(7)
            gated.gate.set()

        plain = cut_short_then_whole(lambda loader: loader, gated.loader, between=reseed)
        gated.calls, gated.gate, gated.blocked = 0, threading.Event(), threading.Event()

        def cut_while_reading(iterator: Any) -> None:
            assert gated.blocked.wait(LIVENESS_SECONDS)
            engine = engine_of(iterator)
            iterator.close()
            assert any(thread.is_alive() for thread in engine.threads)

        wrapped = cut_short_then_whole(
            lambda loader: BackgroundLoader(loader, depth=4),
            gated.loader,
            stop=cut_while_reading,
            between=reseed,
        )
        assert wrapped == plain

    def test_a_pickled_wrapper_sets_back_its_own_generator(self) -> None:
        """A copy's generators are its own loader's (pickled together): those are set back."""
        plain = cut_short_then_whole(lambda loader: loader)
        copied = cut_short_then_whole(
            lambda loader: pickle.loads(pickle.dumps(BackgroundLoader(loader, depth=4)))
        )
        assert copied == plain

    def test_an_epoch_open_beside_it_is_left_alone(self) -> None:
        """Closing one of two epochs sets nothing while the other one still draws."""

        def second_epoch(make: Callable[[DataLoader[int]], Any]) -> list[int]:
            loader = make(drawn_with_replacement(torch.Generator().manual_seed(0)))
            first, second = iter(loader), iter(loader)
            next(first)  # the first draws its first 32 indices, the second its own 32
            taken = next(second).tolist()
            wait_read_ahead(first)
            wait_read_ahead(second)
            del first  # dropped: a break out of the first
            return taken + [value for batch in second for value in batch.tolist()]

        plain = second_epoch(lambda loader: loader)
        assert second_epoch(lambda loader: BackgroundLoader(loader, depth=2)) == plain


class FakeEpoch:
    """A stopped epoch whose thread leaves the source after ``busy`` more joins."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.joins = 0

    def join(self, *, timeout: float, stuck_grace: float) -> bool:
        self.joins += 1
        return self.joins > self.busy


class TestSamplingGenerators:
    """The generators go back to where the loop stopped, never under a draw."""

    def test_found_through_a_batch_sampler_each_once(self) -> None:
        """The loader's and a batch sampler's sampler's generators; a shared one once."""
        own, shared = torch.Generator(), torch.Generator()
        sampler = RandomSampler(range(8), generator=shared)
        batches = BatchSampler(sampler, batch_size=2, drop_last=False)
        loader = DataLoader(range(8), batch_sampler=batches, generator=own)
        assert generators_of(loader) == (own, shared)
        assert generators_of(DataLoader(range(8), shuffle=True, generator=own)) == (own,)
        assert SamplingGenerators.of(DataLoader(range(8), shuffle=True)) is None

    def test_nothing_set_while_a_thread_is_inside(self) -> None:
        """Over with a thread inside: nothing set; once it left, the next epoch over sets."""
        generator = torch.Generator().manual_seed(0)
        sampling = SamplingGenerators((generator,))
        sampling.opened()
        received = sampling.mark()
        torch.rand(3, generator=generator)  # the thread's draw past the loop's last item
        moved = sampling.mark()
        epoch = FakeEpoch(busy=1)
        sampling.over(received, inside=epoch)
        assert torch.equal(generator.get_state(), moved[0])
        sampling.opened()
        sampling.over(received, inside=None)  # the thread left by now
        assert epoch.joins == 2
        assert torch.equal(generator.get_state(), received[0])

    def test_nothing_set_while_another_epoch_runs(self) -> None:
        """Two epochs open: the first one over sets nothing, the last one sets its position."""
        generator = torch.Generator().manual_seed(0)
        sampling = SamplingGenerators((generator,))
        sampling.opened()
        sampling.opened()
        received = sampling.mark()
        torch.rand(3, generator=generator)
        moved = sampling.mark()
        sampling.over(received, inside=None)
        assert torch.equal(generator.get_state(), moved[0])
        sampling.over(received, inside=None)
        assert torch.equal(generator.get_state(), received[0])

    def test_nothing_set_after_a_draw_of_another(self) -> None:
        """A draw since the wrapper's last mark (another loader, a reseed): nothing is set."""
        generator = torch.Generator().manual_seed(0)
        sampling = SamplingGenerators((generator,))
        sampling.opened()
        received = sampling.mark()
        torch.rand(3, generator=generator)
        sampling.mark()
        torch.rand(1, generator=generator)  # not the wrapper's: no mark after it
        drawn = generator.get_state()
        sampling.over(received, inside=None)
        assert torch.equal(generator.get_state(), drawn)


class GatedData:
    """``n`` samples; the ``block_at``-th read waits for ``gate`` (set ``blocked`` first)."""

    def __init__(self, n: int, block_at: int) -> None:
        self.n, self.block_at, self.calls = n, block_at, 0
        self.gate, self.blocked = threading.Event(), threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        self.calls += 1
        if self.calls == self.block_at:
            self.blocked.set()
            assert self.gate.wait(LIVENESS_SECONDS)
        return index

    def loader(self, generator: torch.Generator) -> DataLoader[int]:
        """These samples in batches of four, shuffled by ``generator``."""
        return DataLoader(self, batch_size=4, shuffle=True, generator=generator)  # type: ignore[arg-type]


class GatedSampler(RandomSampler):
    """A ``RandomSampler`` that draws once more, then waits for ``gate``, past its last index."""

    def __init__(self, data: range) -> None:
        super().__init__(data)
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()

    def loader(self, generator: torch.Generator) -> DataLoader[int]:
        """Ten samples in batches of four over this sampler, drawing from ``generator``."""
        self.generator = generator
        return DataLoader(list(range(10)), batch_size=4, sampler=self)

    def __iter__(self) -> Iterator[int]:
        indices = super().__iter__()
        for _ in range(len(self)):
            yield next(indices)
        torch.rand(1, generator=self.generator)  # a draw the loop's position is before
        self.blocked.set()
        assert self.gate.wait(LIVENESS_SECONDS)
        yield from indices  # draws the next permutation, then ends


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
