"""``Normalize``: turn uint8 images into normalised floats on the device.

Copying images as uint8 moves a quarter of the bytes of float32; converting
and normalising after the copy, on the prefetcher's side stream, costs the
training step nothing.

One pass over the batch: ``addcmul(shift, x, scale, out=result)`` into a
result allocated in its final dtype and memory format. On a GPU the
conversion from uint8 (or float16) is done as the kernel loads ``x``, and
the rounding to a float16/bfloat16 result as it stores, in float32 in
between: the same values as converting, computing and rounding in three
passes, without the two extra round trips through memory (four with
``channels_last``). Only a float64 input to a float32 computation is
converted first (a 64-bit input to a float32 result; else the kernel would
compute in float64).

The coefficients are made on the device by fill kernels, once per device,
dtype and *stream*: built on one stream and read on another without an
ordering, they could be read before they are written, and their memory
belongs to the first stream's pool. One ``Normalize`` may serve several
prefetchers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from prefetch._shared.structure import get_item, replace_item


def _check_values(name: str, values: object) -> tuple[float, ...]:
    if isinstance(values, int | float):
        values = (values,)
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        msg = f"Normalize({name}=...) expects a non-empty sequence of numbers, got {values!r}"
        raise TypeError(msg)
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError):
        msg = f"Normalize({name}=...) expects numbers, got {values!r}"
        raise TypeError(msg) from None


def _filled(values: list[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A ``(C, 1, 1)`` tensor of ``values`` made on ``device`` without a host copy."""
    result = torch.empty((len(values), 1, 1), dtype=dtype, device=device)
    for index, value in enumerate(values):
        result[index].fill_(value)
    return result


def _stream_key(device: torch.device) -> Any:
    """The current stream on ``device`` as a cache key (``None`` on the CPU)."""
    if device.type == "cpu":
        return None
    current = getattr(torch.get_device_module(device.type), "current_stream", None)
    if current is None:  # a device without streams (MPS): one queue
        return None
    stream = current(device)
    return getattr(stream, "stream_id", stream)


