"""Bounded waits that fail with a message naming what is stuck, instead of hanging.

A lost wake-up or a deadlock in the thread engine otherwise shows only as a
test killed by pytest-timeout. These helpers wait at most
:data:`LIVENESS_SECONDS` for progress and then fail with the state of the
channel: which side waits, for what, and why it cannot go on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prefetch._threads.engine import Engine

from .gil import gil_enabled
from .processes import wait_until

LIVENESS_SECONDS = 2.0
"""How long a step may make no progress before the test fails (never a speed claim)."""


def set_after(
    monkeypatch: pytest.MonkeyPatch,
    owner: type,
    name: str,
    event: threading.Event,
    when: Callable[..., bool] | None = None,
) -> None:
    """Set ``event`` each time the method ``owner.name`` returns (an event, never a sleep).

    With ``when``, only after the calls for which ``when(*args, **kwargs)`` is
    true (the arguments after ``self``).
    """
    method = getattr(owner, name)

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if when is None or when(*args, **kwargs):
            event.set()
        return result

    monkeypatch.setattr(owner, name, spy)


def producer_frame(thread: threading.Thread) -> str:
    """Return where ``thread`` is now, as the innermost ``prefetch`` function it is in.

    Not with the GIL off: walking a running thread's frames from another thread
    crashed 3.13t, and a diagnostic must not turn a failure into a crash.
    """
    if not gil_enabled():
        return "(not read: the GIL is off)"
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if f"{os.sep}prefetch{os.sep}" in frame.f_code.co_filename:
            return f"{frame.f_code.co_qualname}:{frame.f_lineno}"
        frame = frame.f_back
    return "ended" if not thread.is_alive() else "outside prefetch"


def engine_of(iterator: Any) -> Engine:
    """The engine of a ``BackgroundIterator`` (the one place tests reach for it).

    An idle iterator (no ``next()`` yet) is started first, as its first
    ``next()`` would, without taking an item.
    """
    begin(iterator)
    engine: Engine = iterator._engine
    return engine


def begin(iterator: Any) -> Any:
    """Start an idle epoch iterator as its first ``next()`` would, without taking an item."""
    iterator.start()
    return iterator


def threads_blocked(engine: Engine) -> bool:
    """Whether a thread of ``engine`` waits for a ticket (the buffer is full)."""
    return engine.snapshot().waiting_threads > 0


def went_ahead(engine: Engine) -> bool:
    """Whether the threads of ``engine`` went as far ahead as they may until the loop takes more.

    True once every thread has left (the source ended), or every live thread
    waits for a ticket and none is free (the depth, the byte budget, or the
    end's gate: the draw past a sized source's last item waits for the loop).
    The figures are read together under the engine's lock, and a thread woken
    by tickets given back counts as waiting until it runs, but a ticket is
    free by then: so a true answer is never stale.
    """
    alive = sum(thread.is_alive() for thread in engine.threads)
    figures = engine.snapshot()
    if not alive:
        return True
    return figures.waiting_threads >= alive and figures.free == 0


def wait_went_ahead(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until :func:`went_ahead`; after ``timeout`` s fail saying where the threads are."""
    wait_for(lambda: went_ahead(engine), lambda: describe(engine), timeout, collect=False)


def wait_read_ahead(iterator: Any, timeout: float = 10.0) -> None:
    """Wait until the thread behind an epoch iterator read as far ahead as its bounds let it.

    ``iterator`` is a ``BackgroundIterator``, or a ``DeviceIterator`` over one
    (a ``CudaPrefetcher`` over a ``BackgroundLoader``). An epoch not started
    yet (no ``next()``), or one with no thread, has nothing to wait for.
    """
    background = getattr(iterator, "_source", iterator)
    engine = getattr(background, "_engine", None)
    if isinstance(engine, Engine):
        wait_went_ahead(engine, timeout)


def describe(engine: Engine) -> str:
    """Say where the threads of ``engine`` stand and why, in words."""
    figures = engine.snapshot()
    in_flight, limit = figures.in_flight, figures.depth + figures.threads - 1
    free = max(limit - in_flight, 0)
    waiting = figures.waiting_threads
    if waiting:
        text = (
            f"{waiting} of {len(engine.threads)} thread(s) still blocked on a full buffer with "
            f"{free} free slot{'' if free == 1 else 's'} ({in_flight} of {limit} taken"
        )
        if figures.max_bytes is not None:
            text += (
                f"; {figures.buffered_bytes} B buffered + largest item {figures.largest_item} B"
                f" vs max_bytes {figures.max_bytes}"
            )
        return text + ")"
    ready = figures.ready
    where = ", ".join(producer_frame(thread) for thread in engine.threads) or "no thread"
    return f"threads in {where}, {ready} messages ready ({in_flight} of {limit} slots taken)"


def wait_for(
    condition: Callable[[], bool],
    what: str | Callable[[], str],
    timeout: float = 10.0,
    *,
    collect: bool = True,
) -> None:
    """Poll ``condition`` until true; after ``timeout`` s fail saying ``what`` (or ``what()``).

    ``what`` names what was awaited, or (a callable) describes the stuck part
    at the moment of failing. ``collect``: run the garbage collector between
    polls (see :func:`~tests.processes.wait_until`).
    """
    if not wait_until(condition, timeout, interval=0.002, collect=collect):
        text = what() if callable(what) else f"timed out waiting for {what}"
        pytest.fail(f"{text} after {timeout} s", pytrace=False)


def take(iterator: Iterator[Any], timeout: float = LIVENESS_SECONDS) -> Any:
    """``next(iterator)``; if it has not returned after ``timeout`` s, close it and fail.

    The failure names what was stuck (for a :class:`BackgroundIterator`, the
    producer's state at that moment). The consumer still waits as it would
    in a training loop: only a watchdog thread looks at the clock.
    """
    stuck: list[str] = []

    def watchdog() -> None:
        engine = getattr(iterator, "_engine", None)
        if isinstance(engine, Engine):
            stuck.append(describe(engine))
        else:
            stuck.append("next() not returning")
        close = getattr(iterator, "close", None)
        if callable(close):
            close()  # the blocked next() then returns or raises

    timer = threading.Timer(timeout, watchdog)
    timer.daemon = True
    timer.start()
    try:
        item = next(iterator)
    except BaseException:  # StopIteration included: a close() by the watchdog ends it
        if stuck:
            pytest.fail(f"{stuck[0]} after {timeout} s", pytrace=False)
        raise
    finally:
        timer.cancel()
        timer.join()
    if stuck:
        pytest.fail(f"{stuck[0]} after {timeout} s", pytrace=False)
    return item


def consume(iterable: Any, step: float = 0.0, timeout: float = LIVENESS_SECONDS) -> list[Any]:
    """Drain ``iter(iterable)`` with :func:`take`, sleeping ``step`` s per item; return items."""
    iterator = iter(iterable)
    items = []
    while True:
        try:
            item = take(iterator, timeout)
        except StopIteration:
            return items
        items.append(item)
        if step:
            time.sleep(step)
