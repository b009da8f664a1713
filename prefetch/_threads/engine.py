"""``Engine``: one epoch's fetch threads and everything they share.

This is the only module that starts threads. An engine owns its source (a
:class:`~prefetch._threads.tasks.Tasks`), its threads (one, or N for parallel
fetch), the runs they post and the consumer's position. A batch goes one
way: the engine starts its threads, each runs a producer
(:mod:`prefetch._threads.producers` over an iterator,
:mod:`prefetch._threads.sample_fetch` over a DataLoader's samples), typed
against :class:`~prefetch._threads.thread_side.ThreadSide` and never
importing this module; a producer posts runs through :meth:`Engine.post`
into the :class:`~prefetch._threads.handover.Handover`; the consumer end
(:mod:`prefetch._threads.iterator`) takes them with :meth:`Engine.exchange`.
What is in flight is counted by :class:`~prefetch._threads.tickets.Tickets`.
Both are plain data under the engine's lock.

Invariants (every change here must keep them):

* **One lock.** Every shared field is written under ``_lock`` and every
  decision is taken under it; every wait is a ``Condition`` wait on it that
  re-checks its condition, so no wake-up is lost. The threads read two
  fields without it, as hints only: ``consumer_waiting`` (whether to post
  now) and ``stopped`` (whether to draw again); a stale hint delays a post
  or a stop by one item, never loses one. Nothing relies on the GIL
  (free-threaded Python runs this as is; torch's own record of DataLoader
  worker pids did, and :mod:`prefetch._torch.worker_pids` locks it).
  ``draw_lock`` orders parallel draws; it is taken before ``_lock``,
  never while holding it. Sequence numbers (``next_seq``) are taken and
  recorded under ``_lock``. The lock is re-entrant so that a finalizer
  calling :meth:`stop` during garbage collection on a thread that holds it
  cannot deadlock.
* **Order.** Each item, and each error, takes the next sequence number in
  draw order; runs are posted under the number of their first entry and
  handed over in number order, whichever thread finishes first
  (:mod:`prefetch._threads.handover`, which also says what changes out of
  order). So items arrive in source order and an error arrives as the same
  object after every item drawn before it.
* **Runs.** Threads post :class:`~prefetch._threads.messages.Run` objects:
  one thread over an iterator takes every free ticket at once and posts
  what it drew in one run when its tickets are used up, at an error or the
  end, when the consumer waits for it, and at least every
  :data:`~prefetch._threads.producers.POST_AFTER` seconds; parallel threads
  post a run per batch. The consumer takes every run posted in order in
  one locked section and gives tickets back in batches.
* **Tickets bound what is in flight.** A thread takes a ticket for each draw,
  never while ``in_flight >= depth + threads - 1`` (exactly ``depth`` for
  one thread); the consumer gives it back once the item is handed to the
  loop. With ``max_bytes``, tickets are also refused while the bytes posted
  and not handed over, plus the largest item seen for each ticket taken and
  not posted and for the new one, exceed it, unless nothing is in flight
  (one item always flows). Before any size is known (the record's largest
  item, carried from earlier epochs), a budget the user set
  (``probe_first``) allows one draw at a time; the default budget does not.
* **Wake-ups.** A side is woken only when it waits: the consumer when the
  run it waits for is posted; threads waiting for tickets when the consumer
  gives tickets back (every quarter of the bound, at most) or is about to
  wait.
* **Errors.** What a thread catches becomes a message in one place,
  :func:`~prefetch._threads.messages.message_for`. An ``Exception`` from a
  draw or a read is posted as ``RAISE_AND_GO_ON`` in its place and the
  epoch goes on (the source decides whether it has more), unless the source
  is broken by it (a DataLoader iterator that lost a worker process:
  :meth:`~prefetch._threads.tasks.Tasks.broken`), which makes it
  ``RAISE_AND_END``. ``StopIteration`` from a draw (``END``, carrying the
  state read just after it) and a ``BaseException`` (``RAISE_AND_END``) are
  *final*: no thread draws again, the earliest final wins, and it is posted
  only by the last thread to leave, after the source is released: a
  DataLoader's workers are gone before its error is seen.
* **Timeout.** With a :class:`~prefetch._threads.timeout.Timeout`, a consumer
  that waited longer for the run it wants stops the engine and takes a
  final ``RAISE_AND_END`` run carrying the timeout error instead.
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
import sys
import threading
import time
from collections.abc import Callable

from prefetch._shared.epoch import EpochRecord
from prefetch._shared.profiling import profiling, span
from prefetch._threads.fetch_info import enter_fetch_thread, leave_fetch_thread
from prefetch._threads.handover import Handover
from prefetch._threads.messages import STOPPED_RUN, Final, Kind, Message, Run, Snapshot
from prefetch._threads.producers import draw_runs
from prefetch._threads.sample_fetch import fetch_samples
from prefetch._threads.tasks import BoardTasks, ProducerSpec, Tasks
from prefetch._threads.tickets import Held, Tickets
from prefetch._threads.timeout import Timeout

POLL_SECONDS = 0.1
"""How often a blocked side re-checks that the other side is still there."""
EXIT_GRACE = 1.0
"""Longest the interpreter's exit waits, in all, for engines to stop."""

