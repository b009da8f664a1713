"""``CudaPrefetcher``: copy the next batches to the GPU on a side stream.

The stream protocol, for each batch ``k`` (all on the consumer's thread):

1. *fence* lifetime: the side stream waits for the consumer stream, so a
   block the consumer freed is not rewritten while its kernels still read it;
2. on the side stream: ``non_blocking`` copies, then ``transform``, then
   ``event[k].record()``;
3. at hand-off the consumer's current stream waits for ``event[k]`` only
   (not for the whole side stream, which may already copy ``k + 1``); in
   *record_stream* lifetime every tensor leaf is recorded on the consumer
   stream.

Two cases the plain protocol does not cover, and what covers them:

* *record_stream* cannot see the tensors inside an object with ``.to()``
  (an opaque leaf), so it cannot record them. The first batch holding such a
  leaf switches the prefetcher to fencing (step 1) for that batch and every
  later one: a fence protects all memory allocated on the side stream.
* Inputs already on the device, read by ``transform`` on the side stream,
  were written on the consumer stream and belong to its memory pool. Before
  such a batch the side stream waits for the consumer stream (in both
  lifetimes), and each such input is recorded on the side stream, so the
  allocator does not give its memory back to the consumer before the
  transform has read it. Opaque inputs (which may be on the device too) are
  also kept referenced until their batch is handed over, after which every
  reuse on the consumer stream is ordered after the transform.

``depth`` batches stay in flight. On the CPU (no accelerator) none of this
runs: batches pass through, with ``transform`` applied.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Literal, NamedTuple, TypeVar

import torch

from prefetch import _device_ops as device_ops
from prefetch._arguments import check_depth, check_iterable
from prefetch._background import BackgroundLoader
from prefetch._checkpointing import adopt_state, read_start_state
from prefetch._device_iterator import DeviceIterator
from prefetch._device_ops import has_opaque_leaves
from prefetch._stateful import read_state
from prefetch._stats import EpochRecord
from prefetch._structure import iter_tensors
from prefetch._wrapper import (
    LoaderWrapper,
    one_iterator_reason,
    short_repr,
    warn_consumed,
)

T = TypeVar("T")
Lifetime = Literal["fence", "record_stream"]
LIFETIMES = ("fence", "record_stream")


class KeepAlive(NamedTuple):
    """A batch's event, with the inputs that must stay referenced until its hand-over."""

    event: Any
    inputs: Any


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
            kernels still read. ``record_stream`` cannot see the tensors
            inside an object with ``.to()``: from the first batch holding
            one, the prefetcher fences instead.

    Example:
        >>> batches = [{"x": torch.ones(2), "id": i} for i in range(3)]
        >>> prefetcher = CudaPrefetcher(batches, device="cpu")
        >>> [batch["id"] for batch in prefetcher]
        [0, 1, 2]
        >>> len(prefetcher), prefetcher.device
        (3, device(type='cpu'))
    """

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
        self._loader = loader
        self._transform = transform
        self._lifetime = lifetime
        self._device = device_ops.resolve_device(device)
        self._ops: device_ops.DeviceOps | None = None  # None on the CPU
        if self._device.type != "cpu":
            self._ops = device_ops.make_device_ops(self._device)
        self._stream: Any = None
        self._pinning_checked = False
        self._always_fence = lifetime == "fence"  # record_stream switches on opaque leaves
        if self._device.type != "cpu" and isinstance(loader, BackgroundLoader):
            loader._pin_for(self._device)  # its thread pins for this device, not the caller's
        self._stateful = adopt_state(self)
        self._epoch = None
        self._live: list[weakref.ref[DeviceIterator[T]]] = []  # epochs that may be open
        self._source_ended = False  # set by an epoch whose source raised StopIteration
        self._warned = False

    @property
    def device(self) -> torch.device:
        """The device batches are copied to."""
        return self._device

    @property
    def stream(self) -> Any:
        """The side stream (created at the first epoch; ``None`` on the CPU path)."""
        return self._stream

    @property
    def depth(self) -> int:
        """Batches kept in flight behind the one handed over."""
        return self._depth

    def __iter__(self) -> DeviceIterator[T]:
        self._check_sharding()
        reason = one_iterator_reason(self._loader)
        if reason is not None:
            why = f"a newer iter() of this CudaPrefetcher stopped it: {reason}"
            self._stop_epoch(wait=True, reason=why)
            if self._source_ended and isinstance(self._loader, Iterator) and not self._warned:
                self._warned = True
                warn_consumed(type(self).__name__, self._loader)
        else:
            self._live = [ref for ref in self._live if ref() is not None]
        source = iter(self._loader)
        if self._ops is not None and self._ops.has_streams and self._stream is None:
            self._stream = self._ops.new_stream()
        self._epoch = EpochRecord(read_start_state(self))
        iterator: DeviceIterator[T] = DeviceIterator(
            self, source, self._epoch, owned=source is not self._loader
        )
        self._live.append(weakref.ref(iterator))
        return iterator

    def _read_state(self) -> Any:
        return read_state(self._loader) if self._stateful else None

    def _to_device(self, host: Any) -> tuple[Any, Any]:
        """Start the copy (and transform) of one batch; return it with its event."""
        transform, ops = self._transform, self._ops
        if ops is None:  # the CPU: pass through
            return (transform(host) if transform is not None else host), None
        if not ops.has_streams:  # an accelerator without streams (MPS): blocking copies
            batch = ops.copy(host)
            return (transform(batch) if transform is not None else batch), None
        stream = self._stream
        if not self._pinning_checked:  # the first batch tells; keep the per-batch path lean
            self._pinning_checked = True
            self._warn_if_unpinned(host)
        resident = list(ops.tensors_on_device(host)) if transform is not None else []
        opaque = (transform is not None or not self._always_fence) and has_opaque_leaves(host)
        if opaque and not self._always_fence:
            self._always_fence = True  # record_stream cannot see inside .to() objects
        if self._always_fence or resident or (opaque and transform is not None):
            self._fence(ops, stream)  # also orders reads of device-resident inputs
        with ops.use_stream(stream):
            batch = ops.copy(host)
            if transform is not None:
                batch = transform(batch)
            event = ops.new_event()
            event.record(stream)
        self._keep_inputs_alive(ops, stream, resident)
        if opaque and transform is not None:
            return batch, KeepAlive(event, host)  # opaque inputs may live on the device
        return batch, event

    def _keep_inputs_alive(
        self, ops: device_ops.DeviceOps, stream: Any, resident: list[Any]
    ) -> None:
        """Record device-resident inputs on the side stream, which reads them in ``transform``."""
        for tensor in resident:
            ops.record(tensor, stream)

    def _fence(self, ops: device_ops.DeviceOps, stream: Any) -> None:
        """Make the side stream wait for all work queued so far on the consumer stream."""
        stream.wait_stream(ops.current_stream())

    def _hand_over(self, batch: Any, event: Any) -> None:
        """Make the consumer's current stream ready to use ``batch`` (consumer thread)."""
        assert self._ops is not None
        if isinstance(event, KeepAlive):
            event = event.event  # the inputs it held are released once the consumer waits
        consumer = self._ops.current_stream()
        self._consumer_wait(consumer, event)
        if self._lifetime == "record_stream":
            self._record_leaves(consumer, batch)

    def _consumer_wait(self, consumer: Any, event: Any) -> None:
        """Queue, on the consumer stream, a wait for this batch's copy event only."""
        consumer.wait_event(event)

    def _record_leaves(self, consumer: Any, batch: Any) -> None:
        """Record every device tensor leaf of ``batch`` as used by ``consumer``."""
        assert self._ops is not None
        for tensor in self._ops.tensors_on_device(batch):
            self._ops.record(tensor, consumer)

    def _warn_if_unpinned(self, host: Any) -> None:
        if not any(t.device.type == "cpu" and not t.is_pinned() for t in iter_tensors(host)):
            return
        if isinstance(self._loader, BackgroundLoader):
            advice = "pass pin_memory=True to the BackgroundLoader it wraps"
        else:
            advice = "wrap the loader as BackgroundLoader(loader, pin_memory=True)"
        warnings.warn(
            f"CudaPrefetcher: batches arrive in unpinned host memory, so copies to "
            f"{self._device} cannot overlap compute; {advice}",
            UserWarning,
            stacklevel=4,
        )

    def _stop_epoch(self, wait: bool, reason: str | None = None) -> None:
        # No thread of its own: dropping the batches in flight and closing the
        # source is immediate. A wrapped BackgroundLoader waits for its thread
        # itself, in its own load_state_dict() or iter().
        live, self._live = self._live, []
        for ref in live:
            current = ref()
            if current is not None:
                current.invalidate(reason) if reason is not None else current.close()

    def __repr__(self) -> str:
        return f"CudaPrefetcher({short_repr(self._loader)}, device={str(self._device)!r})"
