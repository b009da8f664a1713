"""``Tickets``: what an engine has in flight, and how much more it may take.

A thread takes a ticket for each draw; the item (or error) it draws holds
the ticket until the consumer hands it to the loop and gives it back. The
bound (see the invariants of :mod:`prefetch._threads.engine`): never more
than ``depth + threads - 1`` tickets out (exactly ``depth`` for one thread),
and, with ``max_bytes``, never more than the bytes posted and not handed over
plus the largest item seen for each ticket a thread holds and for the new
one, unless nothing is in flight (one item always flows).

The end-finding draw waits for the loop. For a sized source (``expected``:
its length), no ticket is given for a draw past the ``expected``-th until the
*gate* opens: when the consumer, having handed every item to the loop, asks
for more. A plain loop makes that ``next()`` there (and a framework that stops
at ``len(loader)`` never makes it), so its side effects (a sampler's last
random draw, a one-shot source giving up an item) happen at the same step.

Invariant: a :class:`Tickets` is plain data of its engine, read and written
only while the engine's lock is held; it takes no lock and wakes nobody.
:class:`Held` is one thread's share, read and written by that thread and,
under the lock, by the engine.
"""

from __future__ import annotations


class Held:
    """Tickets one thread holds that no posted run holds (given back when it leaves)."""

    __slots__ = ("tickets",)

    def __init__(self) -> None:
        self.tickets = 0


class Tickets:
    """An engine's tickets and its bound (under the engine's lock; see the module).

    Args:
        depth: Items ready ahead of the consumer, at most.
        threads: Threads wanted.
        max_bytes: Most tensor bytes in flight, or ``None`` for no byte bound.
        largest_item: Bytes of the largest item seen (0: unknown).
        probe_first: With no size known, one draw at a time until one is posted.
        expected: Draws the source makes before its end, if known (its ``len``):
            the draw after them waits for the gate (see the module).

    Example:
        >>> tickets = Tickets(depth=2, threads=1, max_bytes=None, largest_item=0)
        >>> held = Held()
        >>> tickets.take(held, 5), tickets.free()
        (2, 0)
        >>> tickets.given_back(1, 0)
        >>> tickets.free()
        1
    """

    __slots__ = (
        "buffered_bytes",
        "depth",
        "expected",
        "gate_open",
        "in_flight",
        "issued",
        "largest_item",
        "max_bytes",
        "probe_first",
        "threads",
        "unposted",
    )

    def __init__(
        self,
        *,
        depth: int,
        threads: int,
        max_bytes: int | None,
        largest_item: int,
        probe_first: bool = False,
        expected: int | None = None,
    ) -> None:
        self.depth = depth
        self.threads = threads  # wanted (those running may still be leaving)
        self.max_bytes = max_bytes
        self.largest_item = largest_item
        self.probe_first = probe_first
        self.in_flight = 0  # taken and not given back
        self.unposted = 0  # of them, held by threads (drawing, or drawn and not posted)
        self.buffered_bytes = 0  # posted and not handed over (with a byte bound)
        self.expected = expected
        self.issued = 0  # tickets taken for draws, in all (not those given back unused)
        self.gate_open = expected is None

    def limit(self) -> int:
        """Most tickets out at once: each thread may hold a batch besides the depth ready ones."""
        return self.depth + self.threads - 1

    def free(self) -> int:
        """Tickets that may be taken now."""
        free = self.limit() - self.in_flight
        if self.expected is not None and not self.gate_open:
            free = min(free, self.expected - self.issued)
        if free <= 0:
            return 0
        limit = self.max_bytes
        if limit is None:
            return free
        largest = self.largest_item
        if largest:
            room = (limit - self.buffered_bytes) // largest - self.unposted
        elif self.probe_first:
            room = 0 if self.unposted else 1  # one draw at a time until a size is known
        else:
            room = free
        if self.in_flight == 0:
            room = max(room, 1)  # one item always flows
        return max(min(free, room), 0)

    def take(self, held: Held, most: int) -> int:
        """Take up to ``most`` free tickets for ``held``; return how many (0: none free)."""
        count = min(self.free(), most)
        self.issued += count
        self.in_flight += count
        self.unposted += count
        held.tickets += count
        return count

    def posted(self, held: Held, tickets: int, unused: int) -> None:
        """``held`` posted what ``tickets`` of its tickets hold, ``unused`` of them for nothing."""
        held.tickets -= tickets
        self.unposted -= tickets
        self.in_flight -= unused
        self.issued -= unused

    def buffered(self, sizes: list[int]) -> None:
        """Items of ``sizes`` tensor bytes were posted (with a byte bound)."""
        self.buffered_bytes += sum(sizes)
        largest = max(sizes)
        if largest > self.largest_item:
            self.largest_item = largest

    def dropped(self, held: Held, tickets: int) -> None:
        """``held`` gives back ``tickets`` it took and will not post (a stop, a leave)."""
        held.tickets -= tickets
        self.unposted -= tickets
        self.in_flight -= tickets
        self.issued -= tickets

    def at_the_gate(self) -> bool:
        """Whether the loop, every item handed over, asks past the ``expected`` draws."""
        expected = self.expected
        return (
            expected is not None
            and not self.gate_open
            and self.issued >= expected
            and not self.in_flight
        )

    def given_back(self, count: int, nbytes: int) -> None:
        """The consumer handed ``count`` items (``nbytes`` tensor bytes) to the loop."""
        self.in_flight -= count
        self.buffered_bytes -= nbytes
