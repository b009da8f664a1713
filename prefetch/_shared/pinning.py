"""Pinning batches in page-locked memory, in the producer thread.

A host-to-device copy only overlaps compute when the host tensor is pinned,
and pinning costs a copy of its own, so it belongs in the background thread,
never on the training loop's thread. A thread that touches the accelerator
must select its device first (the prefetcher's, else the caller's current
one): new threads start on device 0.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from prefetch._shared.structure import map_leaves
from prefetch._shared.user_frame import user_stacklevel


def accelerator_available() -> bool:
    """Return whether torch sees an accelerator (CUDA, XPU, MPS, ...)."""
    return bool(torch.accelerator.is_available())


def accelerator_type() -> str | None:
    """Return the type of torch's current accelerator (``"cuda"``, ``"mps"``, ...), or ``None``."""
    if not accelerator_available():
        return None
    try:
        accelerator = torch.accelerator.current_accelerator()
    except RuntimeError:  # torch 2.6 with a CUDA build and no GPU: "none is available"
        return None
    return accelerator.type if accelerator is not None else None


def pinning_unsupported() -> str | None:
    """Return why pinning cannot be used on this machine's accelerator, or ``None`` if it can.

    Pinned memory raises on Apple MPS; torch's ``DataLoader`` turns
    ``pin_memory`` off there, with a warning, and so does ``BackgroundLoader``.
    """
    if accelerator_type() == "mps":
        return "pinned memory is not supported on Apple MPS (torch's DataLoader turns it off too)"
    return None


def current_device_index() -> int | None:
    """Return the caller's current accelerator index, or ``None`` without one."""
    if not accelerator_available():
        return None
    return int(torch.accelerator.current_device_index())


def select_device(index: int | None) -> None:
    """Make ``index`` the current accelerator of the calling thread (if any)."""
    if index is not None:
        torch.accelerator.set_device_index(index)


def is_dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` covers its memory without gaps or overlaps, in some order of dimensions.

    Such a tensor (contiguous, channels-last, any permutation) is copied to
    the device as one block; another (a slice with gaps, an expanded view)
    is first gathered into a pageable temporary by ``Tensor.to``.

    Example:
        >>> x = torch.zeros(4, 6)
        >>> is_dense(x), is_dense(x.t()), is_dense(x[:, ::2]), is_dense(torch.zeros(3).expand(2, 3))
        (True, True, False, False)
    """
    if tensor.numel() <= 1 or tensor.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted(
        (s, n) for s, n in zip(tensor.stride(), tensor.shape, strict=True) if n != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def _pin_tensor(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type != "cpu":
        return tensor
    if not is_dense(tensor):  # pin a dense copy: Tensor.to would gather it into pageable memory
        return tensor.contiguous().pin_memory()
    return tensor if tensor.is_pinned() else tensor.pin_memory()


def pin_batch(batch: Any) -> Any:
    """Return ``batch`` with every CPU tensor leaf in pinned, dense memory.

    A leaf that is not dense (see :func:`is_dense`) is pinned as a dense
    copy, pinned or not before.

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


def pinning_wanted(pin_memory: bool, caller: str) -> bool:
    """Whether ``caller(pin_memory=...)`` pins: ``False``, with a warning, where nothing can pin."""
    if not pin_memory:
        return False
    if not accelerator_available():
        message = (
            f"{caller}(pin_memory=True): no accelerator is available, "
            "so batches are passed through unpinned"
        )
    else:
        unsupported = pinning_unsupported()
        if unsupported is None:
            return True
        message = f"{caller}(pin_memory=True): {unsupported}; batches pass unpinned"
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
    return False
