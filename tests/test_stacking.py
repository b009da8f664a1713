"""The stack's order: ``BackgroundLoader(CudaPrefetcher(...))`` is refused, on every device.

A CudaPrefetcher's waits, fences and ``record_stream`` target the current
stream of the thread that runs its ``next()``. In a BackgroundLoader's
thread that is the default stream, not the training loop's: a loop under
``with torch.cuda.stream(s):`` would read unfinished copies. The wrong order
is refused when the BackgroundLoader is built (through any chain of
``.loader``), and an epoch driven from another thread than the one that
called ``iter()`` raises at its ``next()``.
"""

from __future__ import annotations

import threading
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._device import iterator as device_iterator

from . import fake_device
from .fake_device import FakeOps, FakeStream
from .gpu.gpu_helpers import Opaque

pytestmark = pytest.mark.timeout(30)

RIGHT_ORDER = r"CudaPrefetcher\(BackgroundLoader\(\.\.\.\)\)"


class Named:
    """Someone else's wrapper that names what it wraps ``loader``."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


def batches(n: int) -> list[torch.Tensor]:
    return [torch.full((2,), float(k)) for k in range(n)]


class TestRefusedAtConstruction:
    """The wrong order is a TypeError naming the right one, before anything runs."""

    def test_on_the_cpu(self) -> None:
        """No accelerator needed: a CPU user learns the order before a GPU run."""
        with pytest.raises(TypeError, match=RIGHT_ORDER):
            BackgroundLoader(CudaPrefetcher(batches(3), device="cpu"))

    def test_on_a_cuda_device(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Through the fake CUDA device too."""
        fake_device.install(monkeypatch)
        with pytest.raises(TypeError, match=RIGHT_ORDER):
            BackgroundLoader(CudaPrefetcher(batches(3)), pin_memory=False)

    @pytest.mark.parametrize(
        "wrap",
        [
            lambda p: Named(p),
            lambda p: Named(Named(p)),
            lambda p: CudaPrefetcher(Named(p), device="cpu"),
        ],
        ids=["named", "named-twice", "prefetcher-over-named"],
    )
    def test_through_other_wrappers(self, wrap: Any) -> None:
        """A CudaPrefetcher deeper inside, behind wrappers that name their loader."""
        with pytest.raises(TypeError, match=RIGHT_ORDER):
            BackgroundLoader(wrap(CudaPrefetcher(batches(3), device="cpu")))

    def test_right_order_runs(self) -> None:
        """CudaPrefetcher(BackgroundLoader(...)) is the stack the refusal names."""
        loader = CudaPrefetcher(BackgroundLoader(batches(3)), device="cpu")
        assert [b[0].item() for b in loader] == [0.0, 1.0, 2.0]

    def test_cycles_and_odd_attributes_end_the_search(self) -> None:
        """A loader whose ``.loader`` loops, or raises, is not a CudaPrefetcher: accepted."""

        class Loop(Named):
            pass

        loop = Loop(None)
        loop.loader = loop

        class Raises:
            @property
            def loader(self) -> Any:
                raise RuntimeError("not here")

            def __iter__(self) -> Iterator[int]:
                return iter([1])

        assert list(BackgroundLoader(Raises())) == [1]
        BackgroundLoader(loop).close()


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch) -> list[FakeOps]:
    return fake_device.install(monkeypatch)


def next_on_another_thread(iterator: Iterator[Any]) -> BaseException | None:
    """Call ``next(iterator)`` on a new thread; return what it raised (``None``: nothing)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            next(iterator)
        except BaseException as error:  # handed to the test's thread
            raised.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


class TestOtherThread:
    """An epoch's ``next()`` on another thread than its ``iter()`` raises, and corrupts nothing."""

    @pytest.mark.parametrize("device", ["cpu", "fake-cuda"])
    def test_raises_and_the_epoch_stays_intact(
        self, monkeypatch: pytest.MonkeyPatch, device: str
    ) -> None:
        """The other thread's next() raises naming the order; the owner then gets batch 0."""
        if device == "fake-cuda":
            fake_device.install(monkeypatch)
        loader = CudaPrefetcher(batches(3), device="cpu" if device == "cpu" else None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # unpinned CPU tensors
            iterator = iter(loader)
            error = next_on_another_thread(iterator)
            assert isinstance(error, RuntimeError)
            assert "thread that called iter()" in str(error)
            assert [b[0].item() for b in iterator] == [0.0, 1.0, 2.0]

    def test_behind_an_opaque_wrapper_in_a_background_loader(self) -> None:
        """Construction cannot see through ``Opaque``; the first batch raises instead."""
        loader = BackgroundLoader(Opaque(CudaPrefetcher(batches(3), device="cpu")))
        with pytest.raises(RuntimeError, match=RIGHT_ORDER):
            next(iter(loader))
        loader.close()

    def test_waits_target_the_owner_stream(self, fake_ops: list[FakeOps]) -> None:
        """With the check in place every consumer-side wait is queued on the loop's stream."""
        loader = CudaPrefetcher(batches(3))
        (ops,) = fake_ops
        ops.current = FakeStream(ops.log, "user")  # the loop runs under its own stream
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            iterator = iter(loader)
            assert isinstance(next_on_another_thread(iterator), RuntimeError)
            assert len(list(iterator)) == 3
        waits = {entry[1] for entry in ops.log if entry[0] == "wait_event"}
        assert waits == {"user"}

    def test_control_without_the_check_waits_on_the_wrong_stream(
        self, fake_ops: list[FakeOps], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: without the check, the other thread's waits go to its default stream."""
        same_thread = types.SimpleNamespace(
            get_ident=lambda: 0, current_thread=threading.current_thread
        )
        monkeypatch.setattr(device_iterator, "threading", same_thread)
        loader = CudaPrefetcher(batches(3))
        (ops,) = fake_ops
        ops.current = FakeStream(ops.log, "user")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            iterator = iter(loader)
            assert next_on_another_thread(iterator) is None  # nothing stopped it
        waits = {entry[1] for entry in ops.log if entry[0] == "wait_event"}
        assert waits == {"consumer"}  # the other thread's default stream, not "user"
