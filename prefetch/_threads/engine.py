"""``Engine``: one epoch's fetch threads and everything they share.

This is the only module that starts threads. An engine owns its source (a
:class:`~prefetch._threads.tasks.Tasks`), its threads (one, or N for parallel fetch:
one thread is simply N = 1), the results they post and the consumer's
position. The consumer end (:mod:`prefetch._threads.iterator`) calls
:meth:`Engine.take`; everything else happens here.

Invariants (every change here must keep them):

* **One lock.** Every shared field is read and written under ``_lock``, and
  every wait is a ``Condition`` wait on it that re-checks its condition, so
  no wake-up is lost and nothing relies on the GIL (free-threaded Python
  runs this as is). ``_draw_lock`` orders the draws; it is taken before
  ``_lock``, never while holding it. The lock is re-entrant so that a
  finalizer calling :meth:`stop` during garbage collection on a thread that
  holds it cannot deadlock.
* **Order.** Each draw takes the next sequence number under ``_draw_lock``;
  results are posted under their number and handed over in number order,
  whichever thread finishes first. So items arrive in source order and an
  error arrives as the same object after every item drawn before it.
* **Tickets bound what is in flight.** A thread takes a ticket before it
  draws and never while ``in_flight >= depth + threads - 1`` (exactly
  ``depth`` for one thread); the consumer returns it when it takes the item.
  With ``max_bytes``, a ticket is also refused while the bytes posted and not
  taken, plus the largest item seen for each draw not yet posted and for the
  new one, exceed it, unless nothing is in flight (one item always flows).
  Before any size is known (``size_hint``: the previous epoch's largest
  item), a budget the user set (``probe_first``) allows one draw at a time;
  the default budget lets every thread draw, as worker processes would.
* **Errors.** An ``Exception`` from a draw or a run is posted as ``RAISED``
  in its place and the epoch goes on (the source decides whether it has
  more). ``StopIteration`` from a draw (``END``, carrying the state read just
  after it) and a ``BaseException`` (``ERROR``) are *final*: no thread draws
  again, the earliest final wins, and it is posted only by the last thread
  to leave, after the source is released: a DataLoader's workers are gone
  before its error is seen.
* **Stop.** :meth:`stop` (from any thread, a finalizer included) makes every
  thread leave at its next check; one inside the source leaves when the
  source returns. Nothing a stopped engine fetched is kept. At interpreter
  exit every live engine is stopped and given :data:`EXIT_GRACE` seconds in
  all to release its source.
* **No reference to the consumer.** Threads hold the engine, never the
  iterator the user holds, so collecting an abandoned iterator runs its
  finalizer, which stops the engine.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time

from prefetch._shared.epoch import EpochRecord
from prefetch._shared.profiling import profiling, span
from prefetch._shared.structure import tensor_nbytes
from prefetch._threads.messages import END, ERROR, ITEM, RAISED, STOPPED, Final, Message, Snapshot
from prefetch._threads.tasks import ProducerSpec, Tasks

POLL_SECONDS = 0.1
"""How often a blocked side re-checks that the other side is still there."""
EXIT_GRACE = 1.0
"""Longest the interpreter's exit waits, in all, for engines to stop."""

_thread_ids = itertools.count(1)
_live: set[Engine] = set()  # engines with a thread that has not left


