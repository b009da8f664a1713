"""``Handover``: the runs an engine's threads posted, handed to the consumer in order.

Each item, and each error, takes the next sequence number in draw order; a
run is posted under the number of its first entry, whichever thread
finishes first, and handed over once every number before it was: items
arrive in source order, and an error arrives after every item drawn before
it. Out of order (``in_order=False``) every run is handed over once posted,
but a final one: it waits until every number before it was taken, and runs
numbered after it are never handed over.

Invariant: a :class:`Handover` is plain data of its engine, read and written
only while the engine's lock is held; it takes no lock and wakes nobody.
"""

from __future__ import annotations

from prefetch._threads.messages import Run


class Handover:
    """Posted runs by number and the consumer's position (under the engine's lock).

    Example:
        >>> handover = Handover(in_order=True)
        >>> handover.post(1, Run(["b"]))
        >>> handover.take(), handover.ready()
        ([], 0)
        >>> handover.post(0, Run(["a"]))
        >>> [run.items for run in handover.take()]
        [['a'], ['b']]
    """

    __slots__ = ("_ahead", "_posted", "in_order", "taken")

    def __init__(self, *, in_order: bool) -> None:
        self.in_order = in_order
        self.taken = 0  # the next sequence number the consumer takes
        self._posted: dict[int, Run] = {}  # by the number of each run's first entry
        self._ahead: dict[int, int] = {}  # out of order: numbers of runs taken past `taken`

    def post(self, seq: int, run: Run) -> None:
        """Post ``run``, whose first entry is numbered ``seq``."""
        self._posted[seq] = run

    def due(self, seq: int) -> bool:
        """Whether a run just posted at ``seq`` can be handed over now (wake the consumer)."""
        return seq == self.taken or not self.in_order

    def take(self) -> list[Run]:
        """Hand over every run that may be handed over now, in order."""
        if not self.in_order:
            return self._take_ready()
        runs: list[Run] = []
        seq, posted = self.taken, self._posted
        run = posted.pop(seq, None)
        while run is not None:
            runs.append(run)
            seq += run.numbers
            run = posted.pop(seq, None)
        self.taken = seq
        return runs

    def _take_ready(self) -> list[Run]:
        """Out of order: every run posted, but a final one before its turn (see the module)."""
        posted, ahead = self._posted, self._ahead
        finals = [seq for seq, run in posted.items() if run.final]
        last = min(finals) if finals else None  # later runs are never handed over
        runs: list[Run] = []
        for seq in sorted(posted):
            if last is not None and seq >= last:
                break
            run = posted.pop(seq)
            runs.append(run)
            ahead[seq] = run.numbers
        taken = self.taken
        while taken in ahead:
            taken += ahead.pop(taken)
        if last is not None and taken == last:
            runs.append(posted.pop(last))
            taken += 1
        self.taken = taken
        return runs

    def ready(self) -> int:
        """Items and messages that :meth:`take` would hand over now."""
        if not self.in_order:
            return self.posted()
        ready, seq = 0, self.taken
        run = self._posted.get(seq)
        while run is not None:
            ready += run.numbers
            seq += run.numbers
            run = self._posted.get(seq)
        return ready

    def posted(self) -> int:
        """Items and messages posted and not handed over."""
        return sum(run.numbers for run in self._posted.values())

    def clear(self) -> None:
        """Drop every run posted (a stop: nothing a stopped engine fetched is kept)."""
        self._posted.clear()