_thread_ids = itertools.count(1)
live: set[Engine] = set()
"""Engines with a thread that has not left (the interpreter's exit stops them)."""


class Engine:
    """The threads of one epoch and the state they share; see the module invariants.

    It is the :class:`~prefetch._threads.thread_side.ThreadSide` its producers see.

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
        timeout: The consumer's longest wait for a run, or ``None``.
        in_order: Hand runs over in number order; ``False``: as they are posted.
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
    ) -> None:
        self.tasks, self.spec, self.record = tasks, spec, record
        self.parallel = isinstance(tasks, BoardTasks)  # several threads read its draws
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.clock = time.thread_time if measure_cpu else _no_clock
        self.parallel_python = not _gil_enabled()  # threads run Python at the same time
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)  # threads wait here for tickets
        self._data = threading.Condition(self._lock)  # the consumer waits here
        self.draw_lock = threading.Lock()  # orders parallel draws (see the invariants)
        self.next_seq = 0  # the next sequence number a draw takes
        self._tickets = Tickets(
            depth=depth,
            threads=threads,
            max_bytes=max_bytes,
            largest_item=record.largest_item,
            probe_first=probe_first,
        )
        self._handover = Handover(in_order=in_order)
        self._fetched = 0  # items posted, in all
        self._busy = self._blocked = self._cpu = 0.0
        self._threads_staying = 0  # threads that go on (not told to leave)
        self._threads_running = 0  # threads that have not left
        self._threads_waiting = 0  # threads blocked waiting for a ticket
        self._threads_woken = False  # they were woken and have not waited again since
        # Hints the threads read without the lock (written under it): see the invariants.
        self.consumer_waiting = False  # whether the consumer waits for a run
        self._releasing = False  # the last thread is releasing the source
        self._ended = False
        self.stopped = False  # whether stop() was called
        self._final: Final | None = None
        self._threads: list[threading.Thread] = []
        self._indices: set[int] = set()  # thread indices in use (see fetch_info)

    # -- the consumer's side --------------------------------------------------

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """Every thread this engine started (some may have left)."""
        with self._lock:
            return tuple(self._threads)

    def snapshot(self) -> Snapshot:
        """Return the engine's figures, read together under its lock."""
        with self._lock:
            tickets = self._tickets
            return Snapshot(
                depth=tickets.depth,
                threads=tickets.threads,
                in_flight=tickets.in_flight,
                ready=self._handover.ready(),
                posted=self._handover.posted(),
                waiting_threads=self._threads_waiting,
                fetched=self._fetched,
                max_bytes=self.max_bytes,
                buffered_bytes=tickets.buffered_bytes,
                largest_item=tickets.largest_item,
                busy_seconds=self._busy,
                blocked_seconds=self._blocked,
                cpu_seconds=self._cpu,
            )

    def start(self) -> None:
        """Start the threads (call once)."""
        live.add(self)
        self.set_threads(self._tickets.threads)

    def set_threads(self, count: int) -> None:
        """Run ``count`` threads: start more now, or let extra ones leave after their item."""
        with self._lock:
            self._tickets.threads = count
            over = self._ended or self.stopped
            starting = 0 if over else max(count - self._threads_staying, 0)
            self._threads_staying += starting
            self._threads_running += starting
            self._space.notify_all()  # a larger bound may free tickets; extras leave
        for _ in range(starting):
            held = Held()
            thread = threading.Thread(
                target=self._work, args=(held,), name=f"prefetch-{next(_thread_ids)}", daemon=True
            )
            with self._lock:
                self._threads.append(thread)
            try:
                thread.start()
            except BaseException:  # e.g. Ctrl-C while Thread.start() waits
                if not thread.is_alive():
                    with self._lock:
                        self._threads_staying -= 1
                    self._leave(None, held)
                raise
        if self.parallel:  # parallel fetch: the stats show the threads
            stats = self.record.stats
            peak = stats.peak_fetch_threads
            stats.fetch_threads = count
            stats.peak_fetch_threads = count if peak is None else max(peak, count)

    def _work(self, held: Held) -> None:
        """The body of each thread: produce, then leave (never drops a failure)."""
        final: Final | None = None
        with self._lock:  # the lowest index no running thread has
            index = min(set(range(len(self._indices) + 1)) - self._indices)
            self._indices.add(index)
        try:
            tasks = self.tasks
            if isinstance(tasks, BoardTasks):
                if self.spec.seed is not None:
                    enter_fetch_thread(index, self.spec.seed, self.thread_count)
                if self.spec.setup is not None:
                    self.spec.setup()
                final = fetch_samples(self, tasks, held)
            else:
                if self.spec.setup is not None:
                    self.spec.setup()
                final = draw_runs(self, tasks, held)
        except BaseException as error:  # our own failure: handed over, never dropped
            with self._lock:
                seq = self.next_seq
            final = Final(seq, Message(Kind.RAISE_AND_END, error, None))
        finally:
            leave_fetch_thread()
            with self._lock:
                self._indices.discard(index)
            self._leave(final, held)

    def set_depth(self, depth: int) -> None:
        """Change the depth and wake threads waiting for tickets."""
        with self._lock:
            self._tickets.depth = depth
            self._space.notify_all()

    def exchange(
        self, returned: int, returned_bytes: int, *, wait: bool
    ) -> tuple[list[Run], float]:
        """Give back tickets, and take every run posted in order.

        Args:
            returned: Items (and ``RAISE_AND_GO_ON`` errors) handed to the loop
                since the last exchange: their tickets are given back.
            returned_bytes: Their tensor bytes (0 without a byte bound).
            wait: Block until a run is posted if none is.

        Returns:
            The runs (``[STOPPED_RUN]`` once the engine stopped; empty only
            without ``wait``) and the seconds waited.

        Raises:
            RuntimeError: Every thread left without posting the run waited for.
        """
        with self._lock:
            if returned:
                self._tickets.given_back(returned, returned_bytes)
            runs = self._handover.take()
            if runs or not wait:
                if returned and self._threads_waiting and not self._threads_woken:
                    self._wake_threads()
                return runs, 0.0
            if self._threads_waiting and not self._threads_woken and self._tickets.free():
                self._wake_threads()  # about to wait: whatever is free must be used
            started = time.perf_counter()
            if profiling():
                with span("prefetch.wait"):
                    runs = self._wait_for_run()
            else:
                runs = self._wait_for_run()
            return runs, time.perf_counter() - started

    def _wake_threads(self) -> None:
        """Wake threads waiting for tickets (holding the lock); the tests' seam for a lost one."""
        self._threads_woken = True  # until one of them waits again
        self._space.notify_all()

    def _wait_for_run(self) -> list[Run]:
        self.consumer_waiting = True
        timeout = self.timeout
        deadline = time.monotonic() + timeout.seconds if timeout is not None else 0.0
        try:
            while True:
                if self.stopped:
                    return [STOPPED_RUN]
                wait = POLL_SECONDS
                if timeout is not None:
                    wait = deadline - time.monotonic()
                    if wait <= 0:  # the epoch ends here: nothing fetched is kept
                        self.stop()
                        message = Message(Kind.RAISE_AND_END, timeout.error(), None)
                        return [Run([], end=message)]
                    wait = min(wait, POLL_SECONDS)
                self._data.wait(wait)
                runs = self._handover.take()
                if runs:
                    return runs
                if self._threads_running == 0 and not self._releasing and not self.stopped:
                    names = ", ".join(repr(thread.name) for thread in self._threads)
                    msg = (
                        f"prefetch thread(s) {names} exited without delivering "
                        "an item, an error or the end of the data"
                    )
                    raise RuntimeError(msg)
        finally:
            self.consumer_waiting = False

    def stop(self) -> None:
        """Ask every thread to leave; safe from any thread, any number of times."""
        with self._lock:
            self.stopped = True
            self._handover.clear()
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
                    inside = self._tickets.unposted
                if waited > timeout or (inside and waited > stuck_grace):
                    return False
                thread.join(0.02)
        return True

    # -- the threads' side (the ThreadSide protocol) ----------------------------

    def _wake_consumer(self) -> None:
        """Wake the consumer waiting for a run (holding the lock); the tests' seam likewise."""
        self._data.notify()

    def thread_count(self) -> int:
        """The threads wanted now (what :func:`~prefetch.fetch_info` reports)."""
        with self._lock:
            return self._tickets.threads

    @property
    def over(self) -> bool:
        """Whether the epoch ended or the engine stopped (a hint read without the lock)."""
        return self._ended or self.stopped

    def number(self) -> int:
        """Take the next sequence number for one draw (called under ``draw_lock``)."""
        with self._lock:
            seq = self.next_seq
            self.next_seq = seq + 1
            return seq

    def take_tickets(
        self, held: Held, most: int, *, unless: Callable[[], bool] | None = None
    ) -> int:
        """Wait for free tickets and take up to ``most``; 0: the thread is to leave instead.

        With ``unless``, return -1 (no ticket) as soon as ``unless()`` is true:
        a sample-grain thread has units to read (:meth:`work_added` wakes it).
        """
        with self._lock:
            blocked = 0.0
            while True:
                if self.stopped:
                    return 0
                if unless is not None and unless():
                    return -1
                if self._ended:
                    return 0
                if self._threads_staying > self._tickets.threads:  # fewer wanted: it leaves
                    self._threads_staying -= 1
                    return 0
                if self._tickets.free():
                    break
                if not blocked:
                    blocked = time.perf_counter()
                self._threads_waiting += 1
                self._threads_woken = False
                try:
                    self._space.wait(POLL_SECONDS)
                finally:
                    self._threads_waiting -= 1
            if blocked:
                self._blocked += time.perf_counter() - blocked
            return self._tickets.take(held, most)

    def end(self, source_ended: bool) -> None:
        """Mark the epoch ended (a final message is coming): no thread draws again."""
        with self._lock:
            self._ended = True
            if source_ended:
                self.record.source_ended = True

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
        """Post ``run`` at ``seq``, give back ``unused`` tickets and take up to ``take`` more.

        Returns the tickets taken (without waiting: 0 if none is free).
        ``seconds`` (``cpu``) is the time the thread spent making the run; a
        parallel thread also gives its ``slot`` in ``stats.fetch_seconds`` and
        the seconds spent in ``collate_fn``. The numbers ``run`` covers are
        taken: the next draw's is past them.
        """
        with self._lock:
            tickets = self._tickets
            tickets.posted(held, run.numbers + unused, unused)
            self.next_seq = max(self.next_seq, seq + run.numbers)
            self._count(slot, seconds - collate, cpu, collate=collate)
            if self.stopped:  # nobody will take it
                tickets.in_flight -= run.numbers
                return 0
            self._fetched += len(run.items)
            stats = self.record.stats
            if run.sizes:
                tickets.buffered(run.sizes)
                self.record.largest_item = max(self.record.largest_item, tickets.largest_item)
                stats.peak_bytes = max(stats.peak_bytes, tickets.buffered_bytes)
                if self._threads_waiting and self._fetched <= len(run.items):
                    self._space.notify_all()  # a size is known now
            if run.items or run.end is not None:
                self._handover.post(seq, run)
            stats.peak_items = max(stats.peak_items, tickets.in_flight)
            if self.consumer_waiting and self._handover.due(seq):
                self._wake_consumer()
            if not take or self._ended or self._threads_staying > tickets.threads:
                return 0
            return tickets.take(held, take)

    def give_back_ticket(self, held: Held) -> None:
        """Return one ticket ``held`` took and did not use (a sample-grain thread reads instead)."""
        with self._lock:
            self._tickets.dropped(held, 1)
            if self._threads_waiting:
                self._space.notify_all()

    def work_added(self, samples: int) -> None:
        """A batch's units were put on the board: wake the threads waiting for tickets."""
        with self._lock:
            stats = self.record.stats
            stats.peak_samples = max(stats.peak_samples, samples)
            if self._threads_waiting:
                self._space.notify_all()

    def account(self, slot: int, seconds: float, cpu: float, *, reads: int = 0) -> None:
        """Count ``seconds`` (``cpu``) a thread spent without posting (``slot`` -1: drawing)."""
        with self._lock:
            self._count(slot, seconds, cpu, reads=reads)

    def _count(
        self, slot: int, seconds: float, cpu: float, *, collate: float = 0.0, reads: int = 0
    ) -> None:
        """Add a thread's time to the stats and the engine's sums (holding the lock)."""
        stats = self.record.stats
        stats.source_seconds += seconds + collate
        if slot >= 0:
            stats.fetch_seconds[slot] += seconds
            stats.fetch_reads[slot] += reads
            stats.collate_seconds += collate
        self._busy += seconds + collate
        self._cpu += cpu

    def add_fetch_slot(self) -> int:
        """Give a parallel thread its entry in ``stats.fetch_seconds``; return its index."""
        with self._lock:
            stats = self.record.stats
            stats.fetch_seconds.append(0.0)
            stats.fetch_reads.append(0)
            return len(stats.fetch_seconds) - 1

    def _leave(self, final: Final | None, held: Held) -> None:
        """Leave; the last thread out releases the source, then posts the final message."""
        with self._lock:
            self._tickets.dropped(held, held.tickets)  # a final message holds no ticket
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
            self.tasks.release()
        except BaseException as error:
            if (final is not None and final.message.kind is Kind.RAISE_AND_END) or self.stopped:
                raise  # nobody would read it after the source's own error: threading.excepthook
            with self._lock:
                seq = final.seq if final is not None else self.next_seq
            final = Final(seq, Message(Kind.RAISE_AND_END, error, None))
        finally:
            with self._lock:
                if final is not None and not self.stopped:
                    self._handover.post(final.seq, Run([], end=final.message))
                if self.stopped:  # nobody will read them: free the fetched items now
                    self._handover.clear()
                self._releasing = False
                self._data.notify_all()
            live.discard(self)


def _no_clock() -> float:
    return 0.0


def _gil_enabled() -> bool:
    """Whether the GIL is enabled (always, before free-threaded Python 3.13)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


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
