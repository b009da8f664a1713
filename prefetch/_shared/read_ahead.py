"""What an epoch over a one-shot source read ahead and did not hand over: carried, not lost.

A plain loop that breaks out of a generator leaves the items after the break
in the generator, for the next loop. A wrapper reads ahead of the loop, so
when an epoch over a one-shot source (an iterator: ``iter()`` returns itself)
stops before its end, what it took from the source and did not hand to the
loop is recorded as a :class:`ReadAhead`: items and errors in source order,
and whether the source's end was already found. The wrapper's next epoch
starts with them (:class:`Resumed`) and then goes on with the source, through
any stack of wrappers.

Invariant: entries are handed over in the order they were taken from the
source, each error in its place, and an end already found ends the next epoch
after them without asking the source again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple


class Entry(NamedTuple):
    """One thing read ahead: an item, or the error raised in its place."""

    item: Any
    error: BaseException | None = None


class ReadAhead:
    """Entries an epoch read ahead and did not hand over, in order, and whether the end came.

    Example:
        >>> carried = ReadAhead()
        >>> carried.add([Entry(3), Entry(4)])
        >>> carried.ended = True
        >>> list(Resumed(carried, iter([9])))
        [3, 4]
    """

    __slots__ = ("ended", "entries")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.ended = False  # the source's end was found (it is not asked again)

    def add(self, entries: Iterable[Entry]) -> None:
        """Append ``entries`` (they come after those already here)."""
        self.entries.extend(entries)

    def extend(self, later: ReadAhead) -> None:
        """Append what a later epoch read ahead."""
        self.entries.extend(later.entries)
        self.ended = self.ended or later.ended

    def __bool__(self) -> bool:
        return bool(self.entries) or self.ended


class Resumed(Iterator[Any]):
    """A one-shot source with what an earlier epoch read ahead put back in front.

    Attributes it lacks are the source's (what a release or a check reads).
    """

    def __init__(self, carried: ReadAhead, source: Iterator[Any]) -> None:
        self.source = source
        self._entries = deque(carried.entries)
        self._ended = carried.ended
        self._raised: set[int] = set()
        self._end_drawn = False  # the carried end was drawn: its epoch found it

    def __next__(self) -> Any:
        if self._entries:
            entry = self._entries.popleft()
            if entry.error is not None:
                self._raised.add(id(entry.error))
                raise entry.error
            return entry.item
        if self._ended:
            self._end_drawn = True
            raise StopIteration
        return next(self.source)

    def rest(self) -> ReadAhead:
        """Take the entries not drawn yet, and whether the end came (once its epoch stopped).

        They come after what its epoch drew and did not hand over: the next
        epoch starts with both, in that order.
        """
        rest = ReadAhead()
        rest.add(self._entries)
        rest.ended = self._ended and not self._end_drawn  # an end drawn is its epoch's
        self._entries.clear()
        return rest

    def raised(self, error: BaseException) -> bool:
        """Whether ``error`` is one this iterator carried and raised (the source's own error)."""
        return id(error) in self._raised

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # before __init__ set it: never recurse
            raise AttributeError(name)
        return getattr(self.source, name)
