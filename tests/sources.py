"""Sources shared by the tests: stateful, failing, tracked, slow, and a drain helper."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset


class Stateful:
    """A minimal stateful loader: state is the position of the next item."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.position = 0
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        self.position = self.start
        self.start = 0
        while self.position < self.n:
            self.position += 1
            yield self.position - 1

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["position"]


def failing_gen(
    items: list[Any], fail_at: int | None, error: BaseException | None
) -> Iterator[Any]:
    """Yield ``items``, raising ``error`` instead of item ``fail_at`` (if given)."""
    for index, item in enumerate(items):
        if fail_at is not None and index == fail_at:
            assert error is not None
            raise error
        yield item
    if fail_at is not None and fail_at >= len(items):
        assert error is not None
        raise error


class FailingIterable:
    """A re-iterable source that raises ``error`` at item ``fail_at`` of each epoch."""

    def __init__(
        self, items: list[Any], fail_at: int | None = None, error: BaseException | None = None
    ) -> None:
        self.items = items
        self.fail_at = fail_at
        self.error = error

    def __iter__(self) -> Iterator[Any]:
        return failing_gen(self.items, self.fail_at, self.error)

    def __len__(self) -> int:
        return len(self.items)


class ListSource:
    """A stateful list-backed source: the reference for checkpoint semantics.

    ``state_dict()`` is ``{"pos": p, "epoch": e}``: ``p`` items of epoch ``e``
    (the epoch being iterated) have been produced. ``load_state_dict`` makes
    the next ``iter()`` start at ``p`` of epoch ``e``; a position at the end
    means "start a new epoch". ``set_epoch`` picks the epoch the next
    ``iter()`` uses. Items are ``(epoch, index, value)`` in an order that is a
    permutation seeded by the epoch. ``fail_at`` (read at ``iter()``) makes the
    epoch raise ``error`` instead of producing that index.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.pos = 0
        self.epoch = 0  # used by the next iter()
        self.active_epoch = 0  # the epoch being iterated
        self.fail_at: int | None = None
        self.error: BaseException | None = None

    @staticmethod
    def order(epoch: int, size: int) -> list[int]:
        """Return the item order of ``epoch`` (a seeded permutation of ``range(size)``)."""
        import random

        values = list(range(size))
        random.Random(epoch).shuffle(values)
        return values

    def __len__(self) -> int:
        return self.size

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation the next ``iter()`` uses."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, int]:
        """Return the position after the last produced item, and its epoch."""
        return {"pos": self.pos, "epoch": self.active_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from ``state`` at the next ``iter()``."""
        self.pos = state["pos"]
        self.epoch = self.active_epoch = state["epoch"]

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        if self.pos >= self.size:
            self.pos = 0
        self.active_epoch = self.epoch
        return self._run(self.pos, self.epoch, self.fail_at, self.error)

    def _run(
        self, start: int, epoch: int, fail_at: int | None, error: BaseException | None
    ) -> Iterator[tuple[int, int, int]]:
        order = self.order(epoch, self.size)
        for index in range(start, self.size):
            if fail_at is not None and index == fail_at:
                assert error is not None
                raise error
            self.pos = index + 1
            yield (epoch, index, order[index])


class Tracked:
    """A batch object that can be weak-referenced, to count live batches."""

    __slots__ = ("__weakref__", "index", "payload")

    def __init__(self, index: int) -> None:
        self.index = index
        self.payload = bytearray(16)


class SlowDataset(Dataset[torch.Tensor]):
    """A map-style dataset whose items take ``delay`` seconds; negative indices raise.

    ``reads`` counts the reads begun (a hint across threads: it only grows).
    """

    def __init__(self, size: int, delay: float = 0.0) -> None:
        self.size = size
        self.delay = delay
        self.reads = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.reads += 1
        if index < 0:
            raise ValueError(f"poisoned index {index}")
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor(index)


def drain(iterator: Iterator[Any]) -> tuple[list[Any], BaseException | None]:
    """Consume ``iterator``; return the items and the exception that ended it (or None)."""
    items: list[Any] = []
    try:
        for item in iterator:
            items.append(item)
    except BaseException as error:
        # The loop stops at the error and drops the iterator (an iterator still held
        # could go on after an error, so its thread would rightly keep running); this
        # frame stays in the error's traceback, so the name must go.
        del iterator
        return items, error
    return items, None


class OneShot:
    """A one-shot iterator: ``size`` items, a ``ValueError``, then its end, which it counts.

    Items are ints, or with ``tensors`` 1-element tensors (what a device copies).
    """

    def __init__(self, size: int, *, tensors: bool = False) -> None:
        self.size, self.drawn, self.ends = size, 0, 0
        self.raised = False
        self.tensors = tensors

    def __iter__(self) -> OneShot:
        return self

    def __next__(self) -> Any:
        if self.drawn < self.size:
            self.drawn += 1
            return torch.tensor([self.drawn - 1]) if self.tensors else self.drawn - 1
        if not self.raised:
            self.raised = True
            raise ValueError("bad")
        self.ends += 1  # asked past its end: a stream would block here, or start over
        raise StopIteration
