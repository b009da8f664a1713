"""On a real GPU: copies run ahead; the end and a one-shot read-ahead stay in step (issue 33).

The CPU path (tests/test_end_call.py, tests/test_iteration.py) and a fake
device check the logic; here the same promises hold with real streams,
events and copies in flight.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


class Counted:
    """``n`` pinned batches whose iterators count every ``next()``, the end's too."""

    def __init__(self, n: int) -> None:
        self.batches = [torch.full((1024,), float(i)).pin_memory() for i in range(n)]
        self.calls = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for index in range(len(self.batches) + 1):
            with self.lock:
                self.calls += 1
            if index == len(self.batches):
                return
            yield self.batches[index]


class TestTheEndWaitsForTheLoop:
    """Copies in flight run to the last batch, never past it."""

    @pytest.mark.parametrize("depth", [1, 3])
    def test_calls_at_the_last_batch(self, depth: int) -> None:
        """All batches taken with copies in flight: the end-finding next() only when asked."""
        source = Counted(6)
        iterator = iter(CudaPrefetcher(source, depth=depth))
        got = [float(next(iterator)[0].item()) for _ in range(6)]
        assert got == [float(i) for i in range(6)] and source.calls == 6
        with pytest.raises(StopIteration):
            next(iterator)
        assert source.calls == 7


class TestOneShotReadAhead:
    """A break over a generator: the copies in flight come first in the next epoch."""

    @pytest.mark.parametrize("stack", ["cuda", "cuda(background)"])
    def test_nothing_is_lost(self, stack: str) -> None:
        """Break after item 2 with copies in flight: the next epoch is 3, 4, ..., 19."""
        batches = (torch.full((1024,), float(i)).pin_memory() for i in range(20))
        source = batches if stack == "cuda" else BackgroundLoader(batches, pin_memory=True)
        loader = CudaPrefetcher(source, depth=3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for batch in loader:
                if batch[0].item() == 2.0:
                    break
            rest = [batch[0].item() for batch in loader]
        assert rest == [float(i) for i in range(3, 20)]
