"""``ThreadSide``: the engine as its producer threads see it.

The producers (:mod:`prefetch._threads.producers` over an iterator,
:mod:`prefetch._threads.sample_fetch` over a DataLoader's samples) are typed
against this protocol, not against :class:`~prefetch._threads.engine.Engine`:
the engine imports them and runs them in its threads; they never import it.
Every invariant these members keep is written in :mod:`prefetch._threads.engine`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from prefetch._threads.messages import Run
from prefetch._threads.tasks import ProducerSpec
from prefetch._threads.tickets import Held


class ThreadSide(Protocol):
    """What a producer thread reads and calls on its engine."""

    spec: ProducerSpec
    """What each thread does besides drawing and running."""
    max_bytes: int | None
    """Most tensor bytes in flight (``None``: no byte bound, item sizes are not measured)."""
    parallel_python: bool
    """Whether threads run Python at the same time (the GIL is off)."""
    clock: Callable[[], float]
    """The threads' CPU clock (a constant 0 unless the engine measures CPU time)."""
    draw_lock: threading.Lock
    """Orders parallel draws; taken before the engine's lock, never while holding it."""
    consumer_waiting: bool
    """Whether the consumer waits for a run (a hint read without the lock)."""
    stopped: bool
    """Whether :meth:`~prefetch._threads.engine.Engine.stop` was called (a hint likewise)."""

    @property
    def over(self) -> bool:
        """Whether the epoch ended or the engine stopped (a hint read without the lock)."""

    def thread_count(self) -> int:
        """The threads wanted now."""

    def number(self) -> int:
        """Take the next sequence number for one draw (call under :attr:`draw_lock`)."""

    def take_tickets(
        self, held: Held, most: int, *, unless: Callable[[], bool] | None = None
    ) -> int:
        """Wait for free tickets, take up to ``most``; 0: leave; -1: ``unless()`` came true."""

    def post(
        self,
        seq: int,
        run: Run,
        held: Held,
        *,
        seconds: float,
        unused: int = 0,
        take: int = 0,
        cpu: float = 0.0,
        slot: int = -1,
        collate: float = 0.0,
    ) -> int:
        """Post ``run`` at ``seq``, give back ``unused`` tickets, take up to ``take`` more."""

    def end(self, source_ended: bool) -> None:
        """Mark the epoch ended: a final message is coming, no thread draws again."""

    def give_back_ticket(self, held: Held) -> None:
        """Return one ticket ``held`` took and did not use."""

    def work_added(self, samples: int) -> None:
        """A batch's units were put on the board (``samples`` on it now): wake waiting threads."""

    def account(self, slot: int, seconds: float, cpu: float, *, reads: int = 0) -> None:
        """Count time a thread spent without posting (``slot`` -1: drawing)."""

    def add_fetch_slot(self) -> int:
        """Give a parallel thread its entry in the per-thread stats; return its index."""
