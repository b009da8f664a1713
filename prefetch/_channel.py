"""``Channel``: the state one producer thread and one consumer share.

The thread that fills it is in :mod:`prefetch._thread_worker`; the consumer
end is :mod:`prefetch._background_iterator`.

Invariants (every change here must keep them):

* **Tagged messages.** The producer appends ``(ITEM, item, state, nbytes)``,
  ``(RAISED, exception, None, 0)``, ``(ERROR, exception, None, 0)`` or
  ``(END, None, state, 0)`` to :attr:`Channel.messages`; ``None`` is an
  ordinary item. ``RAISED`` is an ``Exception`` the source raised and the
  epoch goes on (the source decides whether it has more); ``ERROR`` (a
  ``BaseException`` from the source, or our own failure) and ``END`` are
  final: after them it appends nothing more. ``END`` carries the source's
  state read after its ``StopIteration``.
* **Every message but the last takes a slot.** ``ITEM`` and ``RAISED`` each
  count one in ``produced``; the consumer releases the slot when it takes
  either.
* **Exact depth.** The producer counts a slot in ``produced`` *before* it
  calls ``next(source)`` and never takes a slot while ``produced - consumed
  >= depth``; the consumer counts ``consumed`` after it takes an item. So
  ``produced - consumed`` never exceeds the largest ``depth`` set during the
  epoch (a fixed depth: never exceeds ``depth``). ``depth`` is written by the
  consumer only (an adaptive policy); when it shrinks, items already taken
  stay and the producer waits until consumption brings the count under it.
* **Byte budget.** With ``max_bytes`` set, the producer takes a slot only if
  the tensor bytes produced and not consumed, plus the largest item seen so
  far, fit in ``max_bytes`` — or if nothing is outstanding (one item always
  flows, however large). So the bytes buffered stay within ``max_bytes``
  unless an item is larger than every item before it.
* **Single writers, no lost wake-ups.** Every counter has one writing thread,
  so under the GIL no lock is needed; wake-ups go through two ``SimpleQueue``
  token queues and every waiter re-checks its condition after announcing that
  it waits, so a wake-up is never lost (a stale token costs one re-check).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from queue import Empty, SimpleQueue
from typing import Any

from prefetch._stats import LoaderStats

ITEM, ERROR, END, RAISED = 0, 1, 2, 3
"""Message tags (see the module invariants)."""

POLL_SECONDS = 0.1
"""How often a blocked side re-checks that the other side is still there."""

Message = tuple[int, Any, Any, int]
"""``(tag, payload, checkpoint state, tensor bytes)``."""


class Channel:
    """State shared by one producer thread and one consumer; see the module invariants.

    Args:
        depth: Most items produced and not yet consumed (the consumer may change it).
        stats: The epoch's stats; the producer adds to ``source_seconds`` and
            raises ``peak_items`` / ``peak_bytes``.
        max_bytes: Most tensor bytes buffered, or ``None`` for no byte limit.
    """

    __slots__ = (
        "blocked_seconds",
        "busy_seconds",
        "consumed",
        "consumed_bytes",
        "consumer_waiting",
        "data_ready",
        "depth",
        "fetched",
        "in_source",
        "largest_item",
        "max_bytes",
        "messages",
        "produced",
        "produced_bytes",
        "producer_waiting",
        "source_ended",
        "space_ready",
        "stats",
        "stop",
    )

    def __init__(self, depth: int, stats: LoaderStats, max_bytes: int | None = None) -> None:
        self.depth = depth  # written by the consumer only
        self.max_bytes = max_bytes
        self.messages: deque[Message] = deque()
        self.produced = 0  # the counters below up to `in_source`: producer only
        self.produced_bytes = 0
        self.largest_item = 0
        self.fetched = 0
        self.busy_seconds = 0.0  # from taking a slot to posting the item, summed
        self.blocked_seconds = 0.0
        self.consumed = 0  # consumer only
        self.consumed_bytes = 0  # consumer only
        self.producer_waiting = False
        self.consumer_waiting = False
        self.in_source = False
        self.source_ended = False  # producer only: the source raised StopIteration
        self.stats = stats
        self.stop = threading.Event()
        self.data_ready: SimpleQueue[None] = SimpleQueue()
        self.space_ready: SimpleQueue[None] = SimpleQueue()

    def post(self, message: Message) -> None:
        """Append a message (producer side) and wake the consumer if it waits."""
        self.messages.append(message)
        if self.consumer_waiting:
            self.consumer_waiting = False  # one token per wait: the waiter re-arms
            self.data_ready.put(None)

    def post_item(self, item: Any, state: Any, nbytes: int, started: float) -> None:
        """Post an item (producer side) whose slot was taken at ``started``.

        Counts the item, its bytes, the producer's busy time and the peaks.
        """
        self.fetched += 1
        self.produced_bytes += nbytes
        if nbytes > self.largest_item:
            self.largest_item = nbytes
        self.post((ITEM, item, state, nbytes))
        self.busy_seconds += time.perf_counter() - started
        stats = self.stats
        outstanding = self.produced - self.consumed  # may lag the consumer: an upper bound
        if outstanding > stats.peak_items:
            stats.peak_items = outstanding
        buffered = self.produced_bytes - self.consumed_bytes
        if buffered > stats.peak_bytes:
            stats.peak_bytes = buffered

    def _full(self) -> bool:
        outstanding = self.produced - self.consumed
        if outstanding >= self.depth:
            return True
        limit = self.max_bytes
        return (
            limit is not None
            and outstanding > 0
            and self.produced_bytes - self.consumed_bytes + self.largest_item > limit
        )

    def wait_for_space(self) -> bool:
        """Block until a slot is free; return ``False`` if asked to stop instead."""
        if self.max_bytes is None and self.produced - self.consumed < self.depth:
            return not self.stop.is_set()  # the fixed-depth fast path: one comparison
        if self._full():
            started = time.perf_counter()
            try:
                while self._full():
                    self.producer_waiting = True
                    try:
                        if not self._full():
                            break
                        if self.stop.is_set():
                            return False
                        with contextlib.suppress(Empty):
                            self.space_ready.get(timeout=POLL_SECONDS)
                    finally:
                        self.producer_waiting = False
            finally:
                self.blocked_seconds += time.perf_counter() - started
        return not self.stop.is_set()

    def release_slot(self, nbytes: int) -> None:
        """Count one consumed item (consumer side) and wake the producer if it waits."""
        self.consumed += 1
        self.consumed_bytes += nbytes
        if self.producer_waiting:
            self.producer_waiting = False  # one token per wait: the waiter re-arms
            self.space_ready.put(None)

    def set_depth(self, depth: int) -> None:
        """Change the depth (consumer side) and wake the producer if it waits."""
        self.depth = depth
        if self.producer_waiting:
            self.producer_waiting = False
            self.space_ready.put(None)


def request_stop(channel: Channel) -> None:
    """Ask the producer to stop; safe from any thread, any number of times."""
    channel.stop.set()
    channel.space_ready.put(None)