class Engine:
    """The threads of one epoch and the state they share; see the module invariants.

    Args:
        tasks: The source.
        spec: What each thread does besides drawing and running.
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
    ) -> None:
        self._tasks, self._spec, self._record = tasks, spec, record
        self._parallel = tasks.parallel  # False: the draw made the item (an iterator)
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)  # threads wait here for a ticket
        self._data = threading.Condition(self._lock)  # the consumer waits here
        self._draw_lock = threading.Lock()
        self._depth, self._threads_wanted, self._max_bytes = depth, threads, max_bytes
        self._results: dict[int, Message] = {}  # posted, by sequence number
        self._next_seq = 0  # under _draw_lock
        self._taken = 0  # the next sequence number the consumer hands over
        self._ready_in_row = 0  # results[taken], results[taken + 1], ... posted: how many
        self._in_flight = 0  # tickets taken and not returned
        self._unposted = 0  # of them, items drawn and not posted yet
        self._buffered_bytes = self._fetched = 0
        self._largest_item = record.largest_item
        self._probe_first = probe_first
        self._busy = self._blocked = self._cpu = 0.0
        self._threads_staying = 0  # threads that go on (not told to leave)
        self._threads_running = 0  # threads that have not left
        self._threads_waiting = 0  # threads blocked waiting for a ticket
        self._consumer_waiting = False
        self._releasing = False  # the last thread is releasing the source
        self._ended = self._stopped = False
        self._final: Final | None = None
        self._threads: list[threading.Thread] = []
        self._clock = time.thread_time if measure_cpu else _no_clock

    # -- the consumer's side --------------------------------------------------

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """Every thread this engine started (some may have left)."""
        with self._lock:
            return tuple(self._threads)

    def snapshot(self) -> Snapshot:
        """Return the engine's figures, read together under its lock."""
        with self._lock:
            return Snapshot(
                depth=self._depth,
                threads=self._threads_wanted,
                in_flight=self._in_flight,
                ready=len(self._results),
                waiting_threads=self._threads_waiting,
                fetched=self._fetched,
                max_bytes=self._max_bytes,
                buffered_bytes=self._buffered_bytes,
                largest_item=self._largest_item,
                busy_seconds=self._busy,
                blocked_seconds=self._blocked,
                cpu_seconds=self._cpu,
            )

    def start(self) -> None:
        """Start the threads (call once)."""
        _live.add(self)
        self.set_threads(self._threads_wanted)

    def set_threads(self, count: int) -> None:
        """Run ``count`` threads: start more now, or let extra ones leave after their item."""
        with self._lock:
            self._threads_wanted = count
            over = self._ended or self._stopped
            starting = 0 if over else max(count - self._threads_staying, 0)
            self._threads_staying += starting
            self._threads_running += starting
            self._space.notify_all()  # a larger bound may free tickets; extras leave
        for _ in range(starting):
            thread = threading.Thread(
                target=self._work, name=f"prefetch-{next(_thread_ids)}", daemon=True
            )
            with self._lock:
                self._threads.append(thread)
            try:
                thread.start()
            except BaseException:  # e.g. Ctrl-C while Thread.start() waits
                if not thread.is_alive():
                    with self._lock:
                        self._threads_staying -= 1
                    self._leave(None, ticket=False)
                raise
        if self._parallel:  # parallel fetch: the stats show the threads
            stats = self._record.stats
            peak = stats.peak_fetch_threads
            stats.fetch_threads = count
            stats.peak_fetch_threads = count if peak is None else max(peak, count)

    def set_depth(self, depth: int) -> None:
        """Change the depth and wake threads waiting for a ticket."""
        with self._lock:
            self._depth = depth
            self._space.notify_all()

    def take(self) -> tuple[Message, int, float]:
        """Return the next message, how many were ready in order, and seconds waited.

        Blocks until the next message is posted. Raises ``RuntimeError`` if
        every thread left without posting it.
        """
        with self._lock:
            seq = self._taken
            message = self._results.pop(seq, None)
            waited, ready = 0.0, 0
            if message is None:
                waited = time.perf_counter()
                if profiling():
                    with span("prefetch.wait"):
                        message = self._wait_for(seq)
                else:
                    message = self._wait_for(seq)
                waited = time.perf_counter() - waited
            else:
                ready = self._ready_in_row
            if message.kind == ITEM or message.kind == RAISED:
                self._taken = seq + 1
                in_row = self._ready_in_row
                self._ready_in_row = in_row - 1 if in_row else self._count_in_row(seq + 1)
                self._in_flight -= 1
                self._buffered_bytes -= message.nbytes
                if self._threads_waiting:
                    self._space.notify()
            return message, ready, waited

    def _count_in_row(self, seq: int) -> int:
        count = 0
        while seq + count in self._results:
            count += 1
        return count

    def _wait_for(self, seq: int) -> Message:
        self._consumer_waiting = True
        try:
            while True:
                self._data.wait(POLL_SECONDS)
                message = self._results.pop(seq, None)
                if message is not None:
                    return message
                if self._stopped:
                    return Message(STOPPED, None, None)
                if self._threads_running == 0 and not self._releasing:
                    names = ", ".join(repr(thread.name) for thread in self._threads)
                    msg = (
                        f"prefetch thread(s) {names} exited without delivering "
                        "an item, an error or the end of the data"
                    )
                    raise RuntimeError(msg)
        finally:
            self._consumer_waiting = False

    def stop(self) -> None:
        """Ask every thread to leave; safe from any thread, any number of times."""
        with self._lock:
            self._stopped = True
            self._results.clear()
            self._ready_in_row = 0
            self._space.notify_all()
            self._data.notify_all()

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
                with self._lock:
                    inside = self._unposted
                if waited > timeout or (inside and waited > stuck_grace):
                    return False
                thread.join(0.02)
        return True

    # -- the threads' side ----------------------------------------------------

    def _work(self) -> None:
        final: Final | None = None
        ticket = False  # whether this thread holds a ticket no posted message holds
        try:
            slot = self._add_fetch_slot()
            if self._spec.setup is not None:
                self._spec.setup()
            while final is None:
                if not ticket:
                    ticket = self._take_ticket()
                    if not ticket:
                        break
                # Posted (the message holds the ticket; the next one may be taken at
                # once), given back, or a final message (whose ticket this thread holds).
                final, ticket = self._fetch_one(slot)
        except BaseException as error:  # our own failure: handed over, never dropped
            final = Final(self._next_seq, Message(ERROR, error, None))
        finally:
            self._leave(final, ticket)

    def _add_fetch_slot(self) -> int:
        if not self._parallel:  # one thread over an iterator: source_seconds says it all
            return -1
        with self._lock:
            fetch_seconds = self._record.stats.fetch_seconds
            fetch_seconds.append(0.0)
            return len(fetch_seconds) - 1

    def _full(self) -> bool:
        if self._in_flight >= self._depth + self._threads_wanted - 1:
            return True
        limit = self._max_bytes
        if limit is None or self._in_flight == 0:
            return False
        if self._unposted and not self._largest_item and self._probe_first:  # one at a time
            return True
        return self._buffered_bytes + (self._unposted + 1) * self._largest_item > limit

    def _take_ticket(self) -> bool:
        """Wait for room to draw; return ``False`` if this thread is to leave instead."""
        with self._lock:
            blocked = 0.0
            while True:
                if self._stopped or self._ended:
                    return False
                if self._threads_staying > self._threads_wanted:  # fewer wanted: this one leaves
                    self._threads_staying -= 1
                    return False
                if not self._full():
                    break
                if not blocked:
                    blocked = time.perf_counter()
                self._threads_waiting += 1
                try:
                    self._space.wait(POLL_SECONDS)
                finally:
                    self._threads_waiting -= 1
            if blocked:
                self._blocked += time.perf_counter() - blocked
            self._in_flight += 1
            self._unposted += 1
            return True

    def _fetch_one(self, slot: int) -> tuple[Final | None, bool]:
        """Draw one task and run it (holding a ticket).

        Returns a final message instead of posting it, and whether this thread
        now holds a ticket (the final's, or the next item's).
        """
        started, cpu = time.perf_counter(), self._clock()
        spec = self._spec
        with self._draw_lock:
            if self._ended or self._stopped:
                self._give_back()
                return None, False
            seq = self._next_seq
            self._next_seq = seq + 1
            try:
                if profiling():
                    with span("prefetch.fetch"):
                        task = self._tasks.draw()
                else:
                    task = self._tasks.draw()
            except StopIteration:
                with self._lock:
                    self._ended = self._record.source_ended = True
                state = spec.read_state() if spec.read_state is not None else None
                return Final(seq, Message(END, None, state)), True
            except Exception as error:  # the source decides whether it goes on
                return None, self._post(seq, Message(RAISED, error, None), started, cpu, slot, 0.0)
            except BaseException as error:
                return self._final_error(seq, error), True
            state = spec.read_state() if spec.read_state is not None else None
        try:
            item, collate = self._tasks.run(task) if self._parallel else (task, 0.0)
            del task
            if spec.prepare is not None:
                item = spec.prepare(item)
            nbytes = tensor_nbytes(item) if self._max_bytes is not None else 0
        except Exception as error:  # the draw moved the state on: the error carries it
            return None, self._post(seq, Message(RAISED, error, state), started, cpu, slot, 0.0)
        except BaseException as error:
            return self._final_error(seq, error), True
        message = Message(ITEM, item, state, nbytes)
        return None, self._post(seq, message, started, cpu, slot, collate)

    def _final_error(self, seq: int, error: BaseException) -> Final:
        with self._lock:
            self._ended = True
        return Final(seq, Message(ERROR, error, None))

    def _give_back(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._unposted -= 1

    def _post(
        self, seq: int, message: Message, started: float, cpu: float, slot: int, collate: float
    ) -> bool:
        """Post ``message`` at ``seq``; take the next ticket if one is free (return whether)."""
        spent = time.perf_counter() - started
        cpu = self._clock() - cpu
        with self._lock:
            self._unposted -= 1
            stats = self._record.stats
            stats.source_seconds += spent
            if collate:
                stats.collate_seconds += collate
            if slot >= 0:
                stats.fetch_seconds[slot] += spent - collate
            self._busy += spent
            self._cpu += cpu
            if self._stopped:  # nobody will take it
                self._in_flight -= 1
                return False
            if message.kind == ITEM:
                self._fetched += 1
                nbytes = message.nbytes
                if nbytes:
                    self._buffered_bytes += nbytes
                    if nbytes > self._largest_item:
                        self._largest_item = self._record.largest_item = nbytes
                    if self._buffered_bytes > stats.peak_bytes:
                        stats.peak_bytes = self._buffered_bytes
            self._results[seq] = message
            if self._max_bytes is not None and self._fetched <= 1 and self._threads_waiting:
                self._space.notify_all()  # a size is known now, or no draw is in progress
            if seq == self._taken + self._ready_in_row:
                self._ready_in_row += 1
                if len(self._results) > self._ready_in_row:  # later ones, posted first, join
                    self._ready_in_row += self._count_in_row(seq + 1)
            if self._in_flight > stats.peak_items:
                stats.peak_items = self._in_flight
            if self._consumer_waiting and seq == self._taken:
                self._data.notify()
            if self._ended or self._threads_staying > self._threads_wanted or self._full():
                return False  # _take_ticket waits, or lets this thread leave
            self._in_flight += 1
            self._unposted += 1
            return True

    def _leave(self, final: Final | None, ticket: bool) -> None:
        """Leave; the last thread out releases the source, then posts the final message."""
        with self._lock:
            if ticket:  # a final message holds no ticket
                self._in_flight -= 1
                self._unposted -= 1
            if final is not None:
                self._ended = True
                if self._final is None or final.seq < self._final.seq:
                    self._final = final
                self._space.notify_all()
            self._threads_running -= 1
            last = self._threads_running == 0
            if last:
                self._releasing = True
                final = self._final
        if not last:
            return
        try:
            self._tasks.release()
        except BaseException as error:
            if (final is not None and final.message.kind == ERROR) or self._stopped:
                raise  # nobody would read it after the source's own error: threading.excepthook
            seq = final.seq if final is not None else self._next_seq
            final = Final(seq, Message(ERROR, error, None))
        finally:
            with self._lock:
                if final is not None and not self._stopped:
                    self._results[final.seq] = final.message
                if self._stopped:  # nobody will read them: free the fetched items now
                    self._results.clear()
                self._releasing = False
                self._data.notify_all()
            _live.discard(self)


def _no_clock() -> float:
    return 0.0


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every live engine before the interpreter is torn down (bounded; see module)."""
    engines = list(_live)
    for engine in engines:
        engine.stop()
    deadline = time.monotonic() + EXIT_GRACE
    for engine in engines:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        engine.join(timeout=remaining, stuck_grace=0.05)
