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

* *fence* lifetime protects memory freed on the consumer stream only
  against allocations that fence: the side stream is one of our own (see
  :mod:`prefetch._device.streams`), never handed to other code, and a
  recycled one keeps fencing every consumer stream its owners fenced.
* *record_stream* does not hold the CPU back, and memory the consumer
  freed stays unusable until the GPU passes the free: with no sync in the
  loop the CPU would run ahead, and device memory grow, up to an epoch. An
  event recorded on the consumer stream at each hand-over keeps the CPU at
  most ``depth + 1`` hand-overs ahead of the GPU (it waits on the oldest
  before the next copy): at most ``2 * depth + 3`` batches on the device,
  against ``depth + 2`` with fencing.
* A transform that raises (or an interrupt during it) may have queued reads
  of its inputs: device-resident ones are recorded on the side stream in a
  ``finally``, and the consumer stream waits for what was queued before
  opaque inputs are let go. A batch in flight that is dropped instead of
  handed over (the epoch closed, the iterator collected) lets its opaque
  inputs go only after the consumer stream that produced them waits for its
  event (:class:`KeepAlive`).

``depth`` batches stay in flight. On the CPU (no accelerator) none of this
runs: batches pass through, with ``transform`` applied.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from typing import Any

import torch

from prefetch._device import ops as device_ops
from prefetch._device import streams
from prefetch._device.host import HostCheck
from prefetch._device.ops import has_opaque_leaves


class KeepAlive:
    """A batch's event, with inputs that stay referenced until the consumer stream waits for it.

    The inputs (objects with ``.to()``, maybe on the device) were written on
    ``consumer`` and are read by the transform on the side stream. Once
    ``consumer`` waits for ``event``, every reuse of their memory there
    comes after the transform. The hand-over does that wait; a batch dropped
    before its hand-over does it when this object is let go.
    """

    def __init__(self, event: Any, inputs: Any, consumer: Any) -> None:
        self.event = event
        self.inputs = inputs
        self.consumer = consumer
        self.waited = False

    def order_consumer(self) -> None:
        """Queue, on the consumer stream, a wait for the event (once)."""
        if not self.waited:
            self.waited = True
            self.consumer.wait_event(self.event)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the device may be gone
            self.order_consumer()


class StreamCopier:
    """Copies batches to one device on one side stream; see the module's protocol.

    Args:
        device: The resolved target device (the CPU: pass through).
        transform: Applied to each batch after the copy, on the side stream.
        lifetime: ``"fence"`` or ``"record_stream"``.
        unpinned_advice: What the unpinned-memory warning tells the user to do.
        depth: Batches in flight behind the one handed over (bounds the
            CPU's run-ahead in *record_stream* lifetime).
    """

    def __init__(
        self,
        device: torch.device,
        *,
        transform: Any,
        lifetime: str,
        unpinned_advice: str,
        depth: int = 1,
    ) -> None:
        self.device = device
        self._transform = transform
        self._lifetime = lifetime
        self._ops: device_ops.DeviceOps | None = None  # None on the CPU
        if device.type != "cpu":
            self._ops = device_ops.make_device_ops(device)
        self._side: streams.SideStream | None = None  # taken at the first epoch, then kept
        self._host_check = HostCheck(device, unpinned_advice)
        self._always_fence = lifetime == "fence"  # record_stream switches on opaque leaves
        self._ahead = depth + 1  # record_stream: hand-overs the CPU may run ahead of the GPU
        self._progress: deque[Any] = deque()  # one consumer-stream event per hand-over

    @property
    def stream(self) -> Any:
        """The side stream (``None`` before the first epoch and on the CPU)."""
        return self._side.stream if self._side is not None else None

    def start_epoch(self) -> None:
        """Take a side stream once, before the first copy; it goes back when this is collected."""
        ops = self._ops
        if ops is not None and ops.has_streams and self._side is None:
            registry = streams.REGISTRY
            self._side, key = registry.acquire(ops, fences=self._always_fence)
            weakref.finalize(self, registry.release, self._side, key).atexit = False

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
        if not self._host_check.done:
            self._host_check.check(host)
        resident = list(ops.tensors_on_device(host)) if transform is not None else []
        opaque = (transform is not None or not self._always_fence) and has_opaque_leaves(host)
        if opaque and not self._always_fence:
            self._always_fence = True  # record_stream cannot see inside .to() objects
        if self._always_fence or resident or (opaque and transform is not None):
            self._fence(ops, stream)  # also orders reads of device-resident inputs
        if self._lifetime == "record_stream":
            self._bound_run_ahead()  # recorded leaves free only once the GPU passes
        consumer = ops.current_stream()
        finished = False
        try:
            with ops.use_stream(stream):
                batch = ops.copy(host)
                if transform is not None:
                    batch = transform(batch)
                event = ops.new_event()
                event.record(stream)
            finished = True
        finally:  # also when the transform raised: it may have queued reads of its inputs
            self._keep_inputs_alive(ops, stream, resident)
            if not finished and opaque and transform is not None:
                queued = ops.new_event()
                queued.record(stream)
                KeepAlive(queued, host, consumer).order_consumer()
        if opaque and transform is not None:
            return batch, KeepAlive(event, host, consumer)  # opaque inputs may live on the device
        return batch, event

    def hand_over(self, batch: Any, event: Any) -> None:
        """Make the consumer's current stream ready to use ``batch`` (consumer thread)."""
        if event is None or self._ops is None:
            return
        consumer = self._ops.current_stream()
        if isinstance(event, KeepAlive):
            keep, event = event, event.event
            keep.waited = keep.consumer == consumer  # else it orders its own stream when let go
        if self._lifetime == "record_stream":
            progress = self._ops.new_event()
            progress.record(consumer)  # passed once the steps before this batch are done
            self._progress.append(progress)
        self._consumer_wait(consumer, event)
        if self._lifetime == "record_stream":
            self._record_leaves(consumer, batch)

    def _bound_run_ahead(self) -> None:
        """*record_stream*: wait until the GPU is at most ``depth + 1`` hand-overs behind."""
        while len(self._progress) > self._ahead:
            self._progress.popleft().synchronize()

    def _keep_inputs_alive(
        self, ops: device_ops.DeviceOps, stream: Any, resident: list[Any]
    ) -> None:
        """Record device-resident inputs on the side stream, which reads them in ``transform``."""
        for tensor in resident:
            ops.record(tensor, stream)

    def _fence(self, ops: device_ops.DeviceOps, stream: Any) -> None:
        """Make the side stream wait for all work queued so far on the consumer stream.

        In a fencing lifetime, also on every consumer stream that read memory
        of this side stream before (an earlier epoch's, or an earlier owner's).
        """
        consumer = ops.current_stream()
        side = self._side
        readers = side.fence_targets(consumer) if self._always_fence and side else [consumer]
        for reader in readers:
            stream.wait_stream(reader)

    def _consumer_wait(self, consumer: Any, event: Any) -> None:
        """Queue, on the consumer stream, a wait for this batch's copy event only."""
        consumer.wait_event(event)

    def _record_leaves(self, consumer: Any, batch: Any) -> None:
        """Record every device tensor leaf of ``batch`` as used by ``consumer``."""
        assert self._ops is not None
        for tensor in self._ops.tensors_on_device(batch):
            self._ops.record(tensor, consumer)
