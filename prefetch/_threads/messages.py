"""What the engine's threads post for the consumer, and the engine's figures.

A thread posts a :class:`Run`: items in source order, then at most one
:class:`Message` (an error, or the end). Runs are handed over in sequence
order (see the invariants of :mod:`prefetch._threads.engine`), so a producer
that is ahead hands over many items in one locked section and the consumer
takes them in one. :class:`Snapshot` is what the consumer and the policies
read of the engine, taken under its lock.
"""

from __future__ import annotations

from typing import Any, NamedTuple

ERROR, END, RAISED, STOPPED = 1, 2, 3, 4
"""Message kinds: an error that ends the epoch; the end; an error after which the source
goes on; and what :meth:`~prefetch._threads.engine.Engine.exchange` returns after a stop."""


class Message(NamedTuple):
    """What stands after a run's items: an error, the end, or the stop."""

    kind: int
    """``RAISED``, ``ERROR``, ``END`` or ``STOPPED``."""
    error: BaseException | None
    """The exception (``None`` for ``END`` and ``STOPPED``)."""
    state: Any
    """The source's checkpoint state read right after the draw (``None`` if not read)."""


class Run:
    """Items posted together, in source order, and what stands after them.

    Each item, and a ``RAISED`` error, holds one ticket and one sequence
    number; a final message (``END``, ``ERROR``) holds a number but no ticket.

    Attributes:
        items: The items.
        states: The source's checkpoint state after each item's draw, or
            ``None`` if the source is not stateful.
        sizes: Tensor bytes of each item, or ``None`` without a byte bound.
        end: The message after the items, or ``None``.
    """

    __slots__ = ("end", "items", "sizes", "states")

    def __init__(
        self,
        items: list[Any],
        states: list[Any] | None = None,
        sizes: list[int] | None = None,
        end: Message | None = None,
    ) -> None:
        self.items = items
        self.states = states
        self.sizes = sizes
        self.end = end

    @property
    def numbers(self) -> int:
        """Sequence numbers the run covers: its items, and its message if any."""
        return len(self.items) + (self.end is not None)


STOPPED_RUN = Run([], end=Message(STOPPED, None, None))
"""What :meth:`~prefetch._threads.engine.Engine.exchange` hands over once the engine stopped."""


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
    """Tickets taken and not returned: items drawn and not yet handed to the loop."""
    ready: int
    """Items and messages posted in order from the consumer's position, not taken yet."""
    posted: int
    """Items and messages posted (in order or not) and not taken yet."""
    waiting_threads: int
    """Threads blocked waiting for a ticket."""
    fetched: int
    """Items posted, in all."""
    max_bytes: int | None
    """Most tensor bytes in flight, or ``None`` for no byte bound."""
    buffered_bytes: int
    """Tensor bytes posted and not yet handed to the loop (counted only with a byte bound)."""
    largest_item: int
    """Bytes of the largest item seen (with earlier epochs' hint)."""
    busy_seconds: float
    """Seconds the threads spent drawing and running, summed over threads."""
    blocked_seconds: float
    """Seconds the threads spent blocked on a full buffer, summed over threads."""
    cpu_seconds: float
    """CPU seconds of the threads' draws and runs (only with ``measure_cpu``)."""
