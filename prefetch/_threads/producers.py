"""What an engine's threads run: draw, prepare, post (see :mod:`prefetch._threads.engine`).

* :func:`draw_runs`: the one thread over an iterator. It takes every free
  ticket at once, draws that many items without the lock and posts them as
  one :class:`~prefetch._threads.messages.Run`, or sooner: when the consumer
  waits for them (after a few, or after :data:`POST_AFTER` seconds), and at
  least every :data:`POST_AFTER` seconds of drawing (the items per post
  follow the measured rate). A fast source and a fast loop then meet once
  per run, not once per item.
* :func:`fetch_in_parallel`: one of N threads over a map-style DataLoader.
  Each draws one task in order (under the engine's draw lock), runs it
  outside any lock, and posts the batch as a run of one, taking its next
  ticket in the same locked section.

Both keep every invariant of the engine: a ticket per draw, every item and
error in its place, the end and a ``BaseException`` returned as the final
message for the last thread to post.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from prefetch._shared.profiling import profiling, span
from prefetch._shared.structure import tensor_nbytes
from prefetch._threads.messages import END, ERROR, RAISED, Final, Message, Run

if TYPE_CHECKING:
    from prefetch._threads.engine import Engine

POST_AFTER = 50e-6
"""Longest a thread holds drawn items back before posting them (to post many at once)."""
ALL = sys.maxsize
"""Take every free ticket."""


class Held:
    """Tickets one thread holds that no posted run holds (given back when it leaves)."""

    __slots__ = ("tickets",)

    def __init__(self) -> None:
        self.tickets = 0


def draw_runs(engine: Engine, held: Held) -> Final | None:
    """Draw the source's items in runs until it ends or the engine stops; see the module.

    Returns the final message (``END`` or ``ERROR``), or ``None`` if the
    thread is to leave without one.
    """
    draw = engine.tasks.draw
    prepare, read_state = engine.spec.prepare, engine.spec.read_state
    sized = engine.max_bytes is not None
    post_every = 1  # items per post: one until the rate is known
    count = engine.take_tickets(held, ALL)
    while count:
        traced = profiling()
        seq = engine.next_seq
        items: list[Any] = []
        states: list[Any] | None = [] if read_state is not None else None
        sizes: list[int] | None = [] if sized else None
        end: Message | None = None
        final: Final | None = None
        # Items a waiting consumer is woken for at once. With the GIL it cannot run before
        # this thread blocks or waits in the source (then POST_AFTER posts): no early post.
        wake = max(1, count // 4) if engine.parallel_python else count
        used = 0
        mark = time.perf_counter()
        while used < count and not engine.stopped:
            used += 1  # this draw's ticket: its item's, its error's, or the final's
            try:
                if traced:
                    with span("prefetch.fetch"):
                        item = draw()
                else:
                    item = draw()
            except StopIteration:
                engine.end(source_ended=True)
                state = read_state() if read_state is not None else None
                final = Final(seq + len(items), Message(END, None, state))
                break
            except Exception as error:  # the source decides whether it goes on
                if engine.tasks.broken():  # a DataLoader that lost a worker cannot
                    engine.end(source_ended=False)
                    final = Final(seq + len(items), Message(ERROR, error, None))
                    break
                end = Message(RAISED, error, None)
                break
            except BaseException as error:
                engine.end(source_ended=False)
                final = Final(seq + len(items), Message(ERROR, error, None))
                break
            state = read_state() if read_state is not None else None
            if prepare is not None or sizes is not None:
                try:
                    if prepare is not None:
                        item = prepare(item)
                    if sizes is not None:
                        sizes.append(tensor_nbytes(item))
                except Exception as error:  # the draw moved the state on: the error carries it
                    end = Message(RAISED, error, state)
                    break
                except BaseException as error:
                    engine.end(source_ended=False)
                    final = Final(seq + len(items), Message(ERROR, error, None))
                    break
            items.append(item)
            if states is not None:
                states.append(state)
            drawn = len(items)
            if used < count and (drawn >= post_every or engine.consumer_waiting):
                now = time.perf_counter()
                if drawn >= post_every or drawn >= wake or now - mark >= POST_AFTER:
                    engine.post(seq, Run(items, states, sizes), held, seconds=now - mark)
                    post_every = _per_post(now - mark, drawn)
                    seq += drawn
                    engine.next_seq = seq
                    items = []
                    states = [] if states is not None else None
                    sizes = [] if sizes is not None else None
                    mark = now
        spent = time.perf_counter() - mark
        run = Run(items, states, sizes, end)
        if final is not None:  # its ticket stays held until the thread leaves
            engine.post(seq, run, held, seconds=spent, unused=count - used)
            return final
        count = engine.post(seq, run, held, seconds=spent, unused=count - used, take=ALL)
        engine.next_seq = seq + run.numbers
        if items:
            post_every = _per_post(spent, len(items))
        # What was posted is the consumer's now: an error re-raised there carries the loop's
        # frames (and its iterator) in its traceback, so this thread must not keep it.
        del run, end, items, states, sizes
        if not count:
            count = engine.take_tickets(held, ALL)
    return None


def _per_post(seconds: float, items: int) -> int:
    """Items to draw before the next post, so that a post comes every ``POST_AFTER`` seconds."""
    if seconds <= 0.0:
        return ALL
    return max(1, int(POST_AFTER * items / seconds))


def draw_task(tasks: Any) -> Any:
    """Draw the next task of ``tasks`` (within a profiler span while profiling)."""
    if profiling():
        with span("prefetch.fetch"):
            return tasks.draw()
    return tasks.draw()


def fetch_in_parallel(engine: Engine, held: Held) -> Final | None:
    """Draw, run and post one task at a time, beside the engine's other threads.

    Returns the final message, or ``None`` if the thread is to leave without one.
    """
    tasks, clock = engine.tasks, engine.clock
    prepare, read_state = engine.spec.prepare, engine.spec.read_state
    sized = engine.max_bytes is not None
    slot = engine.add_fetch_slot()
    ticket = engine.take_tickets(held, 1)
    while ticket:
        started, cpu = time.perf_counter(), clock()
        task: Any = None
        state: Any = None
        raised: Exception | None = None
        with engine.draw_lock:
            if engine.over:
                engine.post(-1, Run([]), held, seconds=0.0, unused=1)
                return None
            seq = engine.next_seq
            engine.next_seq = seq + 1
            try:
                task = draw_task(tasks)
            except StopIteration:
                engine.end(source_ended=True)
                state = read_state() if read_state is not None else None
                return Final(seq, Message(END, None, state))
            except Exception as error:  # the source decides whether it goes on
                raised = error
            except BaseException as error:
                engine.end(source_ended=False)
                return Final(seq, Message(ERROR, error, None))
            else:
                state = read_state() if read_state is not None else None
        collate = 0.0
        try:
            if raised is not None:
                run = Run([], end=Message(RAISED, raised, None))
            else:
                item, collate = tasks.run(task)
                del task
                if prepare is not None:
                    item = prepare(item)
                run = Run(
                    [item],
                    [state] if read_state is not None else None,
                    [tensor_nbytes(item)] if sized else None,
                )
                del item
        except Exception as error:  # the draw moved the state on: the error carries it
            run = Run([], end=Message(RAISED, error, state))
        except BaseException as error:
            engine.end(source_ended=False)
            return Final(seq, Message(ERROR, error, None))
        del raised
        spent = time.perf_counter() - started
        ticket = engine.post(
            seq, run, held, seconds=spent, cpu=clock() - cpu, take=1, slot=slot, collate=collate
        )
        del run
        if not ticket:
            ticket = engine.take_tickets(held, 1)
    return None
