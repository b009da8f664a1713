"""Host memory a copy reads: the pageable-copy warnings, dense pinning, and pinning on MPS.

Pinned memory needs an accelerator, so here "pinned" is a mark that a
patched ``Tensor.is_pinned`` reads: the checks themselves are the real code.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._device.host import leaf_path
from prefetch._shared import pinning
from prefetch._threads import fetch_options
from prefetch._threads import loader as background

from . import fake_device
from .fake_device import FakeOps
from .gpu.gpu_helpers import check_first_batch_only

pytestmark = pytest.mark.timeout(30)

PINNED = "_test_pinned"


def pinned(tensor: torch.Tensor) -> torch.Tensor:
    setattr(tensor, PINNED, True)
    return tensor


@pytest.fixture
def fake_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """``is_pinned`` is true for tensors marked by :func:`pinned` (and views of nothing else)."""
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: hasattr(self, PINNED))


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch, fake_pinning: None) -> list[FakeOps]:
    return fake_device.install(monkeypatch)


def caught(loader: CudaPrefetcher[Any], epochs: int = 1) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(epochs):
            list(loader)
    return [str(w.message) for w in record if "CudaPrefetcher:" in str(w.message)]


def batch(image: torch.Tensor) -> dict[str, Any]:
    return {"image": image, "label": pinned(torch.tensor([1]))}


class TestPageableWarnings:
    """Every batch is looked at until each kind has warned once, naming the leaf."""

    def test_unpinned_later_batch(self, fake_ops: list[FakeOps]) -> None:
        """Pinned batches 0 and 1, then an unpinned image in batch 2: one warning naming it."""
        batches = [batch(pinned(torch.zeros(4))) for _ in range(2)] + [batch(torch.zeros(4))] * 2
        messages = caught(CudaPrefetcher(batches), epochs=2)
        assert len(messages) == 1
        assert "batch 2, leaf batch['image'], arrives in unpinned" in messages[0]

    def test_pinned_but_not_dense(self, fake_ops: list[FakeOps]) -> None:
        """A pinned slice with gaps warns that torch gathers it into a pageable temporary."""
        strided = pinned(torch.zeros(4, 6))[:, ::2]
        setattr(strided, PINNED, True)  # a view of pinned memory is pinned
        messages = caught(CudaPrefetcher([batch(pinned(torch.zeros(4)))] + [batch(strided)] * 3))
        assert len(messages) == 1
        assert "batch 1, leaf batch['image'], is pinned but not dense" in messages[0]
        assert "strides (6, 2)" in messages[0]

    def test_each_kind_once(self, fake_ops: list[FakeOps]) -> None:
        """Both kinds in one run: two warnings, then nothing more is looked at."""
        strided = pinned(torch.zeros(4, 6))[:, ::2]
        setattr(strided, PINNED, True)
        loader = CudaPrefetcher([batch(strided), batch(torch.zeros(4))] * 3)
        assert len(caught(loader, epochs=2)) == 2
        assert loader._copier._host_check.done

    def test_dense_pinned_layouts_are_quiet(self, fake_ops: list[FakeOps]) -> None:
        """Transposed or channels-last pinned tensors are copied as one block: no warning."""
        images = [
            pinned(torch.zeros(3, 5).t()),
            pinned(torch.zeros(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)),
        ]
        assert caught(CudaPrefetcher([batch(image) for image in images])) == []

    def test_control_first_batch_only(
        self, fake_ops: list[FakeOps], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Control: looking at the first batch only (the old check) misses batch 2."""
        check_first_batch_only(monkeypatch)
        batches = [batch(pinned(torch.zeros(4))) for _ in range(2)] + [batch(torch.zeros(4))]
        assert caught(CudaPrefetcher(batches)) == []

    def test_leaf_paths(self) -> None:
        """Paths name dict keys, indices, named-tuple fields and dataclass fields."""
        from collections import namedtuple

        pair = namedtuple("pair", "image label")
        x = torch.zeros(1)
        assert leaf_path([{"a": (0, x)}], x) == "batch[0]['a'][1]"
        assert leaf_path(pair(0, [x]), x) == "batch.label[0]"
        assert leaf_path(x, x) == "batch"


class TestDensePinning:
    """pin_batch pins a dense copy of a tensor that is not dense, pinned or not."""

    def test_not_dense_becomes_dense(
        self, monkeypatch: pytest.MonkeyPatch, fake_pinning: None
    ) -> None:
        """A slice with gaps is pinned as a contiguous copy; dense leaves keep their layout."""
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned(self.clone()))
        strided = torch.arange(24.0).view(4, 6)[:, ::2]
        channels_last = torch.zeros(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
        out = pinning.pin_batch({"s": strided, "c": channels_last})
        assert out["s"].is_contiguous() and torch.equal(out["s"], strided)
        assert out["c"].is_contiguous(memory_format=torch.channels_last)
        assert all(t.is_pinned() for t in out.values())

    def test_pinned_but_not_dense_is_copied(
        self, monkeypatch: pytest.MonkeyPatch, fake_pinning: None
    ) -> None:
        """Already pinned is not enough: a pinned slice with gaps is pinned again, dense."""
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned(self.clone()))
        strided = torch.arange(24.0).view(4, 6)[:, ::2]
        setattr(strided, PINNED, True)
        dense = pinned(torch.ones(3))
        out = pinning.pin_batch([strided, dense])
        assert out[0] is not strided and out[0].is_contiguous() and out[1] is dense


class TestPinningOnMps:
    """pin_memory=True on Apple MPS is turned off with a warning, as torch's DataLoader does."""

    def test_turned_off_with_a_warning(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The loader warns, reports pin_memory False and never pins."""

        def no_pinning(tensor: torch.Tensor) -> torch.Tensor:
            raise AssertionError("pinned on MPS")

        monkeypatch.setattr(pinning, "accelerator_available", lambda: True)
        monkeypatch.setattr(pinning, "accelerator_type", lambda: "mps")
        monkeypatch.setattr(pinning, "_pin_tensor", no_pinning)
        with pytest.warns(UserWarning, match="not supported on Apple MPS"):
            loader = BackgroundLoader([torch.ones(2)], pin_memory=True)
        assert loader.settings.pin_memory is False
        assert [b.tolist() for b in loader] == [[1.0, 1.0]]

    def test_cuda_keeps_pinning(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Control: with CUDA as the accelerator the same loader pins quietly."""
        monkeypatch.setattr(pinning, "accelerator_available", lambda: True)
        monkeypatch.setattr(background, "current_device_index", lambda: 0)
        monkeypatch.setattr(fetch_options, "select_device", lambda index: None)
        monkeypatch.setattr(pinning, "accelerator_type", lambda: "cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert BackgroundLoader([torch.ones(2)], pin_memory=True).settings.pin_memory is True
