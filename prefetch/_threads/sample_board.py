"""The batches being read at the grain of samples, shared by the fetch threads.

With sample-grain parallel fetch (:mod:`prefetch._threads.producers`) a
batch's samples are read by whichever threads are free. A thread that draws
a batch puts it on the :class:`SampleBoard` as *units* (one index, or a
contiguous chunk for a dataset with ``__getitems__``); every thread takes
the next unread unit of the earliest batch, reads it outside any lock and
gives the result back; the thread that gives back a batch's last unit gets
the batch, complete, and collates and posts it.

Invariants (every change here must keep them):

* **A leaf lock.** ``_lock`` guards every field; nothing else is locked,
  and nothing is read, collated or posted, while it is held. The engine's
  locks may be held when it is taken, never the reverse.
* **Earliest first.** A unit is taken from the earliest batch that has one
  left, so a batch is read by all the free threads at once and batches
  complete in about their draw order.
* **Completed once.** Each batch is handed back complete to exactly one
  thread (the one that gave back its last unit), or dropped by
  :meth:`SampleBoard.cut`, never both.
* **A batch holds its ticket.** From its draw until it is handed back or
  dropped, a batch holds the engine ticket its draw took; the thread it is
  handed back to posts it with that ticket, and :meth:`SampleBoard.cut`
  returns the tickets of the batches it drops to the thread that cut.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from typing import Any


class Reading:
    """One batch on the board: its units and what has been read of them.

    Attributes:
        seq: The batch's sequence number in the engine (its draw order).
        number: The batch's position among the epoch's draws (0 first).
        state: The source's checkpoint state read right after its draw.
        units: What each read takes (an index, or a chunk of them).
        starts: The position in the batch of each unit's first sample.
        parts: Each unit's result, in unit order, once read.
    """

    __slots__ = (
        "end",
        "errors",
        "left",
        "next",
        "number",
        "parts",
        "samples",
        "seq",
        "starts",
        "state",
        "units",
    )

    def __init__(
        self, seq: int, number: int, units: list[Any], starts: list[int], samples: int, state: Any
    ) -> None:
        self.seq = seq
        self.number = number
        self.state = state
        self.units = units
        self.starts = starts
        self.samples = samples
        self.parts: list[Any] = [None] * len(units)
        self.errors: dict[int, BaseException] = {}
        self.next = 0  # the next unit to hand out
        self.end = len(units)  # units from here on are not handed out (an error came)
        self.left = len(units)  # units handed out or to hand out, not given back yet

    def first_error(self) -> BaseException | None:
        """The error of the earliest unit that raised (as the DataLoader's loop would raise it)."""
        if not self.errors:
            return None
        return self.errors[min(self.errors)]


class SampleBoard:
    """The batches drawn and not yet complete; see the module invariants.

    Example:
        >>> board = SampleBoard()
        >>> board.add(Reading(0, 0, [[3], [4]], [0, 1], 2, None))
        >>> batch, unit = board.take()
        >>> complete, (batch, unit) = board.give_back_and_take(batch, unit, ["a"], None)
        >>> complete
        False
        >>> board.give_back_and_take(batch, unit, ["b"], None)[0]
        True
        >>> batch.parts
        [['a'], ['b']]
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: deque[Reading] = deque()  # batches with a unit not handed out yet
        self._reading: dict[int, Reading] = {}  # every batch not complete, by seq
        self._cut = sys.maxsize  # batches from this seq on are dropped
        self.samples = 0  # samples of the batches not complete
        self.peak_samples = 0

    def add(self, batch: Reading) -> None:
        """Put a batch just drawn on the board (it holds its draw's ticket)."""
        with self._lock:
            self._reading[batch.seq] = batch
            if batch.units:
                self._open.append(batch)
            self.samples += batch.samples
            if self.samples > self.peak_samples:
                self.peak_samples = self.samples

    def has_work(self) -> bool:
        """Whether a unit is waiting for a thread (a hint read without the lock)."""
        return bool(self._open)

    def take(self) -> tuple[Reading, int] | None:
        """Hand out the next unit of the earliest batch that has one; ``None``: none left."""
        with self._lock:
            return self._take()

    def _take(self) -> tuple[Reading, int] | None:
        """:meth:`take`, holding the lock."""
        while self._open:
            batch = self._open[0]
            if batch.seq >= self._cut:
                self._open.popleft()
                continue
            unit = batch.next
            if unit >= batch.end:
                self._open.popleft()
                continue
            batch.next = unit + 1
            if batch.next >= batch.end:
                self._open.popleft()
            return batch, unit
        return None

    def give_back_and_take(
        self, batch: Reading, unit: int, part: Any, error: BaseException | None
    ) -> tuple[bool, tuple[Reading, int] | None]:
        """Record a unit's result (or its error), then take the next unit: one lock.

        Returns whether the batch is complete, for this thread (then no unit
        is taken), and the unit taken (``None``: none left). After an error
        the batch's later units are not read, those being read finish (the
        DataLoader's loop reads no sample after the one that raised); its
        earlier ones still are, since one of them may raise first.
        """
        with self._lock:
            if self._give_back(batch, unit, part, error):
                return True, None
            return False, self._take()

    def _give_back(self, batch: Reading, unit: int, part: Any, error: BaseException | None) -> bool:
        """Record a unit's result (holding the lock); whether the batch is now complete."""
        if error is not None:
            batch.errors[unit] = error
            if batch.next < batch.end:  # none handed out from here: those out (unit too) come back
                batch.left -= batch.end - batch.next
                batch.end = batch.next
        else:
            batch.parts[unit] = part
        batch.left -= 1
        if batch.left or self._reading.get(batch.seq) is not batch:
            return False  # more to read, or dropped by a cut
        del self._reading[batch.seq]
        self.samples -= batch.samples
        return True

    def cut(self, seq: int) -> int:
        """Drop every batch from ``seq`` on (a final message there); return their tickets.

        Example:
            >>> board = SampleBoard()
            >>> for seq in range(3):  # batches of 2, 3 and 4 samples
            ...     board.add(Reading(seq, seq, [[seq]], [0], seq + 2, None))
            >>> board.cut(1), board.samples, board.peak_samples
            (2, 2, 9)
        """
        with self._lock:
            self._cut = min(self._cut, seq)
            dropped = [s for s in self._reading if s >= self._cut]
            for s in dropped:
                self.samples -= self._reading.pop(s).samples
            return len(dropped)
