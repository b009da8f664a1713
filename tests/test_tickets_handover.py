"""The engine's plain data, alone: ``Tickets`` (what is in flight) and ``Handover`` (in order).

Both are read and written only under the engine's lock and wake nobody, so
their rules can be checked step by step, with no thread: what a thread holds
when it posts or leaves, and which runs the consumer may take, in order and
out of order, around a final message.
"""

from __future__ import annotations

from prefetch._threads.handover import Handover
from prefetch._threads.messages import Kind, Message, Run
from prefetch._threads.tickets import Held, Tickets


def counts(tickets: Tickets, held: Held) -> tuple[int, int, int]:
    """``(in_flight, unposted, held)``: the three counts a post or a leave changes."""
    return tickets.in_flight, tickets.unposted, held.tickets


class TestTickets:
    def test_a_post_moves_tickets_from_the_thread_to_the_run(self) -> None:
        """Posted tickets leave the thread's hold and stay in flight; unused ones come back."""
        tickets = Tickets(depth=4, threads=1, max_bytes=None, largest_item=0)
        held = Held()
        assert tickets.take(held, 1) == 1
        assert tickets.take(held, 3) == 3  # a thread may take more before it posts
        assert counts(tickets, held) == (4, 4, 4)
        tickets.posted(held, 3, 1)  # a run of 2 items and a message, 1 ticket unused
        assert counts(tickets, held) == (3, 1, 1)
        assert tickets.free() == 1

    def test_leaving_gives_back_what_the_thread_still_holds(self) -> None:
        """A thread that leaves drops the tickets no run holds; posted ones stay in flight."""
        tickets = Tickets(depth=6, threads=2, max_bytes=None, largest_item=0)
        first, second = Held(), Held()
        assert tickets.take(first, 3) == 3
        assert tickets.take(second, 3) == 3
        tickets.posted(first, 1, 0)
        tickets.dropped(first, first.tickets)  # the first thread leaves
        assert counts(tickets, first) == (4, 3, 0)
        assert second.tickets == 3
        tickets.given_back(1, 0)  # the loop took the posted item
        assert tickets.in_flight == 3 and tickets.free() == 4

    def test_the_byte_budget_counts_what_threads_hold(self) -> None:
        """Room is the bytes left over the largest item, less the tickets threads hold."""
        tickets = Tickets(depth=8, threads=1, max_bytes=1000, largest_item=100)
        held = Held()
        assert tickets.take(held, 8) == 8
        tickets.posted(held, 8, 0)
        tickets.buffered([100] * 8)
        assert tickets.free() == 0  # 8 in flight: the depth
        tickets.given_back(6, 600)
        assert (tickets.buffered_bytes, tickets.free()) == (200, 6)
        assert tickets.take(held, 2) == 2
        assert tickets.free() == 4  # (1000 - 200) // 100 - 2 held, not posted
        tickets.buffered([300])
        assert tickets.largest_item == 300


def run(*items: str, end: Kind | None = None) -> Run:
    """A run of ``items``, ended by a message of kind ``end`` if given."""
    message = None if end is None else Message(end, None, None)
    return Run(list(items), end=message)


def taken(handover: Handover) -> list[list[str] | str]:
    """What :meth:`Handover.take` hands over: each run's items, or its message's kind."""
    return [run.items if run.end is None else run.end.kind.name for run in handover.take()]


class TestInOrder:
    def test_runs_wait_for_every_number_before_them(self) -> None:
        """A run is due, and taken, only once every earlier number was taken."""
        handover = Handover(in_order=True)
        handover.post(2, run("c"))
        assert not handover.due(2)
        assert taken(handover) == []
        assert handover.due(0)
        handover.post(0, run("a", "b"))
        assert taken(handover) == [["a", "b"], ["c"]]
        assert handover.taken == 3


class TestOutOfOrder:
    def test_every_run_is_due_once_posted(self) -> None:
        """Out of order, any run just posted can be handed over: the consumer is woken."""
        handover = Handover(in_order=False)
        assert handover.due(5)
        handover.post(5, run("f"))
        assert taken(handover) == [["f"]]

    def test_a_final_message_waits_for_every_number_before_it(self) -> None:
        """The end is handed over last, once the runs before it were; never one after it."""
        handover = Handover(in_order=False)
        handover.post(3, run(end=Kind.END))
        handover.post(1, run("b", "c"))
        handover.post(4, run("late"))  # drawn after the end's number: never handed over
        assert taken(handover) == [["b", "c"]]
        assert handover.taken == 0  # number 0 is still out
        handover.post(0, run("a"))
        assert taken(handover) == [["a"], "END"]
        assert handover.taken == 4
        assert handover.posted() == 1  # the late run was not handed over with them

    def test_the_earliest_final_message_wins(self) -> None:
        """With two final messages, the first is handed over and nothing after it."""
        handover = Handover(in_order=False)
        handover.post(1, run(end=Kind.RAISE_AND_END))
        handover.post(2, run(end=Kind.END))
        handover.post(0, run("a"))
        assert taken(handover) == [["a"], "RAISE_AND_END"]
        assert handover.taken == 2
