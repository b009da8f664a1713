"""Sample-grain parallel fetch: what each of an engine's N threads runs.

:func:`fetch_samples` is the producer for a map-style DataLoader read at the
grain of samples (the default for ``fetch_threads``). Each thread loops:

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
batch until it is posted; every batch and error in its place; ``END`` and a
``BaseException`` as the final message), and those of the board.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prefetch._shared.structure import tensor_nbytes
from prefetch._threads.messages import END, ERROR, RAISED, Final, Message, Run
from prefetch._threads.producers import draw_task
from prefetch._threads.sample_board import Reading

if TYPE_CHECKING:
    from prefetch._threads.engine import Engine
    from prefetch._threads.parallel_fetch import SamplerTasks
    from prefetch._threads.producers import Held


def fetch_samples(engine: Engine, held: Held) -> Final | None:
    """Read units, complete batches and draw new ones until the epoch ends; see the module.

    Returns the final message, or ``None`` if the thread is to leave without one.
    """
    tasks: SamplerTasks = engine.tasks  # type: ignore[assignment]
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


def _draw(engine: Engine, tasks: SamplerTasks, held: Held, slot: int) -> tuple[Final | None, bool]:
    """Draw a batch with the ticket ``held`` has; return a final message, and whether it drew."""
    read_state = engine.spec.read_state
    with engine.draw_lock:
        if engine.over or tasks.board.has_work():
            return None, False  # keep the ticket for later
        seq = engine.next_seq
        engine.next_seq = seq + 1
        started = time.perf_counter()
        try:
            task = draw_task(tasks)
        except StopIteration:
            engine.end(source_ended=True)
            state = read_state() if read_state is not None else None
            return Final(seq, Message(END, None, state)), False
        except Exception as error:  # the source decides whether it goes on
            run = Run([], end=Message(RAISED, error, None))
            engine.post(seq, run, held, seconds=time.perf_counter() - started)
            return None, True
        except BaseException as error:
            engine.end(source_ended=False)
            return Final(seq, Message(ERROR, error, None)), False
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
    engine: Engine, tasks: SamplerTasks, batch: Reading, unit: int, held: Held, slot: int
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
    engine: Engine, tasks: SamplerTasks, batch: Reading, held: Held, slot: int
) -> Final | None:
    """Collate a complete batch and post it at its place, with the ticket it holds."""
    prepare = engine.spec.prepare
    started = time.perf_counter()
    collate = 0.0
    error = batch.first_error()
    if error is not None and not isinstance(error, Exception):  # ends the epoch, in its place
        engine.end(source_ended=False)
        held.tickets += 1 + tasks.board.cut(batch.seq + 1)  # a final message holds none
        return Final(batch.seq, Message(ERROR, error, None))
    try:
        if error is not None:
            run = Run([], end=Message(RAISED, error, batch.state))
        else:
            item, collate = tasks.join(batch)
            if prepare is not None:
                item = prepare(item)
            run = Run(
                [item],
                [batch.state] if engine.spec.read_state is not None else None,
                [tensor_nbytes(item)] if engine.max_bytes is not None else None,
            )
            del item
    except Exception as raised:  # collate_fn raised: the batch raises it
        run = Run([], end=Message(RAISED, raised, batch.state))
    except BaseException as raised:
        engine.end(source_ended=False)
        held.tickets += 1 + tasks.board.cut(batch.seq + 1)
        return Final(batch.seq, Message(ERROR, raised, None))
    del error
    held.tickets += 1  # the batch's ticket, posted with it
    engine.post(
        batch.seq, run, held, seconds=time.perf_counter() - started, slot=slot, collate=collate
    )
    return None
