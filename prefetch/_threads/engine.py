"""``Engine``: one epoch's fetch threads, started here, and the consumer's side of them.

This is the only module that starts threads. A batch goes one way:

1. each thread runs a :class:`~prefetch._threads.producers.Producer`, which
   draws from the source (a :class:`~prefetch._threads.tasks.Tasks`), reads
   and collates;
2. it posts runs through its :class:`~prefetch._threads.thread_side.ThreadSide`
   into the :class:`~prefetch._threads.handover.Handover`;
3. the consumer end (:mod:`prefetch._threads.iterator`) takes them through
   its :class:`~prefetch._threads.consumer_side.ConsumerSide` and hands their
   items to the loop.

Both sides share one :class:`~prefetch._threads.shared.Shared`; neither calls
back into the other. What is in flight is counted by
:class:`~prefetch._threads.tickets.Tickets`.

Invariants (every change here, and in the modules named, must keep them):

* **One lock.** Every shared field is written under the shared lock, and
  every decision is taken under it; every wait is a ``Condition`` wait on it
  that re-checks its condition, so no wake-up is lost. The threads read two
  fields without it, as hints only: ``consumer_waiting`` (whether to post
  now) and ``stopped`` (whether to draw again); a stale hint delays a post or
  a stop by one item, never loses one. The consumer reads ``woken`` and
  ``waiting`` so, to skip a return point
  (:meth:`~prefetch._threads.consumer_side.ConsumerSide.threads_woken_idle`):
  a stale hint only moves when tickets come back (at the latest once the
  items taken are used up, and always before the consumer waits).
  ``draw_lock`` orders draws and guards the sequence numbers; it is taken
  before the lock, never while holding it.
  Nothing relies on the GIL (free-threaded Python runs this as is; torch's
  own record of DataLoader worker pids did, and
  :mod:`prefetch._torch.worker_pids` locks it). The lock
  is re-entrant so that a finalizer calling :meth:`Engine.stop` during
  garbage collection on a thread that holds it cannot deadlock.
* **Order.** Each item, and each error, takes the next sequence number in
  draw order; runs are posted under the number of their first entry and
  handed over in number order, whichever thread finishes first (the
  :class:`~prefetch._threads.handover.Handover`, which also says what
  changes out of order). So items arrive in source order and an error
  arrives as the same object after every item drawn before it.
* **Tickets bound what is in flight.** A thread takes a ticket for each
  draw; the consumer gives it back once the item is handed to the loop (the
  bound, and the byte bound: :class:`~prefetch._threads.tickets.Tickets`).
  Over a sized source, the draw past its length (the one that finds the end)
  gets its ticket only once the loop asks past the last item.
* **Wake-ups.** A side is woken only when it waits, and once until it waits
  again: the consumer when the run it waits for is posted; threads waiting
  for tickets when the consumer gives tickets back (every quarter of the
  bound, at most) or is about to wait. Under the GIL, one thread over an
  iterator (``Shared.early_wakes``) and the consumer wake each other
  *early*, a few items (at most :data:`~prefetch._threads.shared.EARLY_WAKE`)
  before they block: the thread wakes a waiting consumer as it takes the
  tickets for its next run, the consumer gives tickets back at the first
  item after it waited. Neither can run before the other blocks, and one
  woken that early takes the interpreter at once (docs/benchmarks: the
  hand-off at depths 2 and 8). While the thread it woke has not run since,
  the consumer skips its return points until its items run out.
* **Errors.** What a thread catches becomes a message in one place
  (:func:`~prefetch._threads.messages.message_for`, which says which). An
  error the source goes on after is posted in its place; the end and a
  final error end the epoch: no thread draws again, the earliest final wins,
  and it is posted only by the last thread to leave, after the source is
  released (a DataLoader's workers are gone before its error is seen).
* **Timeout.** With a :class:`~prefetch._threads.timeout.Timeout`, a consumer
  that waited longer for the run it wants stops the engine and takes a
  final ``RAISE_AND_END`` run carrying the timeout error instead.
* **Stop.** :meth:`Engine.stop` (from any thread, a finalizer included) makes
  every thread leave at its next check; one inside the source leaves when the
  source returns. Nothing a stopped engine fetched is kept, unless its source
  is one-shot (``keep``): then what it drew and did not hand over, what its
  threads post after the stop included, is kept for the next epoch
  (:meth:`Engine.read_ahead`). At interpreter
  exit every live engine is stopped and given :data:`EXIT_GRACE` seconds in
  all to release its source.
* **No reference to the consumer.** Threads hold the shared state, never
  the iterator the user holds, so collecting an abandoned iterator runs its
  finalizer, which stops the engine.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time

from prefetch._shared.epoch import EpochRecord
from prefetch._shared.read_ahead import Entry, ReadAhead
from prefetch._threads.consumer_side import ConsumerSide
from prefetch._threads.fetch_info import enter_fetch_thread, leave_fetch_thread
from prefetch._threads.messages import Final, Kind, Run, Snapshot
from prefetch._threads.producers import Producer
from prefetch._threads.shared import Shared, hidden_interrupt
from prefetch._threads.tasks import ProducerSpec, Tasks, reads_units
from prefetch._threads.thread_side import ThreadSide
from prefetch._threads.tickets import Held
from prefetch._threads.timeout import Timeout

EXIT_GRACE = 1.0
"""Longest the interpreter's exit waits, in all, for engines to stop."""

