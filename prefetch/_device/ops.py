"""Devices, streams, events and copies: the accelerator behind one small interface.

:func:`resolve_device` turns the user's ``device`` argument into a concrete
``torch.device`` once, on the caller's thread. :class:`DeviceOps` is every
accelerator call :class:`~prefetch.CudaPrefetcher` makes; tests replace it
with a recording fake through :func:`make_device_ops` to check the stream
protocol on a machine without a GPU.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from prefetch._device import streams
from prefetch._shared.structure import iter_leaves, iter_tensors, map_leaves


def resolve_device(device: object, owner: str = "CudaPrefetcher") -> torch.device:
    """Return the concrete device the prefetcher copies to.

    ``None`` means the current accelerator device (``cuda:<current>``) when
    one is available, else the CPU. A string, ``torch.device`` or int names a
    device explicitly; an unavailable accelerator or an index out of range is
    an error rather than a silent fallback.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None:
        if not torch.accelerator.is_available():
            return torch.device("cpu")
        accelerator = torch.accelerator.current_accelerator()
        assert accelerator is not None
        return torch.device(accelerator.type, torch.accelerator.current_device_index())
    if isinstance(device, bool) or not isinstance(device, str | int | torch.device):
        msg = (
            f"{owner}(device=...) expects None, a str, an int or a torch.device, "
            f"got {device!r} of type {type(device).__name__}"
        )
        raise TypeError(msg)
    if isinstance(device, int):
        if not torch.accelerator.is_available():
            msg = f"{owner}(device={device!r}): no accelerator is available on this machine"
            raise RuntimeError(msg)
        accelerator = torch.accelerator.current_accelerator()
        assert accelerator is not None
        device = torch.device(accelerator.type, device)
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as error:
        msg = f"{owner}(device=...) expects a device such as 'cuda:0' or 'cpu', got {device!r}"
        raise ValueError(msg) from error
    if resolved.type == "cpu":
        return resolved
    try:
        module = torch.get_device_module(resolved.type)
    except (RuntimeError, AttributeError) as error:
        msg = (
            f"{owner}(device={device!r}) expects an accelerator such as 'cuda:0', or 'cpu'; "
            f"torch has no device module for {resolved.type!r}"
        )
        raise ValueError(msg) from error
    if not module.is_available():
        msg = (
            f"{owner}(device={device!r}): {resolved.type} is not available on this machine; "
            f"pass device=None to copy to the accelerator when there is one and pass "
            f"batches through on the CPU otherwise"
        )
        raise RuntimeError(msg)
    count = int(module.device_count())
    index = resolved.index if resolved.index is not None else _current_index(resolved.type, module)
    if not 0 <= index < count:
        msg = (
            f"{owner}(device={device!r}): device index {index} is out of range; "
            f"this machine has {count} {resolved.type} device(s)"
        )
        raise ValueError(msg)
    return torch.device(resolved.type, index)


def _current_index(device_type: str, module: Any) -> int:
    """The current device index of ``device_type`` (MPS and others without one: 0)."""
    accelerator = (
        torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    )
    if accelerator is not None and accelerator.type == device_type:
        return int(torch.accelerator.current_device_index())
    current = getattr(module, "current_device", None)  # torch.mps has none
    return int(current()) if callable(current) else 0


def is_opaque_leaf(value: object) -> bool:
    """Whether ``value`` is moved by its own ``.to()``: tensors inside it are not visible."""
    if isinstance(value, torch.Tensor | type):
        return False
    return callable(getattr(value, "to", None))


def has_opaque_leaves(batch: Any) -> bool:
    """Whether any leaf of ``batch`` is an object with ``.to()`` (not a tensor).

    Example:
        >>> class Boxes:
        ...     def to(self, device, non_blocking=False):
        ...         return self
        >>> has_opaque_leaves({"x": torch.zeros(1)}), has_opaque_leaves([Boxes()])
        (False, True)
    """
    return any(is_opaque_leaf(leaf) for leaf in iter_leaves(batch))


_TAKES_NON_BLOCKING: dict[type, bool] = {}


