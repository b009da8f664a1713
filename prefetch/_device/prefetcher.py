"""``CudaPrefetcher``: copy the next batches to the GPU on a side stream.

This module holds the loader: its arguments and what each epoch runs.
Opening and stopping epochs is :class:`~prefetch._shared.wrapper.LoaderWrapper`'s.
The stream protocol (fences, events, memory lifetime) is
:mod:`prefetch._device.copier`; one epoch is :mod:`prefetch._device.iterator`.
``depth`` batches stay in flight. On the CPU (no accelerator) batches pass
through, with ``transform`` applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch

from prefetch._device import ops as device_ops
from prefetch._device.copier import StreamCopier
from prefetch._device.iterator import DeviceIterator
from prefetch._shared.arguments import check_depth, check_iterable
from prefetch._shared.checkpointing import adopt_state
from prefetch._shared.epoch import Opener
from prefetch._shared.wrapper import LoaderWrapper, short_repr
from prefetch._threads.keywords import Below, explain_keywords, keywords_of
from prefetch._threads.loader import BackgroundLoader

T = TypeVar("T")
Lifetime = Literal["fence", "record_stream"]
LIFETIMES = ("fence", "record_stream")


class CudaPrefetcher(LoaderWrapper, Generic[T]):
    """Copy the next batches to the GPU on a side stream while this one computes.

    Stack it on any iterable, typically
    ``CudaPrefetcher(BackgroundLoader(loader, pin_memory=True))``. Batches keep
    their structure (dicts, lists, tuples, named tuples, dataclasses, objects
    with ``.to()``); every tensor leaf arrives on ``device``, ready to use on
    your current stream. One side stream is created per prefetcher and reused
    every epoch, so memory stays flat. ``len``, ``set_epoch`` and attributes
    such as ``dataset`` pass through. Errors, several iterators and
    checkpoints behave as for :class:`~prefetch.BackgroundLoader`: an
    exception from the loader arrives at its batch and the epoch goes on as
    far as the loader does.

    Without an accelerator (``device=None`` on a CPU machine, or
    ``device="cpu"``) batches pass through unchanged except for
    ``transform``: the same script runs on a laptop and in CI.

    Args:
        loader: Any iterable of batches.
        device: ``None`` for the current accelerator device (or the CPU
            without one), else a device such as ``"cuda:1"``.
        depth: Batches kept in flight on the device (>= 1).
        transform: Applied to each batch on the side stream after the copy,
            e.g. :class:`~prefetch.Normalize`.
        lifetime: ``"fence"`` (the side stream waits for your stream before
            each copy) or ``"record_stream"`` (each tensor leaf is recorded on
            your stream). Both stop the allocator from recycling memory your
            kernels still read. ``fence`` keeps ``depth + 2`` batches on the
            device. With ``record_stream`` freed memory returns only once the
            GPU has passed the free, so the prefetcher keeps the CPU at most
            ``depth + 1`` batches ahead of the GPU (it waits for the GPU
            before the next copy when it gets further): up to
            ``2 * depth + 3`` batches on the device. ``record_stream`` cannot
            see the tensors inside an object with ``.to()``: from the first
            batch holding one, the prefetcher fences as well.

    Iterate it on your training loop's thread (the one that called
    ``iter()``; another thread's ``next()`` raises), and use each batch on
    the stream that was current at its ``next()``. See the guide's
    "Contracts of CudaPrefetcher" for what else gives a wrong result.

    Example:
        >>> batches = [{"x": torch.ones(2), "id": i} for i in range(3)]
        >>> prefetcher = CudaPrefetcher(batches, device="cpu")
        >>> [batch["id"] for batch in prefetcher]
        [0, 1, 2]
        >>> len(prefetcher), prefetcher.device
        (3, device(type='cpu'))
    """

    _runs_on_consumer_thread: ClassVar[bool] = True  # BackgroundLoader refuses to wrap it

    @explain_keywords("CudaPrefetcher", Below("BackgroundLoader", keywords_of(BackgroundLoader)))
    def __init__(
        self,
        loader: Iterable[T],
        device: str | int | torch.device | None = None,
        *,
        depth: int = 1,
        transform: Callable[[Any], Any] | None = None,
        lifetime: Lifetime = "fence",
    ) -> None:
        check_iterable(loader, "CudaPrefetcher")
        self._depth = check_depth(depth, "CudaPrefetcher")
        if transform is not None and not callable(transform):
            msg = f"CudaPrefetcher(transform=...) expects a callable or None, got {transform!r}"
            raise TypeError(msg)
        if lifetime not in LIFETIMES:
            msg = (
                f"CudaPrefetcher(lifetime=...) expects 'fence' or 'record_stream', got {lifetime!r}"
            )
            raise ValueError(msg)
        super().__init__(loader)
        self._transform = transform
        self._lifetime = lifetime
        self._device = device_ops.resolve_device(device)
        if isinstance(loader, BackgroundLoader):
            advice = "pass pin_memory=True to the BackgroundLoader it wraps"
        else:
            advice = "wrap the loader as BackgroundLoader(loader, pin_memory=True)"
        self._copier = StreamCopier(
            self._device,
            transform=transform,
            lifetime=lifetime,
            unpinned_advice=advice,
            depth=self._depth,
        )
        if self._device.type != "cpu" and isinstance(loader, LoaderWrapper):
            loader._copied_to(self._device)  # its thread pins for this device, not the caller's
        adopt_state(self)

    @property
    def device(self) -> torch.device:
        """The device batches are copied to."""
        return self._device

    @property
    def stream(self) -> Any:
        """The side stream (created at the first epoch; ``None`` on the CPU path)."""
        return self._copier.stream

    @property
    def depth(self) -> int:
        """Batches kept in flight behind the one handed over."""
        return self._depth

    def _idle_epoch(self, opener: Opener) -> DeviceIterator[T]:
        self._copier.start_epoch()  # the side stream exists from iter() on (nothing is copied)
        return DeviceIterator(opener, copier=self._copier, depth=self._depth)

    def __repr__(self) -> str:
        return f"CudaPrefetcher({short_repr(self._loader)}, device={str(self._device)!r})"
