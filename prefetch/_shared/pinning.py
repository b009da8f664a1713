"""Pinning batches in page-locked memory, in the producer thread.

A host-to-device copy only overlaps compute when the host tensor is pinned,
and pinning costs a copy of its own, so it belongs in the background thread,
never on the training loop's thread. A thread that touches the accelerator
must select its device first (the prefetcher's, else the caller's current
one): new threads start on device 0.
"""

from __future__ import annotations

from typing import Any

import torch

from prefetch._shared.structure import map_leaves


def accelerator_available() -> bool:
    """Return whether torch sees an accelerator (CUDA, XPU, MPS, ...)."""
    return bool(torch.accelerator.is_available())


def current_device_index() -> int | None:
    """Return the caller's current accelerator index, or ``None`` without one."""
    if not accelerator_available():
        return None
    return int(torch.accelerator.current_device_index())


def select_device(index: int | None) -> None:
    """Make ``index`` the current accelerator of the calling thread (if any)."""
    if index is not None:
        torch.accelerator.set_device_index(index)


def _pin_tensor(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type != "cpu" or tensor.is_pinned():
        return tensor
    return tensor.pin_memory()


def pin_batch(batch: Any) -> Any:
    """Return ``batch`` with every CPU tensor leaf in pinned memory.

    Leaves that are not tensors but have a ``pin_memory()`` method (custom
    batch classes, as DataLoader supports) are pinned through it; other
    leaves are returned untouched. Needs an accelerator.
    """

    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _pin_tensor(value)
        method = getattr(value, "pin_memory", None)
        if callable(method) and not isinstance(value, type):
            return method()
        return value

    return map_leaves(leaf, batch)