def takes_non_blocking(value: object) -> bool:
    """Whether ``value.to`` accepts ``non_blocking=`` (its signature, read once per type).

    A ``.to()`` whose signature cannot be read (a C extension) is assumed to
    accept it, as ``Tensor.to`` does; a TypeError from it then reaches the
    user instead of running the move a second time.

    Example:
        >>> class Old:
        ...     def to(self, device):
        ...         return self
        >>> class New:
        ...     def to(self, device, **kwargs):
        ...         return self
        >>> takes_non_blocking(Old()), takes_non_blocking(New())
        (False, True)
    """
    kind = type(value)
    known = _TAKES_NON_BLOCKING.get(kind)
    if known is None:
        try:
            parameters = inspect.signature(value.to).parameters.values()  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            known = True
        else:
            known = any(
                p.name == "non_blocking" or p.kind is inspect.Parameter.VAR_KEYWORD
                for p in parameters
            )
        _TAKES_NON_BLOCKING[kind] = known
    return known


class DeviceOps:
    """Every accelerator call the prefetcher makes, for one device.

    Copies are ``non_blocking`` except on MPS, where a non-blocking copy is
    unsafe. Devices whose module has no ``Stream``/``Event`` (MPS) get
    ``has_streams = False``: copies then run on the current stream.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.module: Any = torch.get_device_module(device.type)
        self.non_blocking = device.type != "mps"
        self.has_streams = (
            device.type != "mps"
            and hasattr(self.module, "Stream")
            and hasattr(self.module, "Event")
        )

    def new_stream(self) -> Any:
        """Create a side stream on this device that no other code is handed.

        On CUDA it is a non-blocking stream made by the driver, outside
        torch's round-robin pool (see :mod:`prefetch._device.streams`); where
        that fails (ROCm, no driver library), and on other devices, the
        device module's ``Stream``.
        """
        if self.device.type == "cuda" and torch.version.hip is None:
            try:
                handle = streams.create_cuda_stream(self.device.index or 0)
            except streams.DriverError as error:
                _warn_pool_stream(error)
            else:
                return torch.cuda.ExternalStream(handle, device=self.device)  # type: ignore[no-untyped-call]
        return self.module.Stream(device=self.device)

    def current_stream(self) -> Any:
        """Return the calling thread's current stream on this device."""
        return self.module.current_stream(self.device)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Return a context in which ``stream`` is current."""
        return self.module.stream(stream)  # type: ignore[no-any-return]  # module is Any

    def new_event(self) -> Any:
        """Create an event (to be recorded on a stream)."""
        return self.module.Event()

    def record(self, tensor: torch.Tensor, stream: Any) -> None:
        """Tell the caching allocator that ``stream`` uses ``tensor``."""
        tensor.record_stream(stream)

    def copy(self, batch: Any) -> Any:
        """Return ``batch`` with every tensor (and ``.to()``-able leaf) on this device."""
        device, non_blocking = self.device, self.non_blocking

        def leaf(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.to(device, non_blocking=non_blocking)
            if is_opaque_leaf(value):
                if takes_non_blocking(value):
                    return value.to(device, non_blocking=non_blocking)
                return value.to(device)
            return value

        return map_leaves(leaf, batch)

    def tensors_on_device(self, batch: Any) -> Iterator[torch.Tensor]:
        """Yield the tensor leaves of ``batch`` that live on this device (this index)."""
        for tensor in iter_tensors(batch):
            if tensor.device == self.device:
                yield tensor


_warned_pool_stream = False


def _warn_pool_stream(error: Exception) -> None:
    global _warned_pool_stream  # once per process
    if _warned_pool_stream:
        return
    _warned_pool_stream = True
    warnings.warn(
        f"CudaPrefetcher: could not create a side stream of its own ({error}); it uses one of "
        f"torch's pool streams, which other code may be handed too",
        RuntimeWarning,
        stacklevel=4,
    )


def make_device_ops(device: torch.device) -> DeviceOps:
    """Return the :class:`DeviceOps` for ``device`` (the seam tests replace)."""
    return DeviceOps(device)
