"""One epoch's life, the same for every wrapper: created by ``iter()``, started by ``next()``.

An epoch starts in three named steps, all on the caller's thread:

1. :meth:`EpochIterator.start`: the first ``next()`` of the idle iterator a
   wrapper's ``iter()`` returned (or ``start()`` called by the user, or a
   checkpoint asking for the epoch's place), once;
2. :meth:`~prefetch._shared.wrapper.LoaderWrapper._open_epoch`: the wrapper,
   the one place that opens epochs, calls ``iter()`` on the wrapped loader and
   starts an :class:`EpochRecord`;
3. :meth:`EpochIterator._launch`: the iterator launches the epoch over that source
   (its threads, or its device queue) and registers the :class:`Stoppable`
   that stops it.

If step 2 or 3 raises (the loader's state cannot be read, a DataLoader given
worker processes after ``fetch_threads`` wrapped it), the source ``iter()``
made is released there and then (:func:`released_if_raised`): its worker
processes do not outlive the error.

The wrapper keeps its started epochs in a registry
(:class:`~prefetch._shared.open_epochs.OpenEpochs`), each with its
:class:`Stoppable`: what stops the epoch's threads, or releases its source,
even once the iterator itself is gone.

Invariants:

* **Idle until started.** An iterator not started holds no thread, no
  source and no worker; dropping it costs nothing, and closing it only marks
  it over. A framework that calls ``iter()`` only to look (Lightning does)
  changes nothing.
* **The registry never holds an iterator.** It keeps a weak reference and
  the :class:`Stoppable`, which holds no reference to the iterator, so a
  dropped iterator is collected and its finalizer stops the epoch.
* **Stopped once, said why.** An epoch that a newer one had to stop
  (:meth:`EpochIterator._invalidate`) raises ``RuntimeError`` with the reason
  on its next ``next()``, then ``StopIteration``: it never ends silently.
* **Waited out.** :meth:`~prefetch._shared.open_epochs.OpenEpochs.stop_all`
  with ``wait=True`` returns only once every registered epoch's threads have
  left its source (a ``DataLoader`` with persistent workers may then reset
  its one iterator).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol, TypeVar

from prefetch._shared.read_ahead import ReadAhead, Resumed
from prefetch._shared.sampling import SamplingGenerators
from prefetch._shared.stats import LoaderStats
from prefetch._torch.workers import shut_down_workers

T = TypeVar("T")
E = TypeVar("E", bound="EpochIterator[Any]")
Opener = Callable[["EpochIterator[Any]"], None]
"""Opens the epoch of the iterator it is given (its wrapper's ``_open_epoch``)."""

CLOSE_TIMEOUT = 10.0
"""Longest a stop waits for an epoch's threads (shutting down DataLoader workers)."""
STUCK_GRACE = 0.2
"""How long a stop waits for a thread that is blocked inside the source."""


class EpochRecord:
    """What a wrapper keeps of an epoch without holding its iterator.

    Attributes:
        stats: The epoch's :class:`~prefetch.LoaderStats`, shared with its iterator.
        state: Where the wrapped loader was after the last item handed to the
            training loop: a :class:`~prefetch._shared.sampling.Position` (its
            checkpoint state and its sampling generators' states).
        source_ended: Whether the epoch's source raised ``StopIteration``
            (a one-shot source is then used up).
        largest_item: Bytes of the largest item this loader produced so far,
            earlier epochs included (0: unknown); a hint for the byte bound.
        sampling: The generators the epoch draws from, until it is over
            (``None``: none, or over).
    """

    __slots__ = ("largest_item", "sampling", "source_ended", "state", "stats")

    def __init__(self, state: Any, largest_item: int = 0) -> None:
        self.stats = LoaderStats(started=time.perf_counter())
        self.state = state
        self.source_ended = False
        self.largest_item = largest_item
        self.sampling: SamplingGenerators | None = None

    def over(self, inside: Stoppable | None) -> None:
        """The epoch is over: its generators go where its loop's last item left them (once).

        ``inside`` is the epoch's :class:`Stoppable` if its threads may still
        be in the source (:mod:`prefetch._shared.sampling`).
        """
        sampling, self.sampling = self.sampling, None
        if sampling is not None:
            sampling.over(self.state.sampling, inside)


class Stoppable(Protocol):
    """What stops an epoch without its iterator: an engine, or a source to release."""

    def stop(self) -> None:
        """Ask the epoch to stop (any thread, any number of times)."""

    def join(self, *, timeout: float, stuck_grace: float) -> bool:
        """Wait for the epoch's threads to leave its source; return whether they all did."""

    @property
    def keeps(self) -> bool:
        """Whether the epoch keeps what it read ahead when it stops (a one-shot source)."""

    def read_ahead(self) -> ReadAhead:
        """What the stopped epoch took from a one-shot source and did not hand over.

        Read once its threads have left the source.
        """


class EpochIterator(Iterator[T]):
    """Base of the iterator an ``iter()`` of a wrapper returns: one epoch.

    A subclass is made idle with the :data:`Opener` its wrapper gives it
    (stored as ``_opener``) and a placeholder record; its first ``next()``
    calls :meth:`start`. It implements :meth:`_launch`, :meth:`_finish` and
    :meth:`_is_over`.
    """

    _record: EpochRecord
    _stopper: Stoppable
    _invalid: str | None = None  # why a newer epoch stopped this one, until raised
    _opener: Opener | None = None  # opens the epoch (None: started, or over)

    @property
    def stats(self) -> LoaderStats:
        """This epoch's :class:`~prefetch.LoaderStats`."""
        return self._record.stats

    def __iter__(self: E) -> E:
        return self

    def _sampling_position(self) -> Any:
        """The sampling generators' states after the last item this epoch handed over."""
        return self._record.state.sampling

    def start(self) -> None:
        """Start the epoch now, if it has not started: the first ``next()`` does it otherwise.

        ``iter(loader)`` starts nothing: the wrapped loader's ``iter()`` (its
        worker processes, a seeded shuffle) and the threads run from the first
        ``next()``. Call ``start()`` to have them run ahead while you do
        something else first. It is called on your thread, and calling it
        again, or on an epoch that is over, does nothing. If starting raises
        (the wrapped loader's ``iter()`` did), the epoch is over and the error
        reaches you.
        """
        opener, self._opener = self._opener, None
        if opener is None:
            return
        try:
            opener(self)
        except BaseException:
            self._finish()
            raise
        finally:
            del self  # a traceback keeps this frame: not the iterator

    def close(self) -> None:
        """Stop the epoch: batches in flight are dropped and the source is released.

        Returns within about ``0.2`` s even if a thread is blocked inside the
        source (it then exits by itself when the source returns).
        """
        self._finish()

    def __enter__(self: E) -> E:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _launch(
        self,
        source: Iterator[Any],
        record: EpochRecord,
        *,
        owned: bool,
        keep: bool,
        read_state: Callable[[], Any] | None,
        expected: int | None,
    ) -> None:
        """Hook: run the epoch over ``source`` (``iter()`` of the wrapped loader).

        ``record`` is the epoch's; ``owned`` whether the epoch releases the
        source when it ends (not a one-shot iterator the user passed in);
        ``keep`` whether a stop keeps what was read ahead for the next epoch
        (a one-shot source: :mod:`prefetch._shared.read_ahead`);
        ``read_state`` reads the wrapped loader's checkpoint state after each
        item (``None``: not stateful); ``expected`` is the wrapped loader's
        length, if it has one: the ``next()`` past that many items, which finds
        the end, waits until the loop asks for it. Sets ``_stopper``.
        """
        raise NotImplementedError

    def _finish(self) -> None:
        """Stop the epoch and release what it holds (idempotent; an idle epoch only ends)."""
        raise NotImplementedError

    def _is_over(self) -> bool:
        """Whether the epoch has nothing more to hand over."""
        raise NotImplementedError

    def _raised(self, error: BaseException) -> bool:
        """Whether ``error`` is an error of the source that this iterator re-raised."""
        return False

    def _invalidate(self, reason: str) -> None:
        """Stop this epoch because a newer one cannot run beside it.

        The next ``next()`` raises ``RuntimeError(reason)``, later ones
        ``StopIteration``. Nothing is raised if the epoch was already over.
        """
        if not self._is_over():
            self._invalid = reason
        self._finish()

    def _end(self) -> NoReturn:
        """Raise what a finished epoch raises: why it was stopped (once), then ``StopIteration``."""
        reason, self._invalid = self._invalid, None
        if reason is not None:
            raise RuntimeError(reason)
        raise StopIteration


def raised_by_source(source: Iterator[Any], error: BaseException) -> bool:
    """Whether ``error`` came out of the epoch ``source`` as its source's own error.

    Lets a consumer tell a ``KeyboardInterrupt`` raised *by the source* (to be
    delivered in order) from one raised on its own thread (Ctrl-C).
    """
    if isinstance(source, Resumed):
        return source.raised(error) or raised_by_source(source.source, error)
    return isinstance(source, EpochIterator) and source._raised(error)


def release_source(source: Iterator[Any], owned: bool) -> None:
    """Shut down what the source iterator holds, as dropping it would.

    A multi-process DataLoader iterator stops its workers (unless they are
    persistent: the DataLoader reuses them next epoch), without hanging when
    one of them died (:mod:`prefetch._torch.workers`). A generator we
    created with ``iter()`` is closed so its ``finally`` blocks run now; one
    the user passed in (``owned`` false) is left alone.
    """
    if shut_down_workers(source):
        return
    close = getattr(source, "close", None)
    if owned and callable(close):
        close()


@contextmanager
def released_if_raised(source: Iterator[Any], owned: bool) -> Generator[None, None, None]:
    """Release ``source`` (:func:`release_source`) if the block raises, then re-raise.

    The block's error is the one raised; if releasing fails too, its error is
    added to that one as a note rather than replacing it.
    """
    try:
        yield
    except BaseException as error:
        try:
            release_source(source, owned=owned)
        except Exception as failure:  # the first error is the one to see
            error.add_note(f"releasing the source after it raised failed too: {failure!r}")
        raise
