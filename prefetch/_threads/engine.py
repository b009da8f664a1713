"""``Engine``: one epoch's fetch threads and everything they share.

This is the only module that starts threads. An engine owns its source (a
:class:`~prefetch._threads.tasks.Tasks`), its threads (one, or N for parallel
fetch), the runs they post and the consumer's position. The consumer end
(:mod:`prefetch._threads.iterator`) calls :meth:`Engine.exchange`; the threads
run :mod:`prefetch._threads.producers`; everything they share is here.

Invariants (every change here must keep them):

* **One lock.** Every shared field is written under ``_lock`` and every
  decision is taken under it; every wait is a ``Condition`` wait on it that
  re-checks its condition, so no wake-up is lost. The threads read two
  fields without it, as hints only: ``consumer_waiting`` (whether to post
  now) and ``stopped`` (whether to draw again); a stale hint delays a post
  or a stop by one item, never loses one. Nothing relies on the GIL
  (free-threaded Python runs this as is; torch's own record of DataLoader
  worker pids did, and :mod:`prefetch._threads.torch_guard` locks it).
  ``_draw_lock`` orders parallel draws; it is taken before ``_lock``,
  never while holding it. The lock is re-entrant so that a finalizer
  calling :meth:`stop` during garbage collection on a thread that holds it
  cannot deadlock.
* **Order.** Each item, and each error, takes the next sequence number in
  draw order; runs are posted under the number of their first entry and
  handed over in number order, whichever thread finishes first. So items
  arrive in source order and an error arrives as the same object after
  every item drawn before it. Out of order (``in_order=False``), every run
  is handed over once posted, but a final one: it waits until every number
  before it was taken, and runs numbered after it are never handed over.
* **Runs.** Threads post :class:`~prefetch._threads.messages.Run` objects:
  one thread over an iterator takes every free ticket at once and posts
  what it drew in one run when its tickets are used up, at an error or the
  end, when the consumer waits for it, and at least every
  :data:`~prefetch._threads.producers.POST_AFTER` seconds; parallel threads post a run per item. The
  consumer takes every run posted in order in one locked section and gives
  tickets back in batches.
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
* **Errors.** An ``Exception`` from a draw or a run is posted as ``RAISED``
  in its place and the epoch goes on (the source decides whether it has
  more), unless the source is broken by it (a DataLoader iterator that lost
  a worker process: :meth:`~prefetch._threads.tasks.Tasks.broken`), which
  makes it an ``ERROR``. ``StopIteration`` from a draw (``END``, carrying
  the state read just after it) and a ``BaseException`` (``ERROR``) are
  *final*: no thread draws again, the earliest final wins, and it is posted
  only by the last thread to leave, after the source is released: a
  DataLoader's workers are gone before its error is seen.
* **Timeout.** With a :class:`~prefetch._threads.timeout.Timeout`, a consumer
  that waited longer for the run it wants stops the engine and takes a
  final ``ERROR`` run carrying the timeout error instead.
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

from prefetch._shared.epoch import EpochRecord
from prefetch._shared.profiling import profiling, span
from prefetch._threads.engine_threads import POLL_SECONDS, ThreadSide, live
from prefetch._threads.fetch_info import enter_fetch_thread, leave_fetch_thread
from prefetch._threads.messages import END, ERROR, STOPPED_RUN, Final, Message, Run, Snapshot
from prefetch._threads.producers import Held, draw_runs, fetch_in_parallel
from prefetch._threads.sample_fetch import fetch_samples
from prefetch._threads.tasks import ProducerSpec, Tasks
from prefetch._threads.timeout import Timeout

EXIT_GRACE = 1.0
"""Longest the interpreter's exit waits, in all, for engines to stop."""

_thread_ids = itertools.count(1)


