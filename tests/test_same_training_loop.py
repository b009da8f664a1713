"""A plain training loop through the wrappers: seeded runs repeat, a break loses nothing (issue 33).

The guide's recipe for random augmentations that repeat (a generator seeded
from ``sample_seed()``, else torch's global one) must give the same run, bit
for bit, every time, with dropout drawing from the global generator in the
loop: with one loading thread as with ``fetch_threads``. And a ``break`` over
a one-shot source (a generator) must not lose what the thread read ahead: the
next epoch starts with the first item the loop did not take, as it does over
the plain generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, CudaPrefetcher, sample_seed

from .same_training import STACKS, THREAD_STACKS, assert_same_steps

pytestmark = pytest.mark.timeout(60)

RUNS = 3


class Jitter(Dataset[torch.Tensor]):
    """The guide's recipe: sample ``i`` plus noise from a sample_seed generator, else global."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.0005)  # a read that lets the loop's draws fall between the thread's
        seed = sample_seed()
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return index + torch.rand(2, generator=generator)


def seeded_run(wrap: Callable[[Any], Any]) -> list[torch.Tensor]:
    """Two epochs from torch.manual_seed(0), dropout in the model: every batch, loss and weight."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = wrap(DataLoader(Jitter(), batch_size=4, shuffle=True))
    seen: list[torch.Tensor] = []
    for _ in range(2):
        for batch in loader:
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            seen += [batch, loss.detach()]
    return seen + [p.detach() for p in model.parameters()]


def bits(run: list[torch.Tensor]) -> list[bytes]:
    """Each tensor of a run as its bytes: equal lists are equal bit for bit."""
    return [tensor.numpy().tobytes() for tensor in run]


SEEDED_STACKS = {"plain": lambda loader: loader, **STACKS, **THREAD_STACKS}


class TestSeededAugmentation:
    """The guide's sample_seed recipe repeats bit for bit, with dropout in the loop."""

    @pytest.mark.parametrize("stack", sorted(SEEDED_STACKS))
    def test_three_runs_are_identical(self, stack: str) -> None:
        """Three runs from the same seed: the same batches, losses and weights, bit for bit."""
        first, *others = [bits(seeded_run(SEEDED_STACKS[stack])) for _ in range(RUNS)]
        for run in others:
            assert_same_steps(first, run, stack, names=("run 1", "a later run"))

    def test_one_thread_draws_what_fetch_threads_draw(self) -> None:
        """sample_seed depends only on the epoch's seed and the sample's place, not the threads."""
        one = bits(seeded_run(BackgroundLoader))
        threads = bits(seeded_run(THREAD_STACKS["fetch_threads"]))
        assert_same_steps(one, threads, "sample_seed", names=("one thread", "fetch_threads=2"))


# --- a break over a one-shot source --------------------------------------------------

ITEMS = 30

ONE_SHOT_STACKS: dict[str, Callable[[Any], Any]] = {
    "background": BackgroundLoader,
    "background_depth4": lambda source: BackgroundLoader(source, depth=4),
    "cuda_over_background": lambda source: CudaPrefetcher(BackgroundLoader(source)),
    "cuda": CudaPrefetcher,
    "background_over_background": lambda source: BackgroundLoader(BackgroundLoader(source)),
}

SOURCES: dict[str, Callable[[], Iterator[int]]] = {
    "generator": lambda: (i for i in range(ITEMS)),
    "iterator": lambda: iter(list(range(ITEMS))),
}


def epochs_with_breaks(loader: Any, takes: list[int]) -> list[list[int]]:
    """One epoch per entry of ``takes``, each left with a ``break`` after that many items."""
    epochs = []
    for take in takes:
        seen: list[int] = []
        for item in loader:
            seen.append(int(item))
            if len(seen) == take:
                break
        epochs.append(seen)
    return epochs


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("stack", sorted(ONE_SHOT_STACKS))
class TestBreakOverOneShotSource:
    """After a break the next epoch starts with the first item the loop did not take."""

    @pytest.mark.parametrize("takes", [[1, 30], [3, 3, 30], [5, 2, 7, 30]])
    def test_break_then_next_epoch_as_plain(
        self, stack: str, source: str, takes: list[int]
    ) -> None:
        plain = epochs_with_breaks(SOURCES[source](), takes)
        assert [i for epoch in plain for i in epoch] == list(range(ITEMS))
        wrapped = epochs_with_breaks(ONE_SHOT_STACKS[stack](SOURCES[source]()), takes)
        assert_same_steps(plain, wrapped, f"{stack} over a {source}")

    def test_close_then_next_epoch_goes_on(self, stack: str, source: str) -> None:
        """close() of an iterator after 4 items: the next epoch gives item 4 onwards."""
        loader = ONE_SHOT_STACKS[stack](SOURCES[source]())
        iterator = iter(loader)
        taken = [int(next(iterator)) for _ in range(4)]
        iterator.close()
        assert taken + [int(item) for item in loader] == list(range(ITEMS))

    def test_a_new_epoch_over_a_live_iterator_goes_on(self, stack: str, source: str) -> None:
        """iter() again while the first iterator is alive: it goes on, and the old one stops."""
        loader = ONE_SHOT_STACKS[stack](SOURCES[source]())
        first = iter(loader)
        taken = [int(next(first)) for _ in range(4)]
        assert taken + [int(item) for item in loader] == list(range(ITEMS))
        with pytest.raises(RuntimeError):
            next(first)
