"""``Shared``: everything an engine's threads and its consumer share, and the lock over it.

An :class:`~prefetch._threads.engine.Engine` (the consumer's side, and the
threads' start and end) and the
:class:`~prefetch._threads.thread_side.ThreadSide` its threads call hold the
same :class:`Shared`; neither holds the other. The counting of what is in
flight is :class:`~prefetch._threads.tickets.Tickets`, the ordering of what
was posted :class:`~prefetch._threads.handover.Handover`: plain data kept
here.

Invariants (the engine's first rule, :mod:`prefetch._threads.engine`):

* Every field is written under ``lock`` (``next_seq`` under ``draw_lock``
  instead: only the thread that draws numbers its draws), and every decision
  is taken under it; every wait is a ``Condition`` wait on it that re-checks
  its condition.
* The threads read two fields without the lock, as hints only:
  ``consumer_waiting`` (whether to post now) and ``stopped`` (whether to draw
  again), and :attr:`Shared.over` likewise; the consumer reads ``woken`` and
  ``waiting`` so (whether to skip a return point).
* ``draw_lock`` is taken before ``lock``, never while holding it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prefetch._shared.epoch import EpochRecord
from prefetch._shared.facts import gil_enabled
from prefetch._threads.handover import Handover
from prefetch._threads.messages import Final, Run, Snapshot
from prefetch._threads.tasks import ProducerSpec, Tasks
from prefetch._threads.tickets import Tickets

POLL_SECONDS = 0.1
"""How often a blocked side re-checks that the other side is still there."""
EARLY_WAKE = 16
"""Most items a side handles after it woke the other early (under the GIL; see the engine)."""


class Shared:
    """The state of one engine, under one lock; see the module invariants.

    Args:
        tasks: The source.
        spec: What each thread does besides drawing and reading.
        record: The epoch's record (stats, whether the source ended, the
            largest item: its value now is the size hint, 0 unknown).
        depth: Items ready ahead of the consumer, at most.
        threads: Threads to run.
        max_bytes: Most tensor bytes in flight, or ``None`` for no byte bound.
        measure_cpu: Sum the threads' CPU time (a system call per item).
        probe_first: With no size known, one draw at a time until one is posted.
        in_order: Hand runs over in number order; ``False``: as they are posted.
        expected: The source's length, if known: the draw that finds its end
            waits until the loop asks past it (:mod:`prefetch._threads.tickets`).
        keep: Keep what is drawn and not handed over when the engine stops (a
            one-shot source: :mod:`prefetch._shared.read_ahead`).
    """

    def __init__(
        self,
        tasks: Tasks,
        spec: ProducerSpec,
        record: EpochRecord,
        *,
        depth: int,
        threads: int,
        max_bytes: int | None,
        measure_cpu: bool,
        probe_first: bool,
        in_order: bool,
        expected: int | None,
        keep: bool,
    ) -> None:
        self.tasks, self.spec, self.record = tasks, spec, record
        self.max_bytes = max_bytes
        self.clock: Callable[[], float] = time.thread_time if measure_cpu else _no_clock
        self.parallel_python = not gil_enabled()  # threads run Python at the same time
        # One thread over an iterator with the GIL on: the sides wake each other early.
        self.early_wakes = not self.parallel_python and tasks.board is None and threads == 1
        self.lock = threading.RLock()  # re-entrant: a finalizer may stop() on a holding thread
        self.space = threading.Condition(self.lock)  # threads wait here for tickets
        self.data = threading.Condition(self.lock)  # the consumer waits here
        self.poll = POLL_SECONDS  # read here, so that a test can take the safety net away
        self.draw_lock = threading.Lock()  # orders draws; guards next_seq
        self.next_seq = 0  # the number the next draw takes (under draw_lock)
        self.tickets = Tickets(
            depth=depth,
            threads=threads,
            max_bytes=max_bytes,
            largest_item=record.largest_item,
            probe_first=probe_first,
            expected=expected,
        )
        self.handover = Handover(in_order=in_order)
        self.fetched = 0  # items posted, in all
        self.busy = self.blocked = self.cpu = 0.0  # the threads' seconds, summed
        self.reads = 0  # units read, in all
        self.tell_at: int | None = None  # reads after which the consumer is told (see below)
        self.told = False  # they were done: the consumer's wait returns (a hint read first)
        self.staying = 0  # threads that go on (not told to leave)
        self.running = 0  # threads that have not left
        self.waiting = 0  # threads blocked waiting for a ticket
        self.woken = False  # they were woken and have not waited again since
        self.consumer_waiting = False  # a hint (see the invariants)
        self.consumer_woken = False  # it was woken and has not waited again since
        self.stopped = False  # a hint likewise: stop() was called
        self.ended = False  # a final message is coming: no thread draws again
        self.releasing = False  # the last thread is releasing the source
        self.final: Final | None = None  # the earliest final message, until posted
        self.keep = keep  # a stop keeps what was drawn (posted runs stay in the hand-over)
        self.front: list[Run] = []  # kept runs the consumer had taken (before the hand-over's)
        self.started: list[threading.Thread] = []  # every thread started
        self.indices: set[int] = set()  # thread indices in use (see fetch_info)

    @property
    def over(self) -> bool:
        """Whether the epoch ended or the engine stopped (a hint read without the lock)."""
        return self.ended or self.stopped

    def snapshot(self) -> Snapshot:
        """Return the engine's figures, read together under the lock."""
        with self.lock:
            tickets = self.tickets
            return Snapshot(
                depth=tickets.depth,
                threads=tickets.threads,
                in_flight=tickets.in_flight,
                ready=self.handover.ready(),
                posted=self.handover.posted(),
                waiting_threads=self.waiting,
                free=tickets.free(),
                fetched=self.fetched,
                max_bytes=self.max_bytes,
                buffered_bytes=tickets.buffered_bytes,
                largest_item=tickets.largest_item,
                busy_seconds=self.busy,
                blocked_seconds=self.blocked,
                cpu_seconds=self.cpu,
                reads=self.reads,
            )

    def stop(self) -> None:
        """Ask every thread to leave, drop what was posted (unless kept); any thread, any time."""
        with self.lock:
            self.stopped = True
            if not self.keep:
                self.handover.clear()
            self.space.notify_all()
            self.data.notify_all()

    def wake_threads(self) -> None:
        """Wake the threads waiting for tickets (holding the lock); the tests' seam."""
        self.woken = True  # until one of them waits again
        self.space.notify_all()

    def wait_for_data(self, seconds: float) -> None:
        """Wait on ``data`` (holding the lock) up to ``seconds``; an interrupt leaves it held.

        CPython's ``Condition.wait`` releases the lock and only then enters the
        ``try`` whose ``finally`` takes it back: a signal handler's exception
        (Ctrl-C's ``KeyboardInterrupt``) raised between the two leaves the lock
        released, and the caller's ``with lock`` then fails with ``RuntimeError:
        cannot release un-acquired lock`` in its place (seen on 3.13t; the same
        code in 3.11.7, 3.12.1, 3.13.0 and 3.13.5t). Here the lock is taken
        back and the waiter that wait left behind is dropped, so the interrupt
        is what the loop sees.
        """
        try:
            self.data.wait(seconds)
        except BaseException:
            self._hold_again()
            raise

    def _hold_again(self) -> None:
        """Hold the lock once more if an interrupted wait left it released; drop stale waiters."""
        data = self.data
        while not data._is_owned():  # type: ignore[attr-defined]  # Condition's own check
            try:
                self.lock.acquire()
            except BaseException:  # a second Ctrl-C meanwhile asks the same: the first is raised
                continue
        data.notify_all()  # only the consumer waits here: what is left is the wait's own waiter

    def wake_consumer(self) -> None:
        """Wake the consumer waiting for a run (holding the lock); the tests' seam."""
        self.consumer_woken = True  # until it waits again
        self.data.notify()


def hidden_interrupt(error: BaseException) -> BaseException | None:
    """The Ctrl-C that ``error`` replaced, if a stdlib ``Condition.wait`` lost it.

    The window :meth:`Shared.wait_for_data` closes is in every
    ``Condition.wait``: one that the stdlib calls on the loop's thread, such as
    the ``Event.wait`` in ``Thread.start()``, raises ``RuntimeError: release
    unlocked lock`` (over a ``Lock``, as an ``Event``'s; ``cannot release
    un-acquired lock`` over an ``RLock``) with the ``KeyboardInterrupt`` as its
    context.
    """
    context = error.__context__
    if isinstance(error, RuntimeError) and isinstance(context, KeyboardInterrupt):
        return context if str(error) in _RELEASE_ERRORS else None
    return None


_RELEASE_ERRORS = ("release unlocked lock", "cannot release un-acquired lock")
"""What ``Lock.release()`` and ``RLock.release()`` raise unheld (3.11.7 to 3.13.5t)."""


def _no_clock() -> float:
    return 0.0
