"""Parallel fetch: what each of an engine's N threads runs over a DataLoader's samples.

:func:`fetch_samples` is the producer for a map-style DataLoader read by
``fetch_threads`` (both grains: a unit is a sample, a chunk, or the whole
batch; see :class:`~prefetch._threads.parallel_fetch.SamplerTasks`). Each
thread loops:

1. take the next unread unit of the earliest batch on the
   :class:`~prefetch._threads.sample_board.SampleBoard` and read it outside
   any lock; if it was the batch's last, collate the batch and post it at
   the batch's sequence number (batches are handed over in draw order);
2. with nothing left to read, take a ticket and draw the next batch's
   indices (the DataLoader's own ``next()``, under the engine's draw lock,
   only while the board is still empty), and put its units on the board.

So a batch is read by every free thread at once, the first batch arrives
after about ``batch_size / threads`` reads, and what is in flight is the
ready batches plus the one or two being read, in samples. It keeps every
invariant of :mod:`prefetch._threads.engine` (a ticket per draw, held by the
batch until it is posted; every batch and error in its place, each made a
message by :func:`~prefetch._threads.messages.message_for`; the end and a
``BaseException`` as the final message), and those of the board.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prefetch._shared.structure import tensor_nbytes
from prefetch._threads.messages import Final, Message, Run, message_for
from prefetch._threads.producers import draw_task, finish

if TYPE_CHECKING:
    from prefetch._threads.sample_board import Reading
    from prefetch._threads.tasks import BoardTasks
    from prefetch._threads.thread_side import ThreadSide
    from prefetch._threads.tickets import Held


def fetch_samples(engine: ThreadSide, tasks: BoardTasks, held: Held) -> Final | None:
    """Read units, complete batches and draw new ones until the epoch ends; see the module.

    Returns the final message, or ``None`` if the thread is to leave without one.
    """
    board = tasks.board
    slot = engine.add_fetch_slot()
    ticket = 0  # a ticket this thread took for its next draw
    try:
        while not engine.stopped:
            work = board.take()
            if work is not None:
                if ticket:  # it would wait unused while this thread reads: let another draw
                    engine.give_back_ticket(held)
                    ticket = 0
                batch, unit = work
                final = _read(engine, tasks, batch, unit, held, slot)
                if final is not None:
                    return final
                continue
            if engine.over:
                return None  # ended: no more draws, and nothing left here to read
            if not ticket:
                ticket = engine.take_tickets(held, 1, unless=board.has_work)
                if not ticket:
                    return None
                ticket = max(ticket, 0)  # -1: no ticket, but units came to read
                continue
            final, drew = _draw(engine, tasks, held, slot)
            if final is not None:
                return final
            if drew:
                ticket = 0
        return None
    finally:
        if engine.stopped:  # the batches on the board hold tickets: give them back
            held.tickets += board.cut(0)


def _draw(
    engine: ThreadSide, tasks: BoardTasks, held: Held, slot: int
) -> tuple[Final | None, bool]:
    """Draw a batch with the ticket ``held`` has; return a final message, and whether it drew."""
    read_state = engine.spec.read_state
    with engine.draw_lock:
        if engine.over or tasks.board.has_work():
            return None, False  # keep the ticket for later
        seq = engine.number()
        started = time.perf_counter()
        try:
            task = draw_task(tasks)
        except BaseException as error:
            message = message_for(error, drawing=True, read_state=read_state, broken=tasks.broken)
            del error
            if message.kind.final:
                return finish(engine, seq, message), False
            engine.post(seq, Run([], end=message), held, seconds=time.perf_counter() - started)
            return None, True
        state = read_state() if read_state is not None else None
        reading = tasks.plan(seq, task, state, engine.thread_count())
        held.tickets -= 1  # the batch holds the ticket now (see the board's invariants)
        if reading.units:
            tasks.board.add(reading)
    engine.account(-1, time.perf_counter() - started, 0.0)
    if not reading.units:  # an empty batch: nothing to read, collate it now
        return _post(engine, tasks, reading, held, slot), True
    engine.work_added(tasks.board.peak_samples)
    return None, True


def _read(
    engine: ThreadSide, tasks: BoardTasks, batch: Reading, unit: int, held: Held, slot: int
) -> Final | None:
    """Read one unit; post its batch if that completed it. Return a final message, if any."""
    board = tasks.board
    started, cpu = time.perf_counter(), engine.clock()
    part: Any = None
    error: BaseException | None = None
    try:
        part = tasks.read(batch, unit)
    except BaseException as raised:  # the batch raises it, if no earlier unit raises first
        error = raised
    complete = board.give_back(batch, unit, part, error)
    del part, error
    engine.account(slot, time.perf_counter() - started, engine.clock() - cpu, reads=1)
    if complete:
        return _post(engine, tasks, batch, held, slot)
    return None


def _post(
    engine: ThreadSide, tasks: BoardTasks, batch: Reading, held: Held, slot: int
) -> Final | None:
    """Collate a complete batch and post it at its place, with the ticket it holds."""
    prepare = engine.spec.prepare
    started = time.perf_counter()
    collate = 0.0
    message: Message | None = None
    error = batch.first_error()  # a unit's error: the batch raises it
    if error is not None:
        message = message_for(error, drawing=False, state=batch.state)
    else:
        try:
            item, collate = tasks.join(batch)
            if prepare is not None:
                item = prepare(item)
            run = Run(
                [item],
                [batch.state] if engine.spec.read_state is not None else None,
                [tensor_nbytes(item)] if engine.max_bytes is not None else None,
            )
            del item
        except BaseException as raised:  # collate_fn raised: the batch raises it
            message = message_for(raised, drawing=False, state=batch.state)
    del error
    if message is not None:
        if message.kind.final:  # no thread draws again, then the later batches are dropped
            final = finish(engine, batch.seq, message)
            held.tickets += 1 + tasks.board.cut(batch.seq + 1)  # a final message holds none
            return final
        run = Run([], end=message)
        del message
    held.tickets += 1  # the batch's ticket, posted with it
    engine.post(
        batch.seq, run, held, seconds=time.perf_counter() - started, slot=slot, collate=collate
    )
    return None
