r"""What the engine's threads do with a source: draw in order, read in parallel.

An :class:`~prefetch._threads.engine.Engine` asks its source for work.
:meth:`Tasks.draw` is called by one thread at a time, in order, so the
source's position (its iterator, its sampler, its checkpoint state) moves
exactly as in a plain loop. What comes after the draw is read outside that
order, by as many threads as the engine has, and does the slow part.

* :class:`IteratorTasks`: any iterator. ``draw`` is ``next(source)`` (all the
  work). One thread: an iterator cannot be read in parallel.
* :class:`BoardTasks`, such as
  :class:`~prefetch._threads.parallel_fetch.SamplerTasks`: a map-style
  DataLoader. ``draw`` takes the next batch of indices from the DataLoader's
  own iterator; ``plan`` splits it into units on the shared ``board``
  (samples, chunks, or the whole batch as one unit); any thread ``read``\ s a
  unit, and ``join`` collates a batch whose units are all in
  (:mod:`prefetch._threads.producers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, TypeGuard

from prefetch._shared.epoch import release_source
from prefetch._threads.sample_board import Reading, SampleBoard
from prefetch._torch.workers import lost_a_worker


class Tasks(Protocol):
    """The source of an engine: ordered draws (see the module)."""

    @property
    def board(self) -> SampleBoard | None:
        """Where drawn batches wait to be read (``None``: a draw is the item)."""

    def draw(self) -> Any:
        """Return the next task; raise ``StopIteration`` at the end (one caller at a time)."""

    def release(self) -> None:
        """Shut down what the source holds, once no thread uses it any more."""

    def broken(self) -> bool:
        """Whether the source, having just raised an ``Exception``, must not be drawn again."""


class BoardTasks(Tasks, Protocol):
    """A source whose draws are read in parallel, in units on a shared board (see the module)."""

    @property
    def board(self) -> SampleBoard:
        """The batches drawn and not yet complete, shared by the engine's threads."""

    def plan(self, seq: int, task: Any, state: Any, threads: int) -> Reading:
        """Split the drawn ``task`` (numbered ``seq``) into units for the board."""

    def read(self, batch: Reading, unit: int) -> Any:
        """Read one unit of ``batch`` (any thread)."""

    def join(self, batch: Reading) -> tuple[Any, float]:
        """Make the item of a complete ``batch``; return it and the seconds spent collating."""


class ProducerSpec(NamedTuple):
    """What the engine's threads do besides drawing and running.

    Attributes:
        prepare: Applied to each item in the thread (pinning), or ``None``.
        read_state: Called right after each draw (and after the end), in draw
            order, to capture the source's checkpoint state, or ``None``.
        setup: Called first in each thread (device selection, thread count,
            ``thread_init_fn``).
        seed: The epoch's base seed, which :func:`~prefetch.fetch_info` reports
            in parallel-fetch threads (``None``: one thread, no fetch info).
    """

    prepare: Callable[[Any], Any] | None = None
    read_state: Callable[[], Any] | None = None
    setup: Callable[[], None] | None = None
    seed: int | None = None


class IteratorTasks:
    """Tasks of a plain iterator: ``draw`` is ``next(source)``, and makes the item.

    Example:
        >>> tasks = IteratorTasks(iter("ab"), owned=True)
        >>> tasks.draw()
        'a'
    """

    __slots__ = ("board", "draw", "owned", "source")

    def __init__(self, source: Iterator[Any], owned: bool) -> None:
        self.board: SampleBoard | None = None  # nothing to read: a draw is the item
        self.source = source
        self.owned = owned
        self.draw: Callable[[], Any] = source.__next__
        """Return the source's next item (its own ``__next__``: no call in between)."""

    def release(self) -> None:
        """Release the source iterator (see :func:`~prefetch._shared.epoch.release_source`)."""
        release_source(self.source, self.owned)

    def broken(self) -> bool:
        """Whether the source is a DataLoader iterator that lost a worker process.

        It reports the loss once and, asked again, drops the dead worker's
        batches or waits forever (:mod:`prefetch._torch.workers`).
        """
        return lost_a_worker(self.source)


def reads_units(tasks: Tasks) -> TypeGuard[BoardTasks]:
    """Whether ``tasks``'s draws are read unit by unit on a board (a DataLoader's batches)."""
    return tasks.board is not None
