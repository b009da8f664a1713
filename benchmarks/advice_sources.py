"""Sources and steps of the ``advice`` workload: one kind of loader per scenario.

Each stands for what a new user wraps: reads from slow storage (a sleep,
which releases the GIL as I/O does), a stream of them, Python-heavy parsing
(which holds the GIL), decoding with torch ops (which use every core), a
source that stalls in bursts, and one whose bursts carry large items.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

SAMPLE = 64
"""Values per sample (small: these scenarios are about time, not bytes)."""


class Reads(Dataset[torch.Tensor]):
    """A map-style dataset whose every sample waits ``seconds`` on storage."""

    def __init__(self, size: int, seconds: float) -> None:
        self.size, self.seconds = size, seconds

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.full((SAMPLE,), float(index))


class ReadStream(IterableDataset[torch.Tensor]):
    """The same reads as a stream; each worker process reads its own shard."""

    def __init__(self, size: int, seconds: float) -> None:
        self.size, self.seconds = size, seconds

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        first, every = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(first, self.size, every):
            time.sleep(self.seconds)
            yield torch.full((SAMPLE,), float(index))


def parse(iterations: int) -> int:
    """Pure-Python work (holds the GIL), like parsing a text record."""
    total = 0
    for value in range(iterations):
        total += value * value % 7
    return total


class Parsed(Dataset[torch.Tensor]):
    """A map-style dataset whose every sample is parsed in pure Python."""

    def __init__(self, size: int, iterations: int) -> None:
        self.size, self.iterations = size, iterations

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((SAMPLE,), float(parse(self.iterations)))


MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class Decoded(Dataset[torch.Tensor]):
    """A map-style dataset whose every image is converted with torch ops (their threads).

    A decoded ``uint8`` image becomes normalised floats at a quarter of the
    side, as an image pipeline's last steps do; torch runs them on its intra-op
    threads, which a new thread sets to every core.
    """

    def __init__(self, size: int, side: int = 224) -> None:
        self.size = size
        self.image = torch.randint(0, 256, (3, side, side), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        planes = self.image.float().div_(255).sub_(MEAN).div_(STD)
        return torch.nn.functional.avg_pool2d(planes, 4)


class Bursts:
    """A re-iterable stream that stalls ``slow`` seconds every tenth item, ``fast`` otherwise.

    Each item carries ``nbytes`` of tensor data (a byte bound counts them).
    """

    def __init__(self, items: int, fast: float, slow: float, nbytes: int = 256) -> None:
        self.items, self.fast, self.slow, self.nbytes = items, fast, slow, nbytes

    def __len__(self) -> int:
        return self.items

    def __iter__(self) -> Iterator[torch.Tensor]:
        for index in range(self.items):
            time.sleep(self.slow if index % 10 == 9 else self.fast)
            yield torch.full((self.nbytes // 4,), float(index))


Step = Callable[[Any], None]
"""A training step: takes a batch."""


def sleep_step(seconds: float) -> Step:
    """A training step on a GPU, as the host sees it: waiting (no core, no GIL)."""

    def step(batch: Any) -> None:
        time.sleep(seconds)

    return step


def cpu_step() -> Step:
    """A training step on the CPU: a small CNN, torch's default threads (every core)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 5, stride=4, padding=2),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 14 * 14, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: Any) -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    return step