class Normalize:
    """Convert one tensor of each batch to ``dtype`` and normalise it per channel.

    The selected tensor has channels at dimension ``-3`` (``(C, H, W)`` or
    ``(N, C, H, W)``). A ``uint8`` tensor is first scaled to ``[0, 1]`` (as
    torchvision's ``ToTensor`` does), so ``mean`` and ``std`` are the usual
    values, e.g. ImageNet's. The arithmetic runs in float32 (float64 for a
    float64 result) and is rounded to ``dtype`` once, at the end. Use it as
    :class:`~prefetch.CudaPrefetcher`'s ``transform`` so the work runs on the
    side stream, after the copy.

    Args:
        mean: Per-channel means (or one number for all channels).
        std: Per-channel standard deviations, none of them zero.
        key: What to normalise: an index into a tuple or list batch, a key of
            a dict batch, an attribute name, or ``None`` for a tensor batch.
        dtype: A floating result dtype.
        channels_last: Return 4-D (5-D) results in ``channels_last``
            (``channels_last_3d``) memory format.

    Example:
        >>> images = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
        >>> normalize = Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
        >>> out, labels = normalize((images, torch.tensor([0, 1])))
        >>> out.dtype, round(out.max().item(), 5), labels.tolist()
        (torch.float32, 1.0, [0, 1])
    """

    def __init__(
        self,
        mean: Sequence[float] | float,
        std: Sequence[float] | float,
        *,
        key: int | str | None = 0,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
    ) -> None:
        self.mean = _check_values("mean", mean)
        self.std = _check_values("std", std)
        if len(self.mean) != len(self.std):
            msg = (
                f"Normalize(mean=..., std=...) expects the same number of channels, "
                f"got {len(self.mean)} means and {len(self.std)} stds"
            )
            raise ValueError(msg)
        if any(s == 0 for s in self.std):
            msg = f"Normalize(std=...) must not contain zero, got {self.std!r}"
            raise ValueError(msg)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            msg = f"Normalize(dtype=...) expects a floating torch.dtype, got {dtype!r}"
            raise TypeError(msg)
        if key is not None and (isinstance(key, bool) or not isinstance(key, int | str)):
            msg = f"Normalize(key=...) expects an int, a str or None, got {key!r}"
            raise TypeError(msg)
        self.key = key
        self.dtype = dtype
        self.channels_last = bool(channels_last)
        self._cache: dict[
            tuple[torch.device, torch.dtype, bool, Any], tuple[torch.Tensor, torch.Tensor]
        ] = {}

    def _coefficients(
        self, tensor: torch.Tensor, compute: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = tensor.dtype == torch.uint8
        cache_key = (tensor.device, compute, scaled, _stream_key(tensor.device))
        cached = self._cache.get(cache_key)
        if cached is None:
            # Built on the device by fill kernels (queued on the current stream, the
            # side stream under CudaPrefetcher, and only read there): no blocking copy
            # from unpinned memory.
            # Python floats are float64, so the values equal a float64 computation.
            scale = [1.0 / (s * 255.0) if scaled else 1.0 / s for s in self.std]
            shift = [-m / s for m, s in zip(self.mean, self.std, strict=True)]
            cached = (
                _filled(scale, compute, tensor.device),
                _filled(shift, compute, tensor.device),
            )
            self._cache[cache_key] = cached
        return cached

    def normalize(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` converted and normalised (the batch-free core)."""
        if not isinstance(tensor, torch.Tensor):
            msg = f"Normalize expects a tensor at key {self.key!r}, got {type(tensor).__name__}"
            raise TypeError(msg)
        channels = len(self.mean)
        if tensor.dim() < 3 or (channels != 1 and tensor.shape[-3] != channels):
            noun = "channel" if channels == 1 else "channels"
            msg = (
                f"Normalize expects a tensor with {channels} {noun} at dimension -3, "
                f"got shape {tuple(tensor.shape)}"
            )
            raise ValueError(msg)
        compute = torch.float64 if self.dtype == torch.float64 else torch.float32
        result = self._result(tensor)
        scale, shift = self._coefficients(tensor, compute)
        if tensor.dtype.itemsize > compute.itemsize:
            tensor = tensor.to(compute)  # float64 into float32: the kernel would compute in float64
        return torch.addcmul(shift, tensor, scale, out=result)

    def _result(self, tensor: torch.Tensor) -> torch.Tensor:
        """The uninitialised result: ``tensor``'s shape in ``dtype`` and the memory format asked."""
        if not self.channels_last:
            return torch.empty_like(tensor, dtype=self.dtype)  # the input's layout, if dense
        formats = {4: torch.channels_last, 5: torch.channels_last_3d}
        if tensor.dim() not in formats:
            msg = f"Normalize(channels_last=True) needs a 4-D or 5-D tensor, got {tensor.dim()}-D"
            raise ValueError(msg)
        return torch.empty(
            tensor.shape,
            dtype=self.dtype,
            device=tensor.device,
            memory_format=formats[tensor.dim()],
        )

    def __call__(self, batch: Any) -> Any:
        """Return ``batch`` with the tensor at ``key`` normalised."""
        return replace_item(batch, self.key, self.normalize(self._select(batch)))

    def _select(self, batch: Any) -> Any:
        """Return the part of ``batch`` at ``key``; a missing key names what the batch has."""
        if self.key is not None and isinstance(batch, torch.Tensor):
            msg = (
                f"Normalize(key={self.key!r}) expects a batch with parts (a tuple, list, dict "
                f"or dataclass), got a single Tensor of shape {tuple(batch.shape)}; pass "
                f"key=None to normalise the whole tensor"
            )
            raise TypeError(msg)
        try:
            return get_item(batch, self.key)
        except (KeyError, IndexError, AttributeError, TypeError) as error:
            kind = type(batch).__name__
            if isinstance(batch, Mapping):
                has = f"the batch ({kind}) has keys {sorted(map(str, batch))}; pass one as key="
            elif isinstance(batch, list | tuple):
                has = f"the batch ({kind}) has {len(batch)} items"
            else:
                has = f"the batch ({kind}) has no key {self.key!r}"
            msg = f"Normalize(key={self.key!r}) found nothing to normalise: {has}"
            raise type(error)(msg) from None

    def __repr__(self) -> str:
        return (
            f"Normalize(mean={list(self.mean)}, std={list(self.std)}, key={self.key!r}, "
            f"dtype={self.dtype}, channels_last={self.channels_last})"
        )
