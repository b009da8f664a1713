"""What the engine's threads post for the consumer, and the engine's figures.

A thread posts a :class:`Run`: items in source order, then at most one
:class:`Message` (an error, or the end). Runs are handed over in sequence
order (see the invariants of :mod:`prefetch._threads.engine`), so a producer
that is ahead hands over many items in one locked section and the consumer
takes them in one. :func:`message_for` is the one place that turns what a
thread caught into what the loop receives. :class:`Snapshot` is what the
consumer and the policies read of the engine, taken under its lock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, NamedTuple


class Kind(enum.Enum):
    """What the loop gets for a message: each name says it."""

    RAISE_AND_GO_ON = "raise, and the epoch goes on"
    """The source's ``Exception``, in its place; the next ``next()`` asks the source again."""
    RAISE_AND_END = "raise, and the epoch is over"
    """A ``BaseException``, or an error the source cannot go on after (a lost worker)."""
    END = "StopIteration"
    """The source ended; the message carries its state read just after."""
    STOPPED = "StopIteration, stopped"
    """The engine was stopped (``close()`` from another thread while the loop waited)."""

    @property
    def final(self) -> bool:
        """Whether a thread posting it ends the epoch (``END``, ``RAISE_AND_END``)."""
        return self is Kind.END or self is Kind.RAISE_AND_END


class Message(NamedTuple):
    """What stands after a run's items: an error, the end, or the stop."""

    kind: Kind
    """What the loop gets."""
    error: BaseException | None
    """The exception (``None`` for ``END`` and ``STOPPED``)."""
    state: Any
    """The source's checkpoint state read right after the draw (``None`` if not read)."""


def message_for(
    error: BaseException,
    *,
    drawing: bool,
    state: Any = None,
    read_state: Callable[[], Any] | None = None,
    broken: Callable[[], bool] | None = None,
) -> Message:
    """Return what the loop receives for ``error``, caught by a thread (the one place).

    Args:
        error: What the thread caught.
        drawing: Whether it came out of the draw (the source's ``next()``),
            where ``StopIteration`` is the end; after the draw (preparing,
            reading, collating) it is an error like any other.
        state: The state the draw moved the source to (an error after the draw).
        read_state: Reads the source's state after the end, or ``None``.
        broken: Whether the source cannot be drawn again after an ``Exception``
            (a DataLoader that lost a worker process), or ``None``: it can.

    Example:
        >>> message_for(StopIteration(), drawing=True).kind
        <Kind.END: 'StopIteration'>
        >>> message_for(ValueError("bad"), drawing=False, state=3)[::2]
        (<Kind.RAISE_AND_GO_ON: 'raise, and the epoch goes on'>, 3)
        >>> message_for(KeyboardInterrupt(), drawing=True).kind.final
        True
    """
    if drawing and isinstance(error, StopIteration):
        return Message(Kind.END, None, read_state() if read_state is not None else None)
    if isinstance(error, Exception) and (broken is None or not broken()):
        return Message(Kind.RAISE_AND_GO_ON, error, state)
    return Message(Kind.RAISE_AND_END, error, None)


class Run:
    """Items posted together, in source order, and what stands after them.

    Each item, and a ``RAISE_AND_GO_ON`` error, holds one ticket and one
    sequence number; a final message holds a number but no ticket.

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

    @property
    def final(self) -> bool:
        """Whether the run ends the epoch (its message is final)."""
        return self.end is not None and self.end.kind.final


STOPPED_RUN = Run([], end=Message(Kind.STOPPED, None, None))
"""What :meth:`~prefetch._threads.consumer_side.ConsumerSide.exchange` gives once stopped."""


class Final(NamedTuple):
    """A final message and the sequence number it is posted at."""

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
    free: int
    """Tickets a thread may take now (the depth, the byte budget and the end's gate allowing)."""
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
    reads: int
    """Units the threads read, in all (threads that read a DataLoader's samples)."""
