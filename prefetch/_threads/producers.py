"""What an engine's one thread over an iterator runs: draw, prepare, post.

:func:`draw_runs` takes every free ticket at once, draws that many items
without the lock and posts them as one :class:`~prefetch._threads.messages.Run`,
or sooner: when the consumer waits for them (after a few, or after
:data:`POST_AFTER` seconds), and at least every :data:`POST_AFTER` seconds of
drawing (the items per post follow the measured rate). A fast source and a
fast loop then meet once per run, not once per item. (Several threads over a
DataLoader's samples run :mod:`prefetch._threads.sample_fetch` instead.)

It keeps every invariant of :mod:`prefetch._threads.engine`: a ticket per
draw, every item and error in its place (what the thread caught becomes a
message in one place, :func:`~prefetch._threads.messages.message_for`), the
end and a ``BaseException`` returned as the final message for the last thread
to post. It writes no shared field: the sequence numbers it posts at are its
own until :meth:`~prefetch._threads.thread_side.ThreadSide.post` records them.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from prefetch._shared.profiling import profiling, span
from prefetch._shared.structure import tensor_nbytes
from prefetch._threads.messages import Final, Message, Run, message_for

if TYPE_CHECKING:
    from prefetch._threads.tasks import Tasks
    from prefetch._threads.thread_side import ThreadSide
    from prefetch._threads.tickets import Held

POST_AFTER = 50e-6
"""Longest a thread holds drawn items back before posting them (to post many at once)."""
ALL = sys.maxsize
"""Take every free ticket."""


def finish(engine: ThreadSide, seq: int, message: Message) -> Final:
    """End the epoch with the final ``message``, numbered ``seq`` (every producer's last step)."""
    engine.end(source_ended=message.error is None)
    return Final(seq, message)


def draw_runs(engine: ThreadSide, tasks: Tasks, held: Held) -> Final | None:
    """Draw the source's items in runs until it ends or the engine stops; see the module.

    Returns the final message (the end, or an error that ends the epoch), or
    ``None`` if the thread is to leave without one.
    """
    draw = tasks.draw
    prepare, read_state = engine.spec.prepare, engine.spec.read_state
    sized = engine.max_bytes is not None
    post_every = 1  # items per post: one until the rate is known
    seq = 0  # this thread is the only one: it numbers every draw
    count = engine.take_tickets(held, ALL)
    while count:
        traced = profiling()
        items: list[Any] = []
        states: list[Any] | None = [] if read_state is not None else None
        sizes: list[int] | None = [] if sized else None
        end: Message | None = None
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
            except BaseException as error:
                end = message_for(error, drawing=True, read_state=read_state, broken=tasks.broken)
                break
            state = read_state() if read_state is not None else None
            if prepare is not None or sizes is not None:
                try:
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
            if used < count and (drawn >= post_every or engine.consumer_waiting):
                now = time.perf_counter()
                if drawn >= post_every or drawn >= wake or now - mark >= POST_AFTER:
                    engine.post(seq, Run(items, states, sizes), held, seconds=now - mark)
                    post_every = _per_post(now - mark, drawn)
                    seq += drawn
                    items = []
                    states = [] if states is not None else None
                    sizes = [] if sizes is not None else None
                    mark = now
        spent = time.perf_counter() - mark
        if end is not None and end.kind.final:  # its ticket stays held until the thread leaves
            engine.post(seq, Run(items, states, sizes), held, seconds=spent, unused=count - used)
            return finish(engine, seq + len(items), end)
        run = Run(items, states, sizes, end)
        count = engine.post(seq, run, held, seconds=spent, unused=count - used, take=ALL)
        seq += run.numbers
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


def draw_task(tasks: Tasks) -> Any:
    """Draw the next task of ``tasks`` (within a profiler span while profiling)."""
    if profiling():
        with span("prefetch.fetch"):
            return tasks.draw()
    return tasks.draw()