_thread_ids = itertools.count(1)
live: set[Engine] = set()
"""Engines with a thread that has not left (the interpreter's exit stops them)."""


class Engine:
    """The threads of one epoch, and the consumer's side of them; see the module invariants.

    Args:
        tasks: The source.
        spec: What each thread does besides drawing and reading.
        record: The epoch's record: its stats (source time, peaks, per-thread
            fetch time), whether the source ended, and the largest item
            (its value when the engine starts is the size hint: 0 unknown).
        depth: Items ready ahead of the consumer, at most (with one thread:
            items in flight); the consumer may change it.
        threads: Threads to run; the consumer may change it.
        max_bytes: Most tensor bytes in flight, or ``None`` for no byte limit.
        measure_cpu: Sum the threads' CPU time (for a thread policy; it costs
            a system call per item).
        probe_first: With no size known, draw one item at a time until one is
            posted (a byte budget the user set is kept from the first item on).
        timeout: The consumer's longest wait for a run, or ``None``.
        in_order: Hand runs over in number order; ``False``: as they are posted.
        expected: The source's length, if known: the draw that finds its end
            waits until the loop asks past it.
        keep: A one-shot source: a stop keeps what was drawn and not handed
            over, for the next epoch (:meth:`read_ahead`).
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
        measure_cpu: bool = False,
        probe_first: bool = False,
        timeout: Timeout | None = None,
        in_order: bool = True,
        expected: int | None = None,
        keep: bool = False,
    ) -> None:
        self.shared = Shared(
            tasks,
            spec,
            record,
            depth=depth,
            threads=threads,
            max_bytes=max_bytes,
            measure_cpu=measure_cpu,
            probe_first=probe_first,
            in_order=in_order,
            expected=expected,
            keep=keep,
        )
        self.side = ThreadSide(self.shared)
        self.consumer = ConsumerSide(self.shared, timeout)
        self.reads = reads_units(tasks)  # threads read its draws' samples
        self.max_bytes = max_bytes

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """Every thread this engine started (some may have left)."""
        with self.shared.lock:
            return tuple(self.shared.started)

    def snapshot(self) -> Snapshot:
        """Return the engine's figures, read together under its lock."""
        return self.shared.snapshot()

    def start(self) -> None:
        """Start the threads (call once)."""
        live.add(self)
        self.set_threads(self.shared.tickets.threads)

    def set_threads(self, count: int) -> None:
        """Run ``count`` threads: start more now, or let extra ones leave after their item."""
        shared = self.shared
        with shared.lock:
            shared.tickets.threads = count
            starting = 0 if shared.over else max(count - shared.staying, 0)
            shared.staying += starting
            shared.running += starting
            shared.space.notify_all()  # a larger bound may free tickets; extras leave
        for _ in range(starting):
            held = Held()
            thread = threading.Thread(
                target=self._work, args=(held,), name=f"prefetch-{next(_thread_ids)}", daemon=True
            )
            with shared.lock:
                shared.started.append(thread)
            try:
                thread.start()
            except BaseException as error:  # e.g. Ctrl-C while Thread.start() waits
                if not thread.is_alive():
                    with shared.lock:
                        shared.staying -= 1
                    self._leave(None, held)
                interrupt = hidden_interrupt(error)
                if interrupt is not None:
                    raise interrupt from None
                raise

    def _work(self, held: Held) -> None:
        """The body of each thread: set up, produce, leave (never drops a failure)."""
        shared = self.shared
        final: Final | None = None
        with shared.lock:  # the lowest index no running thread has
            index = min(set(range(len(shared.indices) + 1)) - shared.indices)
            shared.indices.add(index)
        try:
            spec = shared.spec
            if self.reads and spec.seed is not None:  # sample_seed() knows each sample
                enter_fetch_thread(index, spec.seed, self.side.thread_count)
            if spec.setup is not None:
                spec.setup()
            final = Producer(self.side, held).produce()
        except BaseException as error:  # our own failure: handed over, never dropped
            final = self.side.fail(error)
        finally:
            leave_fetch_thread()
            with shared.lock:
                shared.indices.discard(index)
            self._leave(final, held)

    def _leave(self, final: Final | None, held: Held) -> None:
        """This thread leaves; the last one out is no longer live."""
        last = True
        try:
            last = self.side.leave(final, held)
        finally:
            if last:
                live.discard(self)

    def tell_after(self, reads: int | None) -> None:
        """Have the consumer's wait return once the threads read ``reads`` units in all."""
        with self.shared.lock:
            self.shared.tell_at = reads

    def told(self) -> bool:
        """Whether the reads :meth:`tell_after` watched are done (once; a hint read first)."""
        shared = self.shared
        if not shared.told:
            return False
        with shared.lock:
            told, shared.told = shared.told, False
            return told

    def set_depth(self, depth: int) -> None:
        """Change the depth and wake threads waiting for tickets."""
        with self.shared.lock:
            self.shared.tickets.depth = depth
            self.shared.space.notify_all()

    def stop(self) -> None:
        """Ask every thread to leave; safe from any thread, any number of times."""
        self.shared.stop()

    @property
    def keeps(self) -> bool:
        """Whether a stop keeps what was drawn and not handed over (a one-shot source)."""
        return self.shared.keep

    def keep_front(self, runs: list[Run]) -> None:
        """Keep ``runs``, which the consumer took and did not hand over, before the rest."""
        with self.shared.lock:
            self.shared.front = runs + self.shared.front

    def read_ahead(self) -> ReadAhead:
        """What was drawn and not handed over, in order (once the threads left; see ``keep``)."""
        carried = ReadAhead()
        with self.shared.lock:
            runs = self.shared.front + self.shared.handover.take()
            self.shared.front = []
        for run in runs:
            carried.add(Entry(item) for item in run.items)
            end = run.end
            if end is None or end.kind is Kind.STOPPED:
                continue
            if end.kind is Kind.END:
                carried.ended = True
            else:  # an error, in its place (a final one ends the epoch that raises it)
                carried.add([Entry(None, end.error)])
        return carried

    def join(self, *, timeout: float, stuck_grace: float) -> bool:
        """Wait for the threads to leave after :meth:`stop`; return whether they all did.

        Gives up after ``timeout`` seconds, or after ``stuck_grace`` seconds
        while a thread is inside the source (it leaves when the source
        returns). Never joins the current thread.
        """
        current = threading.current_thread()
        start = time.monotonic()
        for thread in self.threads:
            if thread is current:
                return False
            while thread.is_alive():
                waited = time.monotonic() - start
                with self.shared.lock:
                    inside = self.shared.tickets.unposted
                if waited > timeout or (inside and waited > stuck_grace):
                    return False
                thread.join(0.02)
        return True


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every live engine before the interpreter is torn down (bounded; see module)."""
    engines = list(live)
    for engine in engines:
        engine.stop()
    deadline = time.monotonic() + EXIT_GRACE
    for engine in engines:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        engine.join(timeout=remaining, stuck_grace=0.05)