class Engine(ThreadSide):
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
        self.in_order = in_order
        self._ahead: dict[int, int] = {}  # out of order: numbers of runs taken past _taken
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.clock = time.thread_time if measure_cpu else _no_clock
        self.parallel_python = not _gil_enabled()  # threads run Python at the same time
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)  # threads wait here for tickets
        self._data = threading.Condition(self._lock)  # the consumer waits here
        self.draw_lock = threading.Lock()  # orders parallel draws (see the invariants)
        self.next_seq = 0  # the next sequence number a draw takes (under draw_lock)
        self._depth, self._threads_wanted = depth, threads
        self._posted: dict[int, Run] = {}  # by the number of each run's first entry
        self._taken = 0  # the next sequence number the consumer takes
        self._in_flight = 0  # tickets taken and not given back
        self._unposted = 0  # of them, held by threads (drawing, or drawn and not posted)
        self._buffered_bytes = self._fetched = 0
        self._largest_item = record.largest_item
        self._probe_first = probe_first
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
        self._sample_grain = bool(getattr(tasks, "sample_grain", False))  # see _limit

    # -- the consumer's side --------------------------------------------------

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """Every thread this engine started (some may have left)."""
        with self._lock:
            return tuple(self._threads)

    def snapshot(self) -> Snapshot:
        """Return the engine's figures, read together under its lock."""
        with self._lock:
            ready, seq = 0, self._taken
            run = self._posted.get(seq)
            while run is not None:
                ready += run.numbers
                seq += run.numbers
                run = self._posted.get(seq)
            if not self.in_order:
                ready = sum(run.numbers for run in self._posted.values())
            return Snapshot(
                depth=self._depth,
                threads=self._threads_wanted,
                in_flight=self._in_flight,
                ready=ready,
                posted=sum(run.numbers for run in self._posted.values()),
                waiting_threads=self._threads_waiting,
                fetched=self._fetched,
                max_bytes=self.max_bytes,
                buffered_bytes=self._buffered_bytes,
                largest_item=self._largest_item,
                busy_seconds=self._busy,
                blocked_seconds=self._blocked,
                cpu_seconds=self._cpu,
            )

    def start(self) -> None:
        """Start the threads (call once)."""
        live.add(self)
        self.set_threads(self._threads_wanted)

    def set_threads(self, count: int) -> None:
        """Run ``count`` threads: start more now, or let extra ones leave after their item."""
        with self._lock:
            self._threads_wanted = count
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
                    self.leave(None, held)
                raise
        if self.tasks.parallel:  # parallel fetch: the stats show the threads
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
            if self.tasks.parallel and self.spec.seed is not None:
                enter_fetch_thread(index, self.spec.seed, self.thread_count)
            if self.spec.setup is not None:
                self.spec.setup()
            if self._sample_grain:
                produce = fetch_samples
            else:
                produce = fetch_in_parallel if self.tasks.parallel else draw_runs
            final = produce(self, held)
        except BaseException as error:  # our own failure: handed over, never dropped
            final = Final(self.next_seq, Message(ERROR, error, None))
        finally:
            leave_fetch_thread()
            with self._lock:
                self._indices.discard(index)
            self.leave(final, held)

    def set_depth(self, depth: int) -> None:
        """Change the depth and wake threads waiting for tickets."""
        with self._lock:
            self._depth = depth
            self._space.notify_all()

    def exchange(
        self, returned: int, returned_bytes: int, *, wait: bool
    ) -> tuple[list[Run], float]:
        """Give back tickets, and take every run posted in order.

        Args:
            returned: Items (and ``RAISED`` errors) handed to the loop since
                the last exchange: their tickets are given back.
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
                self._in_flight -= returned
                self._buffered_bytes -= returned_bytes
            runs = self._take_posted()
            if runs or not wait:
                if returned and self._threads_waiting and not self._threads_woken:
                    self._wake_threads()
                return runs, 0.0
            if self._threads_waiting and not self._threads_woken and self._free():
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

    def _take_posted(self) -> list[Run]:
        if not self.in_order:
            return self._take_ready()
        runs: list[Run] = []
        seq, posted = self._taken, self._posted
        run = posted.pop(seq, None)
        while run is not None:
            runs.append(run)
            seq += run.numbers
            run = posted.pop(seq, None)
        self._taken = seq
        return runs

    def _take_ready(self) -> list[Run]:
        """Out of order: every run posted, but a final one before its turn (see invariants)."""
        posted, ahead = self._posted, self._ahead
        finals = [seq for seq, run in posted.items() if _is_final(run)]
        last = min(finals) if finals else None  # later runs are never handed over
        runs: list[Run] = []
        for seq in sorted(posted):
            if last is not None and seq >= last:
                break
            run = posted.pop(seq)
            runs.append(run)
            ahead[seq] = run.numbers
        taken = self._taken
        while taken in ahead:
            taken += ahead.pop(taken)
        if last is not None and taken == last:
            runs.append(posted.pop(last))
            taken += 1
        self._taken = taken
        return runs

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
                        return [Run([], end=Message(ERROR, timeout.error(), None))]
                    wait = min(wait, POLL_SECONDS)
                self._data.wait(wait)
                runs = self._take_posted()
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
            self._posted.clear()
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


def _is_final(run: Run) -> bool:
    """Whether ``run`` ends the epoch (``END`` or ``ERROR``, not a ``RAISED`` error)."""
    return run.end is not None and run.end.kind in (END, ERROR)


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
