"""Resuming a StatefulDataLoader from a checkpoint skips and repeats nothing.

``BackgroundLoader.state_dict()`` is the state as of the last item the loop
received, however far the thread ran ahead; ``load_state_dict()`` and a new
``iter()`` continue right after it. Consumed + resumed must be the full
epoch: nothing skipped, nothing repeated.
"""

from __future__ import annotations

import copy
import io
import random
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader, CudaPrefetcher

from .liveness import wait_read_ahead
from .processes import settle

ITEMS = 40
BATCH = 2
BATCHES = ITEMS // BATCH


class Squares(Dataset[int]):
    """``dataset[i] == i * i``: a map-style dataset whose items show their index."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> int:
        return index * index


def make_loader(num_workers: int, shuffle: bool = False) -> StatefulDataLoader:
    """A StatefulDataLoader over ``Squares``; shuffled with a fixed seed if asked."""
    generator = torch.Generator().manual_seed(1234) if shuffle else None
    return StatefulDataLoader(
        Squares(),
        batch_size=BATCH,
        shuffle=shuffle,
        generator=generator,
        num_workers=num_workers,
    )


def keys(batches: list[Any]) -> list[tuple[int, ...]]:
    """Batches as tuples of ints, for exact comparison."""
    return [tuple(int(v) for v in batch) for batch in batches]


def round_trip(state: Any) -> Any:
    """The state as a checkpoint file would give it back (torch.save / torch.load)."""
    buffer = io.BytesIO()
    torch.save(copy.deepcopy(state), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def check_resume(
    num_workers: int,
    depth: int,
    point: int,
    *,
    shuffle: bool = False,
    fresh: bool = True,
    stacked: bool = False,
    epochs_before: int = 0,
    run_ahead: bool = False,
) -> None:
    """Consume ``point`` batches, checkpoint, resume; assert consumed + resumed == full epoch."""

    def wrap(loader: StatefulDataLoader) -> Any:
        background = BackgroundLoader(loader, depth=depth)
        return CudaPrefetcher(background, device="cpu", depth=2) if stacked else background

    reference = make_loader(num_workers, shuffle)
    for _ in range(epochs_before):
        list(reference)
    full = keys(list(reference))
    assert len(full) == BATCHES
    del reference

    loader = wrap(make_loader(num_workers, shuffle))
    for _ in range(epochs_before):
        list(loader)
    iterator = iter(loader)
    consumed = keys([next(iterator) for _ in range(point)])
    if run_ahead:
        wait_read_ahead(iterator)  # the thread prefetched past the checkpoint, as far as it may
    state = round_trip(loader.state_dict())
    if fresh:
        iterator.close()
        del iterator, loader
        resumed_loader = wrap(make_loader(num_workers, shuffle))
    else:
        resumed_loader = loader
    resumed_loader.load_state_dict(state)
    rest = keys(list(resumed_loader))
    assert consumed + rest == full, (
        f"num_workers={num_workers} depth={depth} point={point}: "
        f"consumed {len(consumed)} + resumed {len(rest)} != {len(full)}"
    )
    resumed_loader.close()


class TestResumeSingleProcess:
    """num_workers=0: every resume point, every depth."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("depth", [1, 2, 3, 5, 8])
    def test_every_point_fresh_loader(self, depth: int) -> None:
        """A new loader loaded with the checkpoint resumes right after the last item seen."""
        for point in range(BATCHES + 1):
            check_resume(0, depth, point, run_ahead=0.005)

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("depth", [1, 4, 8])
    def test_every_point_same_loader(self, depth: int) -> None:
        """load_state_dict on the same loader (its epoch still running) resumes exactly."""
        for point in range(BATCHES + 1):
            check_resume(0, depth, point, fresh=False)

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("depth", [1, 3, 8])
    def test_shuffled_second_epoch(self, depth: int) -> None:
        """A checkpoint in the second shuffled epoch resumes that epoch's order exactly."""
        for point in (1, 2, 9, BATCHES - 1, BATCHES):
            check_resume(0, depth, point, shuffle=True, epochs_before=1, run_ahead=0.005)

    @pytest.mark.timeout(60)
    def test_plain_loader_resumes_from_the_start_of_a_shuffled_epoch(self) -> None:
        """Control: StatefulDataLoader's own state right after iter() resumes that epoch exactly."""
        reference = make_loader(0, shuffle=True)
        list(reference)
        full = keys(list(reference))
        loader = make_loader(0, shuffle=True)
        list(loader)
        iter(loader)
        state = round_trip(loader.state_dict())
        resumed = make_loader(0, shuffle=True)
        resumed.load_state_dict(state)
        assert keys(list(resumed)) == full

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("stacked", [False, True])
    def test_checkpoint_before_the_first_batch_of_a_shuffled_epoch(self, stacked: bool) -> None:
        """state_dict() right after iter(), before any batch of epoch 2, resumes epoch 2 exactly."""
        check_resume(0, 2, 0, shuffle=True, epochs_before=1, stacked=stacked)

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("depth", [1, 2, 5])
    def test_stacked_under_cuda_prefetcher(self, depth: int) -> None:
        """Through CudaPrefetcher(BackgroundLoader(...)) the checkpoint is still exact."""
        for point in range(0, BATCHES + 1, 3):
            check_resume(0, depth, point, stacked=True, run_ahead=0.005)

    @pytest.mark.timeout(60)
    def test_checkpoint_every_step_of_one_loop(self) -> None:
        """Checkpoints taken at every step of one loop each resume from where they were taken."""
        loader = BackgroundLoader(make_loader(0), depth=4)
        full = keys(list(make_loader(0)))
        seen: list[tuple[int, ...]] = []
        states = [round_trip(loader.state_dict())]
        for batch in loader:
            seen.extend(keys([batch]))
            states.append(round_trip(loader.state_dict()))
        assert seen == full
        for point, state in enumerate(states):
            resumed = BackgroundLoader(make_loader(0), depth=2)
            resumed.load_state_dict(state)
            assert full[:point] + keys(list(resumed)) == full, point


class TestResumeWorkers:
    """num_workers=2 (slower: sampled depths and resume points)."""

    @pytest.mark.slow
    @pytest.mark.timeout(120)
    def test_sampled_points(self) -> None:
        """Sampled (depth, point) pairs, fresh and same loader, resume exactly with 2 workers."""
        rng = random.Random(6)
        cases = [(1, 0), (8, BATCHES), (2, BATCHES - 1)]
        cases += [(rng.choice([1, 2, 3, 4, 6, 8]), rng.randrange(BATCHES + 1)) for _ in range(6)]
        for depth, point in cases:
            check_resume(2, depth, point, fresh=True, run_ahead=True)
        for depth, point in cases[:3]:
            check_resume(2, depth, point, fresh=False, run_ahead=True)
        assert settle(10.0) == ([], [])
        print(f"num_workers=2: resumed at {len(cases) + 3} (depth, point) pairs: {cases}")

    @pytest.mark.slow
    @pytest.mark.timeout(120)
    def test_shuffled_with_workers(self) -> None:
        """Shuffled, second epoch, 2 workers: resume exactly at a few points."""
        for depth, point in ((2, 5), (8, 13)):
            check_resume(2, depth, point, shuffle=True, epochs_before=1, run_ahead=True)
        assert settle(10.0) == ([], [])
