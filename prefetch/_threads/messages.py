"""What the engine's threads post for the consumer, and the engine's figures.

:class:`Message` is one posting, handed over in sequence order (see the
invariants of :mod:`prefetch._threads.engine`); :class:`Snapshot` is what the
consumer and the policies read of the engine, taken under its lock.
"""

from __future__ import annotations

from typing import Any, NamedTuple

ITEM, ERROR, END, RAISED, STOPPED = 0, 1, 2, 3, 4
"""Message kinds: an item; an error that ends the epoch; the end; an error after which the
source goes on; and what :meth:`~prefetch._threads.engine.Engine.take` returns after a stop."""


class Message(NamedTuple):
    """What the threads post for the consumer, handed over in sequence order."""

    kind: int
    """``ITEM``, ``RAISED``, ``ERROR``, ``END`` or ``STOPPED``."""
    payload: Any
    """The item, or the exception (``None`` for ``END`` and ``STOPPED``)."""
    state: Any
    """The source's checkpoint state read right after the draw (``None`` if not read)."""
    nbytes: int = 0
    """Tensor bytes of an item (0 unless a byte bound applies)."""


class Final(NamedTuple):
    """A final message (``END`` or ``ERROR``) and the sequence number it is posted at."""

    seq: int
    message: Message


class Snapshot(NamedTuple):
    """The engine's figures, read together under its lock (:meth:`Engine.snapshot`)."""

    depth: int
    """Items ready ahead of the consumer, at most."""
    threads: int
    """Threads wanted (those running may still be leaving)."""
    in_flight: int
    """Tickets taken and not returned: items drawn and not taken by the consumer."""
    ready: int
    """Messages posted and not taken."""
    waiting_threads: int
    """Threads blocked waiting for a ticket."""
    fetched: int
    """Items posted, in all."""
    max_bytes: int | None
    """Most tensor bytes in flight, or ``None`` for no byte bound."""
    buffered_bytes: int
    """Tensor bytes posted and not taken (counted only with a byte bound)."""
    largest_item: int
    """Bytes of the largest item seen (with earlier epochs' hint)."""
    busy_seconds: float
    """Seconds the threads spent drawing and running, summed over threads."""
    blocked_seconds: float
    """Seconds the threads spent blocked on a full buffer, summed over threads."""
    cpu_seconds: float
    """CPU seconds of the threads' draws and runs (only with ``measure_cpu``)."""
