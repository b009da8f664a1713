"""Datasets and checks for the parallel-fetch tests (``fetch_threads``).

Real ``torch.utils.data`` datasets whose reads can be slowed, gated, made to
fail at chosen indices and counted, and an exact comparison of batches
(same types, ``torch.equal`` on every tensor leaf).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset

THREAD_COUNTS = [1, 2, 4, 16]
"""The ``fetch_threads`` every behaviour is checked at."""
WAIT_SECONDS = 10.0
"""Longest a test waits for threads to reach a state before it fails."""


class Abort(BaseException):
    """A ``BaseException`` that is not an ``Exception``, raised by a dataset."""


class Values(Dataset[Any]):
    """``size`` samples of seeded random floats; ``kind`` picks the sample's shape.

    ``"tensor"``: a tensor; ``"dict"``: ``{"x": tensor, "label": int, "name": str}``;
    ``"tuple"``: ``(tensor, int)``. ``fail`` maps an index to the exception its
    read raises (the same object every time); ``delays`` to seconds it sleeps.
    Every read is recorded in ``reads`` (index, thread name).
    """

    def __init__(
        self,
        size: int,
        kind: str = "tensor",
        *,
        fail: dict[int, BaseException] | None = None,
        delays: dict[int, float] | None = None,
    ) -> None:
        generator = torch.Generator().manual_seed(size)
        self.data = torch.randn(size, 3, generator=generator)
        self.kind = kind
        self.fail = fail or {}
        self.delays = delays or {}
        self.reads: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        with self._lock:
            self.reads.append((index, threading.current_thread().name))
        delay = self.delays.get(index)
        if delay:
            time.sleep(delay)
        error = self.fail.get(index)
        if error is not None:
            raise error
        row = self.data[index]
        if self.kind == "dict":
            return {"x": row, "label": index % 3, "name": f"s{index}"}
        if self.kind == "tuple":
            return row, index
        return row


class WithGetItems(Values):
    """:class:`Values` with ``__getitems__``; each call's indices are kept in ``calls``."""

    def __init__(self, size: int) -> None:
        super().__init__(size, "tuple")
        self.calls: list[tuple[int, ...]] = []

    def __getitems__(self, indices: list[int]) -> list[Any]:
        with self._lock:
            self.calls.append(tuple(indices))
        return [(self.data[i] * 2, i) for i in indices]


class Gated(Dataset[torch.Tensor]):
    """Every read after the first ``free`` waits for ``gate`` (an Event).

    ``free`` counts reads in the order they start, which with several threads
    need not be index order; to free given indices, use ``only``.

    With ``only``, just the reads of those indices wait. ``started`` counts
    reads begun, ``waiting`` reads waiting for the gate now, ``finished`` reads
    that returned.

    ``limit`` fails a read that waited longer than the test allows, so a test
    that forgets to open the gate fails instead of hanging.
    """

    def __init__(
        self, size: int, free: int = 0, only: set[int] | None = None, limit: float = 30.0
    ) -> None:
        self.size = size
        self.free = free
        self.only = only
        self.gate = threading.Event()
        self.started = 0
        self.waiting = 0
        self.finished = 0
        self.limit = limit
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        with self._lock:
            self.started += 1
            free = self.started <= self.free or (self.only is not None and index not in self.only)
        if not free:
            with self._lock:
                self.waiting += 1
            opened = self.gate.wait(self.limit)
            with self._lock:
                self.waiting -= 1
            if not opened:
                msg = f"Gated: read {index} waited more than {self.limit} s for the gate"
                raise TimeoutError(msg)
        with self._lock:
            self.finished += 1
        return torch.tensor(index)


class Counted(Dataset[torch.Tensor]):
    """Reads of ``nbytes``-byte tensors, checking a bound on reads begun and not consumed.

    The consumer raises :attr:`consumed_calls` *before* each ``next()``; a read
    that begins while more than ``bound`` reads are begun and not covered by
    those calls is recorded in :attr:`violations`. The first read is slow, so
    the other threads start while no item's size is known yet.
    """

    def __init__(self, size: int, bound: int, nbytes: int = 8) -> None:
        self.size = size
        self.bound = bound
        self.nbytes = nbytes
        self.started = 0
        self.consumed_calls = 0
        self.most_ahead = 0
        self.violations: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        with self._lock:
            self.started += 1
            ahead = self.started - self.consumed_calls
            self.most_ahead = max(self.most_ahead, ahead)
            if ahead > self.bound:
                self.violations.append((self.started, self.consumed_calls))
        if index == 0:
            time.sleep(0.05)  # a slow read (latency, not a wait for a thread): see the docstring
        return torch.full((self.nbytes,), index, dtype=torch.uint8)


class Ordered(Values):
    """:class:`Values` whose reads are put in order with events, never sleeps.

    The read of an index in ``sets`` sets that event as it begins; the read of
    an index in ``waits`` then waits for that event (``WAIT_SECONDS`` at most,
    then ``AssertionError``) before it reads.
    """

    def __init__(
        self,
        size: int,
        *,
        sets: dict[int, threading.Event] | None = None,
        waits: dict[int, threading.Event] | None = None,
        fail: dict[int, BaseException] | None = None,
    ) -> None:
        super().__init__(size, fail=fail)
        self.sets = sets or {}
        self.waits = waits or {}

    def __getitem__(self, index: int) -> Any:
        if index in self.sets:
            self.sets[index].set()
        event = self.waits.get(index)
        if event is not None and not event.wait(WAIT_SECONDS):
            msg = f"read {index} waited {WAIT_SECONDS} s for its event in vain"
            raise AssertionError(msg)
        return super().__getitem__(index)


def assert_same(actual: Any, expected: Any, where: str = "batch") -> None:
    """Assert ``actual`` is ``expected`` bit for bit: same types, equal tensor leaves."""
    assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{where}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: {actual.shape} != {expected.shape}"
        assert torch.equal(actual, expected), f"{where}: {actual} != {expected}"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{where}: {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def assert_same_batches(actual: list[Any], expected: list[Any]) -> None:
    """Assert two epochs hold the same batches in the same order, bit for bit."""
    assert len(actual) == len(expected), f"{len(actual)} batches, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_same(a, e, f"batch {i}")


def outcomes(iterator: Iterator[Any], most: int = 1000) -> list[tuple[str, Any]]:
    """Consume ``iterator`` past ``Exception``s: ``("item", batch)`` or ``("error", object)``.

    A ``BaseException`` that is not an ``Exception`` ends it as ``("final", object)``.
    More than ``most`` outcomes fail the test (an iterator that raises forever).
    """
    seen: list[tuple[str, Any]] = []
    while len(seen) <= most:
        try:
            seen.append(("item", next(iterator)))
        except StopIteration:
            return seen
        except Exception as error:
            seen.append(("error", error))
        except BaseException as error:
            seen.append(("final", error))
            return seen
    raise AssertionError(f"more than {most} outcomes: {seen[-3:]}")


def assert_same_outcomes(actual: list[tuple[str, Any]], expected: list[tuple[str, Any]]) -> None:
    """Assert batches equal bit for bit and errors are the same objects, in the same places."""
    assert [kind for kind, _ in actual] == [kind for kind, _ in expected]
    for i, ((kind, a), (_, e)) in enumerate(zip(actual, expected, strict=True)):
        if kind == "item":
            assert_same(a, e, f"outcome {i}")
        else:
            assert a is e, f"outcome {i}: {a!r} is not {e!r}"
