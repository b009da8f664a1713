"""Which host tensors a copy reads from pageable memory, and the one warning for each kind.

A host-to-device copy overlaps compute only from pinned memory. From
pageable memory the CPU waits until the side stream reaches the copy (with a
fence: until the step before ends). That happens for an unpinned tensor, and
also for a pinned one that is not dense (a slice with gaps, an expanded
view): ``Tensor.to`` then first copies it into a pageable temporary.
:class:`HostCheck` looks at every batch until it has warned about both
kinds, once each, naming the leaf.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from prefetch._shared.pinning import is_dense
from prefetch._shared.structure import iter_tensors
from prefetch._shared.user_frame import user_stacklevel

UNPINNED = "unpinned"
NOT_DENSE = "not dense"


def pageable_reason(tensor: torch.Tensor) -> str | None:
    """Why copying ``tensor`` to the device reads pageable memory, or ``None`` if it does not.

    Example:
        >>> pageable_reason(torch.zeros(2)), pageable_reason(torch.zeros(2, device="meta"))
        ('unpinned', None)
    """
    if tensor.device.type != "cpu":
        return None
    if not tensor.is_pinned():
        return UNPINNED
    return None if is_dense(tensor) else NOT_DENSE


def leaf_path(batch: Any, leaf: Any, prefix: str = "batch") -> str:
    """Return where ``leaf`` sits in ``batch``, e.g. ``batch['image']`` (``prefix`` if not found).

    Example:
        >>> x = torch.zeros(1)
        >>> leaf_path({"a": [0, x]}, x)
        "batch['a'][1]"
    """
    return _find(batch, leaf, prefix) or prefix


def _find(batch: Any, leaf: Any, path: str) -> str | None:
    if batch is leaf:
        return path
    children: list[tuple[str, Any]] = []
    if isinstance(batch, dict):
        children = [(f"{path}[{key!r}]", value) for key, value in batch.items()]
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):
        children = [(f"{path}.{name}", getattr(batch, name)) for name in batch._fields]
    elif isinstance(batch, list | tuple):
        children = [(f"{path}[{index}]", value) for index, value in enumerate(batch)]
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        children = [(f"{path}.{f.name}", getattr(batch, f.name)) for f in dataclasses.fields(batch)]
    for child_path, child in children:
        found = _find(child, leaf, child_path)
        if found is not None:
            return found
    return None


class HostCheck:
    """Warns once per kind (unpinned; pinned, not dense) about copies from pageable memory.

    Args:
        device: The device copies go to (for the message).
        advice: What to do about unpinned batches.
    """

    def __init__(self, device: torch.device, advice: str) -> None:
        self._device = device
        self._advice = advice
        self._pending = {UNPINNED, NOT_DENSE}  # kinds not warned about yet
        self._batches = 0

    @property
    def done(self) -> bool:
        """Whether both warnings were given (nothing left to look at)."""
        return not self._pending

    def check(self, host: Any) -> None:
        """Look at one batch's tensor leaves; warn about each kind's first occurrence."""
        self._batches += 1
        for tensor in iter_tensors(host):
            reason = pageable_reason(tensor)
            if reason is None or reason not in self._pending:
                continue
            self._pending.discard(reason)
            path = leaf_path(host, tensor)
            warnings.warn(self._message(reason, path, tensor), UserWarning, user_stacklevel())

    def _message(self, reason: str, path: str, tensor: torch.Tensor) -> str:
        where = f"batch {self._batches - 1}" + (f", leaf {path}," if path != "batch" else "")
        if reason == UNPINNED:
            return (
                f"CudaPrefetcher: {where} arrives in unpinned host memory, so its copy to "
                f"{self._device} cannot overlap compute: the CPU waits until the side stream "
                f"reaches the copy; {self._advice}"
            )
        return (
            f"CudaPrefetcher: {where} is pinned but not dense (shape {tuple(tensor.shape)}, "
            f"strides {tensor.stride()}: a slice or an expanded view), so torch first copies it "
            f"into a pageable temporary and its copy to {self._device} cannot overlap compute; "
            f"make it contiguous before it is pinned (BackgroundLoader(pin_memory=True) pins "
            f"a dense copy)"
        )
