"""A seeded run gives the same result whatever the producer thread's timing.

Found by running PyTorch's ``test/test_dataloader.py`` through the wrappers: a
``DataLoader(shuffle=True)`` without a ``generator`` draws its sampler's seed
from the global RNG at its first ``next()``, which through ``BackgroundLoader``
ran on the producer thread at a moment set by thread timing; with
``torch.manual_seed(0)`` both the shuffle order and the caller's own later
draws then changed from run to run.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, CudaPrefetcher

pytestmark = pytest.mark.timeout(30)

WAIT = 10.0


class GatedRange(Dataset[int]):
    """Indices 0..n-1; each read waits for ``gate`` and is counted in ``reads``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.gate = threading.Event()
        self.reads = 0
        self.read = threading.Condition()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not self.gate.wait(WAIT):
            msg = "gate never opened"
            raise TimeoutError(msg)
        with self.read:
            self.reads += 1
            self.read.notify_all()
        return index

    def wait_for_reads(self, reads: int) -> bool:
        """Wait until at least ``reads`` indices were read."""
        with self.read:
            return self.read.wait_for(lambda: self.reads >= reads, WAIT)


def seeded_run(thread_first: bool, stack: str) -> tuple[float, list[int]]:
    """One seeded epoch; ``thread_first`` lets the thread read before the caller draws."""
    torch.manual_seed(0)
    dataset = GatedRange(8)
    loader = BackgroundLoader(DataLoader(dataset, shuffle=True, batch_size=None))
    wrapped = CudaPrefetcher(loader, device="cpu") if stack == "cuda" else loader
    iterator = iter(wrapped)
    dataset.gate.set()  # every epoch starts at its first next(), on this thread
    first = [int(next(iterator))]
    dataset.gate.clear()
    if thread_first:
        dataset.gate.set()
        # 3 reads: at least one beyond the two a CudaPrefetcher over the thread may hold. On a
        # free-threaded build they may already have happened before the gate closed, and a
        # full buffer then keeps the thread from reading more.
        assert dataset.wait_for_reads(3)
        drawn = float(torch.rand(()))
    else:
        drawn = float(torch.rand(()))
        dataset.gate.set()
    return drawn, first + [int(i) for i in iterator]


class TestSeededShuffle:
    """torch.manual_seed fixes the shuffle and the caller's draws through the thread."""

    @pytest.mark.parametrize("stack", ["background", "cuda"])
    def test_thread_timing_changes_nothing(self, stack: str) -> None:
        """Shuffle order and the caller's draws do not depend on when the thread reads."""
        assert seeded_run(thread_first=True, stack=stack) == seeded_run(False, stack)

    def test_for_loop_matches_the_dataloader(self) -> None:
        """A plain for loop sees the order the unwrapped DataLoader gives for the same seed."""
        torch.manual_seed(0)
        expected = [int(i) for i in DataLoader(range(16), shuffle=True, batch_size=None)]
        after = float(torch.rand(()))
        torch.manual_seed(0)
        loader = BackgroundLoader(DataLoader(range(16), shuffle=True, batch_size=None))
        assert [int(i) for i in loader] == expected
        assert float(torch.rand(())) == after

    def test_sampler_error_waits_for_its_place(self) -> None:
        """A sampler that raises still raises at the first next(), not inside iter()."""

        class Broken(torch.utils.data.Sampler[int]):
            def __iter__(self):  # type: ignore[no-untyped-def]
                raise ValueError("broken sampler")
                yield 0

            def __len__(self) -> int:
                return 1

        iterator = iter(BackgroundLoader(DataLoader(range(4), sampler=Broken())))
        with pytest.raises(ValueError, match="broken sampler"):
            next(iterator)
        iterator.close()
