"""``StreamCopier``: the device side of :class:`~prefetch.CudaPrefetcher`, one batch at a time.

It runs on the training loop's thread. :meth:`StreamCopier.to_device`
starts a batch's copy and :meth:`StreamCopier.hand_over` makes the
consumer's stream ready for it; :class:`~prefetch._device.iterator.DeviceIterator`
calls nothing else.

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
from typing import Any, NamedTuple

import torch

from prefetch._device import ops as device_ops
from prefetch._device.ops import has_opaque_leaves
from prefetch._shared.structure import iter_tensors


class KeepAlive(NamedTuple):
    """A batch's event, with the inputs that must stay referenced until its hand-over."""

    event: Any
    inputs: Any


class StreamCopier:
    """Copies batches to one device on one side stream; see the module's protocol.

    Args:
        device: The resolved target device (the CPU: pass through).
        transform: Applied to each batch after the copy, on the side stream.
        lifetime: ``"fence"`` or ``"record_stream"``.
        unpinned_advice: What the unpinned-memory warning tells the user to do.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        transform: Any,
        lifetime: str,
        unpinned_advice: str,
    ) -> None:
        self.device = device
        self._transform = transform
        self._lifetime = lifetime
        self._advice = unpinned_advice
        self._ops: device_ops.DeviceOps | None = None  # None on the CPU
        if device.type != "cpu":
            self._ops = device_ops.make_device_ops(device)
        self.stream: Any = None  # created at the first epoch, then reused
        self._pinning_checked = False
        self._always_fence = lifetime == "fence"  # record_stream switches on opaque leaves

    def start_epoch(self) -> None:
        """Create the side stream once, before the first copy."""
        ops = self._ops
        if ops is not None and ops.has_streams and self.stream is None:
            self.stream = ops.new_stream()

    def to_device(self, host: Any) -> tuple[Any, Any]:
        """Start the copy (and transform) of one batch; return it with its event.

        The event is ``None`` where there is nothing to wait for (the CPU, or
        a device without streams, whose copies are blocking).
        """
        transform, ops = self._transform, self._ops
        if ops is None:  # the CPU: pass through
            return (transform(host) if transform is not None else host), None
        if not ops.has_streams:  # an accelerator without streams (MPS): blocking copies
            batch = ops.copy(host)
            return (transform(batch) if transform is not None else batch), None
        stream = self.stream
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

    def hand_over(self, batch: Any, event: Any) -> None:
        """Make the consumer's current stream ready to use ``batch`` (consumer thread)."""
        if event is None or self._ops is None:
            return
        if isinstance(event, KeepAlive):
            event = event.event  # the inputs it held are released once the consumer waits
        consumer = self._ops.current_stream()
        self._consumer_wait(consumer, event)
        if self._lifetime == "record_stream":
            self._record_leaves(consumer, batch)

    def _keep_inputs_alive(
        self, ops: device_ops.DeviceOps, stream: Any, resident: list[Any]
    ) -> None:
        """Record device-resident inputs on the side stream, which reads them in ``transform``."""
        for tensor in resident:
            ops.record(tensor, stream)

    def _fence(self, ops: device_ops.DeviceOps, stream: Any) -> None:
        """Make the side stream wait for all work queued so far on the consumer stream."""
        stream.wait_stream(ops.current_stream())

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
        warnings.warn(
            f"CudaPrefetcher: batches arrive in unpinned host memory, so copies to "
            f"{self.device} cannot overlap compute; {self._advice}",
            UserWarning,
            stacklevel=5,
        )
