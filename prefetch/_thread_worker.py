"""The producer thread: start it, run it, end it.

This is the only module that starts threads. :func:`start_producer` starts
one daemon thread that fills a :class:`~prefetch._channel.Channel` (the shared
state, with its own invariants: tagged messages, exact depth, byte budget, no
lost wake-ups); :func:`~prefetch._channel.request_stop` and
:func:`join_producer` end it.

Invariants of the thread (every change here must keep them):

* **No reference to the consumer.** The thread's target holds the channel and
  the source iterator, never the iterator object the user holds, so garbage
  collection of an abandoned iterator runs its finalizer, which calls
  ``request_stop``.
* **Errors keep their identity and their place.** Any ``BaseException``
  raised by the source (``KeyboardInterrupt`` and ``SystemExit`` included) is
  posted as the same object after every item produced before it.
* **An error ends only what cannot go on.** After an ``Exception`` from
  ``next(source)`` the thread keeps calling ``next(source)``, exactly as a
  loop that catches the error and continues would: a DataLoader iterator
  goes on with its next batch, a generator that raised is finished and
  raises ``StopIteration``. A ``BaseException`` ends the epoch, and then the
  source iterator is shut down *before* the error is posted. Either way the
  error's traceback cannot keep DataLoader workers alive after the loop has
  stopped: the consumer's raising frame does not hold the iterator, so
  dropping it runs its finalizer, which stops this thread, which releases
  the source (:func:`release_source`).
* **The end carries the state.** After ``StopIteration`` the source's state
  is read once more and posted with ``END``: a checkpoint taken after the
  end resumes into the next full epoch, as the unwrapped loader's does.
* **Prompt stop.** Every wait of the producer is timed and checks
  :attr:`Channel.stop`; after stopping it releases the source iterator.
* **Quiet exit.** At interpreter exit every live producer is asked to stop
  and given at most :data:`EXIT_GRACE` seconds in all (none while it is
  stuck inside the source) to release its source, so DataLoader workers are
  shut down cleanly and no producer runs torch code while the interpreter
  is torn down. Exit never waits longer than that.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from prefetch._channel import END, ERROR, RAISED, Channel, Message, request_stop
from prefetch._profiling import profiling, span
from prefetch._structure import tensor_nbytes

EXIT_GRACE = 1.0
"""Longest the interpreter's exit waits, in all, for producers to stop."""

_thread_ids = itertools.count(1)
_live: set[tuple[threading.Thread, Channel]] = set()  # producers started and not yet ended


def release_source(source: Iterator[Any], owned: bool) -> None:
    """Shut down what the source iterator holds, as dropping it would.

    A multi-process DataLoader iterator stops its workers (unless they are
    persistent: the DataLoader reuses them next epoch). A generator we
    created with ``iter()`` is closed so its ``finally`` blocks run now; one
    the user passed in (``owned`` false) is left alone.
    """
    shutdown = getattr(source, "_shutdown_workers", None)
    if callable(shutdown):
        if not getattr(source, "_persistent_workers", False):
            shutdown()
        return
    close = getattr(source, "close", None)
    if owned and callable(close):
        close()


class ProducerSpec(NamedTuple):
    """How the producer thread treats its source.

    Attributes:
        owned: Whether the source iterator was created by us (see :func:`release_source`).
        prepare: Applied to each item in the thread (pinning), or ``None``.
        read_state: Called right after each item (and after the end) to
            capture the source's checkpoint state, or ``None``.
        setup: Called first in the thread (device selection, thread count).
    """

    owned: bool
    prepare: Callable[[Any], Any] | None = None
    read_state: Callable[[], Any] | None = None
    setup: Callable[[], None] | None = None


def start_producer(channel: Channel, source: Iterator[Any], spec: ProducerSpec) -> threading.Thread:
    """Start the daemon thread that fills ``channel`` from ``source``.

    Args:
        channel: Where items go; its ``depth`` bounds how far the thread runs ahead.
        source: The iterator to drain (already created on the caller's thread).
        spec: What the thread does besides draining (see :class:`ProducerSpec`).

    Returns:
        The started thread, named ``prefetch-N``.
    """
    thread = threading.Thread(
        target=_produce,
        args=(channel, source, *spec),
        name=f"prefetch-{next(_thread_ids)}",
        daemon=True,
    )
    entry = (thread, channel)
    _live.add(entry)
    try:
        thread.start()
    except BaseException:
        if not thread.is_alive():
            _live.discard(entry)
        raise
    return thread


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every live producer before the interpreter is torn down (bounded; see module)."""
    producers = list(_live)
    for _, channel in producers:
        request_stop(channel)
    deadline = time.monotonic() + EXIT_GRACE
    for thread, channel in producers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        join_producer(thread, channel, timeout=remaining, stuck_grace=0.05)


def _produce(
    channel: Channel,
    source: Iterator[Any],
    owned: bool,
    prepare: Callable[[Any], Any] | None,
    read_state: Callable[[], Any] | None,
    setup: Callable[[], None] | None,
) -> None:
    last: Message | None = None  # END or ERROR, posted after the source is released
    try:
        if setup is not None:
            setup()
        stats = channel.stats
        count_bytes = channel.max_bytes is not None
        while channel.wait_for_space():
            channel.produced += 1
            channel.in_source = True
            started = time.perf_counter()
            try:
                if profiling():
                    with span("prefetch.fetch"):
                        item = next(source)
                else:
                    item = next(source)
            except StopIteration:
                channel.source_ended = True
                last = (END, None, read_state() if read_state is not None else None, 0)
                break
            except Exception as error:  # the source decides whether it goes on
                channel.post((RAISED, error, None, 0))
                continue
            finally:
                channel.in_source = False
                stats.source_seconds += time.perf_counter() - started
            if prepare is not None:
                item = prepare(item)
            state = read_state() if read_state is not None else None
            channel.post_item(item, state, tensor_nbytes(item) if count_bytes else 0, started)
            del item, state
    except BaseException as error:  # handed to the consumer, never dropped
        last = (ERROR, error, None, 0)
    finally:
        try:
            _end(channel, source, owned, last)
        finally:
            del source, last  # the error's traceback holds this frame: keep it light


def _end(channel: Channel, source: Iterator[Any], owned: bool, last: Message | None) -> None:
    """Release the source, then post the last message (rule: workers die before the error)."""
    try:
        release_source(source, owned)
    except BaseException as error:
        if (last is not None and last[0] == ERROR) or channel.stop.is_set():
            raise  # nobody would read it after the source's own error: threading.excepthook
        last = (ERROR, error, None, 0)
    finally:
        if last is not None:
            channel.post(last)
        if channel.stop.is_set():  # nobody will read them: free the prefetched items now
            channel.messages.clear()
        _live.discard((threading.current_thread(), channel))


def join_producer(
    thread: threading.Thread, channel: Channel, *, timeout: float, stuck_grace: float
) -> bool:
    """Wait for ``thread`` to end after :func:`request_stop`.

    Gives up after ``timeout`` seconds, or after ``stuck_grace`` seconds while
    the producer is blocked inside ``next(source)`` (it will exit on its own
    when the source returns). Never joins the current thread.

    Returns:
        Whether the thread has ended.
    """
    if thread is threading.current_thread():
        return False
    start = time.monotonic()
    while thread.is_alive():
        waited = time.monotonic() - start
        if waited > timeout or (channel.in_source and waited > stuck_grace):
            return False
        thread.join(0.02)
    return True
