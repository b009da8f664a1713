"""``ConsumerSide``: what the consumer end of an epoch does to the state its threads share.

The consumer end (:mod:`prefetch._threads.iterator`) gives tickets back and
takes the runs posted in order with :meth:`ConsumerSide.exchange`, waiting
when none is ready. Every rule these
methods keep is written in :mod:`prefetch._threads.engine`; each takes the
shared lock for one decision and never calls into a thread.
"""

from __future__ import annotations

import time

from prefetch._shared.profiling import profiling, span
from prefetch._threads.messages import STOPPED_RUN, Kind, Message, Run
from prefetch._threads.shared import Shared
from prefetch._threads.timeout import Timeout


class ConsumerSide:
    """The consumer's calls on its engine's shared state (see the module).

    Args:
        shared: The engine's state.
        timeout: The consumer's longest wait for a run, or ``None``.
    """

    __slots__ = ("shared", "timeout")

    def __init__(self, shared: Shared, timeout: Timeout | None) -> None:
        self.shared = shared
        self.timeout = timeout

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
            The runs (``[STOPPED_RUN]`` once the engine stopped; empty without
            ``wait``, or once the reads the engine was told to watch are done:
            :meth:`~prefetch._threads.engine.Engine.tell_after`) and the
            seconds waited.

        Raises:
            RuntimeError: Every thread left without posting the run waited for.
        """
        shared = self.shared
        with shared.lock:
            if returned:
                shared.tickets.given_back(returned, returned_bytes)
            runs = shared.handover.take()
            if runs or not wait:
                if returned and shared.waiting and not shared.woken:
                    shared.wake_threads()
                return runs, 0.0
            tickets = shared.tickets
            if tickets.at_the_gate():  # the loop asks past the last item: find the end now
                tickets.gate_open = True
                shared.wake_threads()
            elif shared.waiting and not shared.woken and tickets.free():
                shared.wake_threads()  # about to wait: whatever is free must be used
            started = time.perf_counter()
            if profiling():
                with span("prefetch.wait"):
                    runs = self._wait_for_run()
            else:
                runs = self._wait_for_run()
            return runs, time.perf_counter() - started

    def threads_woken_idle(self) -> bool:
        """Whether a thread over an iterator, woken for tickets, has not run since (GIL on).

        A hint, read without the lock. Under the GIL it runs only once the
        loop's thread lets go of the interpreter: tickets given back before
        then change nothing for it, and the iterator skips that exchange
        (:mod:`prefetch._threads.iterator`). It drew ahead of the loop (it
        waited for tickets), so what it draws when the loop blocks elsewhere
        comes quickly once the tickets are back. Threads that read units
        (``fetch_threads``) never count as idle.
        """
        shared = self.shared
        return shared.woken and shared.waiting > 0 and shared.early_wakes

    def _wait_for_run(self) -> list[Run]:
        shared = self.shared
        shared.consumer_waiting = True
        timeout = self.timeout
        deadline = time.monotonic() + timeout.seconds if timeout is not None else 0.0
        try:
            while True:
                if shared.stopped:
                    return [STOPPED_RUN]
                wait = shared.poll
                if timeout is not None:
                    wait = deadline - time.monotonic()
                    if wait <= 0:  # the epoch ends here
                        shared.stop()
                        message = Message(Kind.RAISE_AND_END, timeout.error(), None)
                        return [Run([], end=message)]
                    wait = min(wait, shared.poll)
                shared.consumer_woken = False
                shared.wait_for_data(wait)
                runs = shared.handover.take()
                if runs:
                    return runs
                if shared.told:  # reads it asked to hear of are done: back to the consumer
                    return []
                if shared.running == 0 and not shared.releasing and not shared.stopped:
                    names = ", ".join(repr(thread.name) for thread in shared.started)
                    msg = (
                        f"prefetch thread(s) {names} exited without delivering "
                        "an item, an error or the end of the data"
                    )
                    raise RuntimeError(msg)
        finally:
            shared.consumer_waiting = False
