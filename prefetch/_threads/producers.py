"""``Producer``: what each of an engine's threads runs, from the source to a posted run.

Every thread of an engine runs one :class:`Producer` loop until the epoch
ends or the engine stops. Each turn does one of two steps:

1. **Read.** If the source reads its draws in parallel (a
   :class:`~prefetch._threads.tasks.BoardTasks`: a map-style DataLoader under
   ``fetch_threads``) and a batch on its
   :class:`~prefetch._threads.sample_board.SampleBoard` has a unit left, take
   the earliest such unit and read it outside any lock. The thread that reads
   a batch's last unit collates it and posts it at the batch's number, with
   the ticket the batch held.
2. **Draw.** Otherwise take tickets and draw, in order, under the engine's
   draw lock, each draw taking the next sequence number. A draw whose task is
   the item (any iterator) joins the run the thread is building; a draw with
   units to read goes on the board, and the thread goes back to step 1.

One thread over an iterator takes every free ticket at once and posts what it
drew as one :class:`~prefetch._threads.messages.Run` when its tickets are used
up, at an error or the end, when the consumer waits for it (after a few, or
after :data:`POST_AFTER` seconds), and at least every :data:`POST_AFTER`
seconds (the items per post follow the measured rate), and after any draw
that itself took :data:`POST_AFTER` or more (the source turned slow: what it
holds would otherwise wait through the next draw too). A fast source and a
fast loop meet once per run, not once per item. Such a thread waits for its
next tickets in the same hold of the lock as its post (the consumer it woke
gets the GIL as soon as it waits). Parallel threads take one ticket per batch.

What a thread catches becomes a message in one place,
:func:`~prefetch._threads.messages.message_for`. A final message (the end, a
``BaseException``, an error the source cannot go on after) ends the loop and
is returned to the engine, which posts it once the last thread has left. It
keeps every invariant of :mod:`prefetch._threads.engine` and those of the
board; a batch goes one way: source, board, run, hand-over.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from prefetch._shared.profiling import profiling, span
from prefetch._shared.structure import tensor_nbytes
from prefetch._threads.messages import Final, Message, Run, message_for
from prefetch._threads.sample_board import Reading
from prefetch._threads.tasks import BoardTasks, reads_units
from prefetch._threads.thread_side import ThreadSide
from prefetch._threads.tickets import Held

POST_AFTER = 50e-6
"""Longest a thread holds drawn items back before posting them (to post many at once)."""
ALL = sys.maxsize
"""Take every free ticket."""
ACCOUNT_EVERY = 8
"""Reads a thread counts up before it adds them to the stats (under the engine's lock)."""


class Producer:
    """One thread's loop over its engine's source; see the module.

    Args:
        side: The engine's state, as its threads see it.
        held: The tickets this thread holds (the engine gives them back when it leaves).
    """

    def __init__(self, side: ThreadSide, held: Held) -> None:
        self.side, self.held = side, held
        self.unaccounted: list[Any] = [0.0, 0.0, 0]  # seconds, CPU seconds, reads: see _read
        shared = side.shared
        self.shared = shared
        tasks = shared.tasks
        self.board_tasks: BoardTasks | None = tasks if reads_units(tasks) else None
        self.most = ALL if self.board_tasks is None else 1  # tickets a draw step takes
        self.slot = -1  # this thread's entry in stats.fetch_seconds (threads that read)
        self.post_every = 1  # items per post: one until the rate is known

    def produce(self) -> Final | None:
        """Read and draw until the epoch ends; return its final message, or ``None``."""
        side, shared, held = self.side, self.shared, self.held
        board = self.board_tasks.board if self.board_tasks is not None else None
        unless = board.has_work if board is not None else None
        if board is not None:
            self.slot = side.add_fetch_slot()
        count = 0  # tickets taken for the next draws
        work: tuple[Reading, int] | None = None  # a unit to read next
        try:
            while not shared.stopped:
                if board is not None:
                    if work is None:
                        work = board.take()
                    if work is not None:
                        if count:  # it would wait unused while this thread reads
                            side.give_back_ticket(held)
                            count = 0
                        final, work = self._read(*work)
                        if final is not None:
                            return final
                        continue
                    self._account()  # before it waits or draws: the figures are current
                if shared.over:
                    return None  # ended: no more draws, and nothing left here to read
                if not count:
                    count = side.take_tickets(held, self.most, unless=unless)
                    if not count:
                        return None
                    count = max(count, 0)  # -1: no ticket, but units came to read
                    continue
                final, count = self._draw(count)
                if final is not None:
                    return final
                if not count and board is None:  # its post waited for tickets: it is to leave
                    return None
            return None
        finally:
            self._account()
            if board is not None and shared.stopped:  # the batches on it hold tickets
                held.tickets += board.cut(0)

    def _draw(self, count: int) -> tuple[Final | None, int]:
        """Draw with ``count`` tickets; return a final message and the tickets now held."""
        side, shared, held = self.side, self.shared, self.held
        tasks, board_tasks = shared.tasks, self.board_tasks
        prepare, read_state = shared.spec.prepare, shared.spec.read_state
        draw = tasks.draw
        items: list[Any] = []
        states: list[Any] | None = [] if read_state is not None else None
        sizes: list[int] | None = [] if shared.max_bytes is not None else None
        end: Message | None = None
        to_read: Reading | None = None  # a batch put on the board
        traced = profiling()
        collate = 0.0
        with shared.draw_lock:
            if shared.over or (board_tasks is not None and board_tasks.board.has_work()):
                return None, count  # keep the tickets for later
            start = shared.next_seq  # the number of the run's first entry
            # Items a waiting consumer is woken for at once. With the GIL it cannot run before
            # this thread blocks or waits in the source (then POST_AFTER posts): no early post.
            wake = max(1, count // 4) if shared.parallel_python else count
            used = 0
            mark = now = time.perf_counter()
            while used < count and not shared.stopped:
                used += 1  # this draw's ticket: its item's, its error's, or the final's
                seq = shared.next_seq
                shared.next_seq = seq + 1
                try:
                    if traced:
                        with span("prefetch.fetch"):
                            item = draw()
                    else:
                        item = draw()
                except BaseException as error:
                    end = message_for(
                        error, drawing=True, read_state=read_state, broken=tasks.broken
                    )
                    break
                state = read_state() if read_state is not None else None
                try:
                    if board_tasks is not None:
                        reading = board_tasks.plan(seq, item, state, side.thread_count())
                        if reading.units:  # to read: the batch holds the ticket now
                            held.tickets -= 1
                            board_tasks.board.add(reading)
                            to_read = reading
                            break  # one ticket a draw: nothing else was drawn
                        item, collate = board_tasks.join(reading)  # an empty batch
                    if prepare is not None:
                        item = prepare(item)
                    if sizes is not None:
                        sizes.append(tensor_nbytes(item))
                except BaseException as error:  # the draw moved the state on: it carries it
                    end = message_for(error, drawing=False, state=state)
                    break
                items.append(item)
                if states is not None:
                    states.append(state)
                drawn = len(items)
                # A draw that took POST_AFTER or more: the source is slow now, and the items
                # held would wait through its next draw too. Post them.
                now, last = time.perf_counter(), now
                slow = now - last >= POST_AFTER
                waited_for = shared.consumer_waiting and (drawn >= wake or now - mark >= POST_AFTER)
                if used < count and (drawn >= self.post_every or slow or waited_for):
                    side.post(start, Run(items, states, sizes), held, seconds=now - mark)
                    self._pace(now - mark, drawn)
                    start += drawn
                    items = []
                    states = [] if states is not None else None
                    sizes = [] if sizes is not None else None
                    mark = now
            ends = end is not None and end.kind.final
            if ends:  # before the lock goes: no thread draws after the end
                side.end(source_ended=end is not None and end.error is None)
        spent = time.perf_counter() - mark
        if to_read is not None:
            side.account(-1, spent, 0.0)
            assert board_tasks is not None  # only a board takes batches to read
            side.work_added(board_tasks.board.peak_samples)
            return None, 0
        if ends:  # its ticket stays held until the thread leaves
            side.post(start, Run(items, states, sizes), held, seconds=spent, unused=count - used)
            assert end is not None
            return Final(start + len(items), end), 0
        if items:
            self._pace(spent, len(items))
        run = Run(items, states, sizes, end)
        if board_tasks is not None:  # threads that read look at the board first
            count = side.post(start, run, held, seconds=spent, unused=count - used, collate=collate)
            return None, count
        # An iterator's thread waits for its next tickets in the post (0: it is to leave),
        # holding nothing the loop is handed (the run's list is the one the loop empties) and
        # no error: its traceback would hold the loop's frames, and the iterator in them.
        wait = end is None
        item = state = end = None
        count = side.post(
            start, run, held, seconds=spent, unused=count - used, take=self.most, wait=wait
        )
        del run
        if not count and not wait:
            count = side.take_tickets(held, self.most)
        return None, count

    def _pace(self, seconds: float, items: int) -> None:
        """Pace the next post: ``POST_AFTER`` seconds of draws (``items`` took ``seconds``)."""
        self.post_every = ALL if seconds <= 0.0 else max(1, int(POST_AFTER * items / seconds))

    def _read(self, batch: Reading, unit: int) -> tuple[Final | None, tuple[Reading, int] | None]:
        """Read one unit; post its batch if that completed it, else take the next unit.

        Returns a final message, if any, and the unit to read next (``None``: look again).
        """
        shared = self.shared
        assert self.board_tasks is not None  # only threads that read get units
        board_tasks = self.board_tasks
        started, cpu = time.perf_counter(), shared.clock()
        part: Any = None
        error: BaseException | None = None
        try:
            part = board_tasks.read(batch, unit)
        except BaseException as raised:  # the batch raises it, if no earlier unit raises first
            error = raised
        complete, work = board_tasks.board.give_back_and_take(batch, unit, part, error)
        del part, error
        tally = self.unaccounted
        tally[0] += time.perf_counter() - started
        tally[1] += shared.clock() - cpu
        tally[2] += 1
        if tally[2] >= ACCOUNT_EVERY or shared.tell_at is not None:  # a hint: see Shared
            self._account()
        if complete:
            return self._post_batch(batch), None
        return None, work

    def _account(self) -> None:
        """Add the reads not counted yet to the stats and the engine's sums (one lock)."""
        seconds, cpu, reads = self.unaccounted
        if reads:
            self.side.account(self.slot, seconds, cpu, reads=reads)
            self.unaccounted = [0.0, 0.0, 0]

    def _post_batch(self, batch: Reading) -> Final | None:
        """Collate a complete batch and post it at its place, with the ticket it holds."""
        side, shared, held = self.side, self.shared, self.held
        assert self.board_tasks is not None
        board_tasks = self.board_tasks
        prepare = shared.spec.prepare
        started = time.perf_counter()
        collate = 0.0
        message: Message | None = None
        error = batch.first_error()  # a unit's error: the batch raises it
        if error is not None:
            message = message_for(error, drawing=False, state=batch.state)
        else:
            try:
                item, collate = board_tasks.join(batch)
                if prepare is not None:
                    item = prepare(item)
                run = Run(
                    [item],
                    [batch.state] if shared.spec.read_state is not None else None,
                    [tensor_nbytes(item)] if shared.max_bytes is not None else None,
                )
                del item
            except BaseException as raised:  # collate_fn raised: the batch raises it
                message = message_for(raised, drawing=False, state=batch.state)
        del error
        if message is not None:
            if message.kind.final:  # no thread draws again, then the later batches are dropped
                side.end(source_ended=False)
                held.tickets += 1 + board_tasks.board.cut(batch.seq + 1)  # a final holds none
                return Final(batch.seq, message)
            run = Run([], end=message)
            del message
        held.tickets += 1  # the batch's ticket, posted with it
        seconds = time.perf_counter() - started
        side.post(batch.seq, run, held, seconds=seconds, slot=self.slot, collate=collate)
        return None
