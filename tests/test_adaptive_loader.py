"""BackgroundLoader(depth="auto") with the real threads; byte budget; fixed depth; arguments.

Timings are left to the machine, so these assert directions with large
ratios (a 0.1 s burst against 5-10 ms steps), never durations.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from prefetch import BackgroundLoader, LoaderStats
from prefetch._threads.depth_policy import (
    DEFAULT_MAX_DEPTH,
    MIN_SAMPLES,
    MIN_WAIT_STEPS,
    SHRINK_WINDOW,
    SLOWER_HEADROOM,
    START_DEPTH,
    DepthPolicy,
)
from prefetch._threads.engine import Engine
from prefetch._threads.loader import DEFAULT_MAX_BYTES
from prefetch._threads.reports import REPORT_EVERY
from prefetch._threads.thread_side import ThreadSide

from .liveness import consume, engine_of, wait_for
from .processes import prefetch_threads, wait_until

pytestmark = pytest.mark.timeout(30)

MIB = 1 << 20


def bursty_source(n: int, bursts: set[int], burst: float = 0.1, tensor: int = 0) -> Iterator[Any]:
    """Yield ``0..n-1`` at once, but sleep ``burst`` seconds before the items in ``bursts``.

    With ``tensor`` > 0 each item is ``(i, torch.zeros(tensor))`` instead.
    """
    for i in range(n):
        if i in bursts:
            time.sleep(burst)
        yield (i, torch.zeros(tensor)) if tensor else i


class Reiterable:
    """A re-iterable source: each ``iter()`` calls ``make()`` for a fresh epoch."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Iterator[Any]:
        return iter(self.make())


class Boom(Exception):
    """A source error."""


class TestDefaults:
    """BackgroundLoader adapts its depth unless given an int."""

    def test_auto_by_default(self) -> None:
        """The default is adaptive, starting at depth 2, within 32 items and 1 GiB."""
        loader = BackgroundLoader(range(3))
        assert loader.adaptive
        assert (loader.depth, loader.max_depth, loader.max_bytes) == (2, 32, DEFAULT_MAX_BYTES)
        assert loader.stats.depth is None
        assert list(loader) == [0, 1, 2]
        assert loader.stats.depth == 2

    def test_explicit_bounds(self) -> None:
        """max_depth and max_bytes are kept as given."""
        loader = BackgroundLoader(range(3), "auto", max_depth=8, max_bytes=MIB)
        assert (loader.adaptive, loader.depth, loader.max_depth, loader.max_bytes) == (
            True,
            2,
            8,
            MIB,
        )

    def test_max_depth_below_start(self) -> None:
        """max_depth=1 starts (and stays) at one item."""
        loader = BackgroundLoader(range(5), max_depth=1)
        assert loader.depth == 1
        assert list(loader) == list(range(5))
        assert loader.stats.peak_items <= 1


class TestReports:
    """The consumer reports each hand-off to the policy with consistent numbers."""

    def test_what_the_policy_sees(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Waits reported at once, quiet hand-offs in batches; clock and totals run forward."""
        calls: list[tuple[Any, ...]] = []
        original = DepthPolicy.observe

        fields = (
            "now", "step", "waited", "ready", "fetched",
            "busy_seconds", "blocked_seconds", "largest_item", "count",
        )  # fmt: skip

        due: list[int] = []  # quiet hand-offs that make a report due, at each report

        def spy(self: DepthPolicy, **report: Any) -> int | None:
            calls.append(tuple(report[name] for name in fields))
            due.append(max(REPORT_EVERY, self.value))
            return original(self, **report)

        monkeypatch.setattr(DepthPolicy, "observe", spy)
        loader = BackgroundLoader(Reiterable(lambda: bursty_source(30, {9, 19}, 0.05, 16)))
        assert len(slowly(loader)) == 30
        now, step, waited, ready, fetched, busy, blocked, largest, count = map(
            list, zip(*calls, strict=True)
        )
        assert count[0] == 1  # the epoch's first hand-off, reported at once
        assert all(1 <= c <= d for c, d in zip(count, due, strict=True))
        assert 30 - max(due) < sum(count) <= 30  # a quiet tail may go unreported
        handed = list(itertools.accumulate(count))
        assert 10 in handed  # the first burst, before item 9, is reported at once
        burst = handed.index(10)
        assert waited[burst] > 0.0 and ready[burst] == 0
        # A report is due after exactly max(REPORT_EVERY, depth) quiet hand-offs (the fast
        # path stops there too), or at once when one ran low.
        assert all(c == d or r <= 1 for c, d, r in zip(count, due, ready, strict=True))
        assert all(w == 0.0 for w, r in zip(waited, ready, strict=True) if r > 0)
        assert now == sorted(now)
        assert all(s >= 0.0 for s in step[1:])
        assert fetched == sorted(fetched) and fetched[-1] >= handed[-1]
        assert busy == sorted(busy) and busy[burst] >= 0.045  # the first burst is producer time
        assert blocked == sorted(blocked)
        assert set(largest) == {64}  # one tensor of 16 floats in every item

    def test_quiet_reports_are_exact(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With the buffer full, a report comes after exactly max(REPORT_EVERY, depth) items."""
        counts: list[tuple[int, int]] = []  # (count, ready) of each report
        original = DepthPolicy.observe

        def spy(self: DepthPolicy, **report: Any) -> int | None:
            counts.append((report["count"], report["ready"]))
            return original(self, **report)

        monkeypatch.setattr(DepthPolicy, "observe", spy)
        loader = BackgroundLoader(range(300))
        # Depth 12 at its ceiling: a near miss is not urgent, and the fast path runs 3 items
        # between returns, so without a stop at the report it would pass item 17 by.
        monkeypatch.setattr(loader, "_depth", DepthPolicy(maximum=12, max_bytes=None, start=12))
        assert slowly(loader, 0.001) == list(range(300))
        quiet = [count for count, ready in counts[1:] if ready > 0]
        assert counts[0] == (1, 0)  # the first hand-off always waits
        assert len(quiet) >= 8  # the producer kept ahead: most reports are quiet ones
        assert set(quiet) == {REPORT_EVERY}


class TestAdaptsWithThreads:
    """With the real threads, a burst grows the depth, and it carries to the next epoch."""

    def test_burst_grows_and_carries_over(self) -> None:
        """A 0.1 s burst against 5 ms steps grows the depth; the next epoch starts there."""
        loader = BackgroundLoader(Reiterable(lambda: bursty_source(20, {9})))
        for _ in loader:
            time.sleep(0.005)
        grown = loader.depth
        stats = loader.stats
        assert grown > START_DEPTH
        assert any(e.reason.startswith("grow: waited") for e in stats.depth_events)
        assert stats.depth == grown == stats.peak_depth
        second = iter(loader)
        first = next(second)  # the epoch starts at its first next()
        assert second.stats.depth == grown
        assert engine_of(second).snapshot().depth == grown
        assert [first, *second] == list(range(20))

    def test_complete_and_in_order(self) -> None:
        """Under auto, while the depth changes, every item arrives once and in order."""
        bursts = set(range(9, 100, 10))
        loader = BackgroundLoader(Reiterable(lambda: bursty_source(100, bursts, 0.05)))
        got = []
        for item in loader:
            got.append(item)
            time.sleep(0.001)
        assert got == list(range(100))
        assert any(e.old != e.new for e in loader.stats.depth_events)

    def test_error_in_place(self) -> None:
        """Under auto, a source error arrives as the same object after every item before it."""
        error = Boom("25")

        def source() -> Iterator[int]:
            yield from bursty_source(25, {9})
            raise error

        got: list[int] = []
        with pytest.raises(Boom) as caught:
            for item in BackgroundLoader(source()):
                got.append(item)
                time.sleep(0.005)
        assert caught.value is error
        assert got == list(range(25))

    def test_break_during_adaptation_leaves_no_thread(self) -> None:
        """Breaking out right after the depth grew stops the thread."""
        loader = BackgroundLoader(Reiterable(lambda: bursty_source(1000, {9})))
        for i, _ in enumerate(loader):
            time.sleep(0.005)
            if i == 10:
                break
        assert loader.depth > START_DEPTH
        loader.close()
        assert wait_until(lambda: not prefetch_threads(), 2.0, collect=False)


# ------------------------------------------------------------------------------ memory bound


@pytest.fixture
def posts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Spy on ThreadSide.post: (tickets in flight, tensor bytes buffered) after each run posted."""
    seen: list[tuple[int, int]] = []
    original = ThreadSide.post

    def spy(self: ThreadSide, *args: Any, **kwargs: Any) -> int:
        took_next = original(self, *args, **kwargs)
        figures = self.shared.snapshot()
        seen.append((figures.in_flight - took_next, figures.buffered_bytes))
        return took_next

    monkeypatch.setattr(ThreadSide, "post", spy)
    return seen


def slowly(loader: BackgroundLoader[Any], step: float = 0.005) -> list[Any]:
    """Consume ``loader`` with a ``step``-second loop; return the items."""
    return consume(loader, step)  # fails naming the stuck side, never hangs


class TestMemoryBound:
    """Tensor bytes buffered stay within max_bytes; one item always flows."""

    def test_fixed_depth_with_max_bytes(self, posts: list[tuple[int, int]]) -> None:
        """depth=16 with 1 MiB items and max_bytes=4 MiB buffers 4 items, not 16."""
        loader = BackgroundLoader(
            [torch.zeros(MIB // 4) for _ in range(20)], depth=16, max_bytes=4 * MIB
        )
        assert len(slowly(loader)) == 20
        stats = loader.stats
        assert stats.peak_bytes == 4 * MIB  # the budget fills up, and binds before the depth
        assert stats.peak_items == 4
        assert max(b for _, b in posts) <= 4 * MIB
        assert max(n for n, _ in posts) <= 4

    def test_auto_growth_capped_by_bytes(self, posts: list[tuple[int, int]]) -> None:
        """Under auto, bursts of 1 MiB items grow the depth to max_bytes // item, no further."""
        loader = BackgroundLoader(
            Reiterable(lambda: bursty_source(24, {9, 19}, tensor=MIB // 4)),
            max_bytes=4 * MIB,
        )
        got = slowly(loader, 0.01)
        assert [i for i, _ in got] == list(range(24))
        stats = loader.stats
        assert loader.depth == stats.peak_depth == 4
        assert any(e.reason.startswith("grow") for e in stats.depth_events)
        assert stats.peak_bytes <= 4 * MIB
        assert stats.peak_items <= 4
        assert max(b for _, b in posts) <= 4 * MIB
        assert max(n for n, _ in posts) <= 4

    def test_budget_binds_after_the_depth_grew(self, posts: list[tuple[int, int]]) -> None:
        """Depth grown on small items, then 1 MiB items: the channel keeps to 4 MiB."""

        def source() -> Iterator[Any]:
            # ints (no bytes: no byte cap on growth); each burst at least doubles: 2 -> 4 -> 8
            yield from bursty_source(30, {9, 29})
            for _ in range(12):
                yield torch.zeros(MIB // 4)

        loader = BackgroundLoader(source(), max_bytes=4 * MIB)
        assert len(slowly(loader, 0.01)) == 42
        stats = loader.stats
        assert stats.peak_depth > 4  # else this test proves nothing about the channel
        assert stats.peak_bytes == 4 * MIB
        assert max(b for _, b in posts) <= 4 * MIB

    @pytest.mark.parametrize("depth", ["auto", 4])
    def test_item_larger_than_max_bytes_flows(self, depth: Any) -> None:
        """Items larger than max_bytes are delivered one at a time, without deadlock."""
        items = [torch.full((1024,), float(i)) for i in range(10)]
        loader = BackgroundLoader(items, depth, max_bytes=1000)
        got = slowly(loader, 0.002)
        assert all(a is b for a, b in zip(got, items, strict=True))
        assert loader.stats.peak_items == 1
        assert loader.stats.peak_bytes == 4096

    def test_large_item_among_small_ones(self) -> None:
        """A single item over max_bytes between small ones flows; the small ones still buffer."""
        items = [torch.zeros(4)] * 5 + [torch.zeros(MIB)] + [torch.zeros(4)] * 5
        loader = BackgroundLoader(items, depth=4, max_bytes=MIB)
        got = slowly(loader, 0.002)
        assert [t.numel() for t in got] == [t.numel() for t in items]

    def test_nested_items_count_every_leaf(self) -> None:
        """Dicts and lists of tensors count all their leaves: 2.5 MiB items, 6 MiB budget -> 2."""

        def item() -> dict[str, Any]:
            return {
                "a": torch.zeros(MIB // 4),
                "b": [torch.zeros(MIB // 4), (torch.zeros(MIB // 8), "label")],
            }

        loader = BackgroundLoader([item() for _ in range(15)], depth=16, max_bytes=6 * MIB)
        assert len(slowly(loader)) == 15
        assert loader.stats.peak_items == 2
        assert loader.stats.peak_bytes == 5 * MIB

    def test_close_while_blocked_on_bytes(self) -> None:
        """A producer blocked on the byte budget stops promptly on close()."""
        loader = BackgroundLoader([torch.zeros(MIB // 4)] * 10, depth=8, max_bytes=2 * MIB)
        it = iter(loader)
        next(it)
        engine = engine_of(it)

        def blocked() -> bool:
            figures = engine.snapshot()
            return figures.waiting_threads > 0 and figures.in_flight == 2

        # Both figures are read under the engine's lock: a thread that waits for a ticket
        # with 2 items in flight has decided against a third (2 MiB: bytes, not depth 8).
        wait_for(blocked, "the producer to fill the byte budget (2 items) and wait", 5.0)
        started = time.monotonic()
        it.close()
        assert time.monotonic() - started < 1.0
        assert prefetch_threads() == []


# ------------------------------------------------------------------------------- fixed depth


class TestFixedDepthUnchanged:
    """An int depth is fixed: no policy, no byte counting unless asked."""

    def test_fixed_depth(self, posts: list[tuple[int, int]], monkeypatch: Any) -> None:
        """depth=3 with bursts: never more than 3 taken, no events, depth 3 throughout."""
        set_depth: list[int] = []
        monkeypatch.setattr(Engine, "set_depth", lambda self, d: set_depth.append(d))
        loader = BackgroundLoader(
            Reiterable(lambda: bursty_source(30, {9, 19}, 0.05, tensor=16)), depth=3
        )
        assert (loader.adaptive, loader.depth, loader.max_depth, loader.max_bytes) == (
            False,
            3,
            3,
            None,
        )
        got = slowly(loader, 0.002)
        assert [i for i, _ in got] == list(range(30))
        stats = loader.stats
        assert stats.depth_events == []
        assert stats.depth == stats.peak_depth == loader.depth == 3
        assert stats.peak_items == 3
        assert stats.peak_bytes == 0  # no byte limit: bytes are not counted
        assert max(n for n, _ in posts) == 3
        assert {b for _, b in posts} == {0}
        assert set_depth == []

    def test_fixed_depth_with_bytes_has_no_events(self) -> None:
        """A fixed depth with max_bytes counts bytes but never changes the depth."""
        loader = BackgroundLoader(
            Reiterable(lambda: bursty_source(20, {9}, 0.05, tensor=16)), depth=3, max_bytes=MIB
        )
        slowly(loader, 0.002)
        assert loader.stats.depth_events == []
        assert loader.stats.depth == loader.stats.peak_depth == 3
        assert loader.stats.peak_bytes == 3 * 64


# ----------------------------------------------------------------------------- argument errors


class TestArguments:
    """Bad depth arguments are errors that name the argument, what was expected and the value."""

    def test_max_depth_with_fixed_depth(self) -> None:
        """max_depth with an int depth is a ValueError naming max_depth and 'auto'."""
        with pytest.raises(ValueError, match=r"max_depth=.*only applies with depth='auto'") as e:
            BackgroundLoader([], depth=4, max_depth=8)
        assert "max_depth=8" in str(e.value)
        assert "depth=4" in str(e.value)

    @pytest.mark.parametrize("value", [0, -3])
    def test_depth_below_one(self, value: int) -> None:
        """depth < 1 names depth, both forms it accepts ('auto' or an int) and the value."""
        expected = rf"depth=.*expects 'auto' or an int >= 1, got {value}"
        with pytest.raises(ValueError, match=expected):
            BackgroundLoader([], depth=value)

    @pytest.mark.parametrize("value", [0, -1])
    def test_max_depth_below_one(self, value: int) -> None:
        """max_depth < 1 is a ValueError naming it, what it expects and the value."""
        with pytest.raises(
            ValueError, match=rf"max_depth=.*expects None or an int >= 1, got {value}"
        ):
            BackgroundLoader([], max_depth=value)

    @pytest.mark.parametrize("value", [1.5, "8", True])
    def test_max_depth_not_an_int(self, value: object) -> None:
        """A max_depth that is not an int is a TypeError with the value."""
        with pytest.raises(
            TypeError, match=rf"max_depth=.*expects None or an int >= 1, got {value!r}"
        ):
            BackgroundLoader([], max_depth=value)  # type: ignore[arg-type]

    @pytest.mark.parametrize("depth", ["auto", 3])
    def test_max_bytes_below_one(self, depth: Any) -> None:
        """max_bytes=0 is a ValueError naming it, with any depth."""
        with pytest.raises(ValueError, match=r"max_bytes=.*expects None or an int >= 1, got 0"):
            BackgroundLoader([], depth, max_bytes=0)

    @pytest.mark.parametrize("value", ["1GB", 1.0e9])
    def test_max_bytes_not_an_int(self, value: object) -> None:
        """max_bytes='1GB' is a TypeError quoting the value."""
        with pytest.raises(
            TypeError, match=rf"max_bytes=.*expects None or an int >= 1, got {value!r}"
        ):
            BackgroundLoader([], max_bytes=value)  # type: ignore[arg-type]

    def test_unknown_depth_word(self) -> None:
        """depth='fast' is a ValueError naming 'auto' and quoting the value."""
        with pytest.raises(ValueError, match=r"depth=.*expects 'auto' or an int >= 1, got 'fast'"):
            BackgroundLoader([], depth="fast")  # type: ignore[arg-type]

    def test_nothing_starts_on_a_bad_argument(self) -> None:
        """A bad argument raises before anything runs."""
        with pytest.raises(ValueError):
            BackgroundLoader(range(3), depth=2, max_depth=4)
        assert prefetch_threads() == []


def test_constants() -> None:
    """The documented defaults."""
    assert (START_DEPTH, DEFAULT_MAX_DEPTH, DEFAULT_MAX_BYTES) == (2, 32, 1 << 30)
    assert (SHRINK_WINDOW, MIN_WAIT_STEPS, MIN_SAMPLES) == (128, 0.1, 4)


class TestPolicyFailure:
    """A failure inside a policy reaches the loop and stops the epoch's threads."""

    def test_error_in_the_policy_stops_the_threads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The policy's own error is raised from next() and no prefetch thread is left."""
        boom = ArithmeticError("policy failed")

        def fail(self: Any, **report: float) -> int | None:
            raise boom

        monkeypatch.setattr(DepthPolicy, "observe", fail)
        iterator = iter(BackgroundLoader(range(100)))
        with pytest.raises(ArithmeticError) as caught:
            for _ in iterator:
                pass
        assert caught.value is boom
        assert wait_until(lambda: not prefetch_threads(), 2.0), prefetch_threads()
        with pytest.raises(StopIteration):
            next(iterator)

    def test_a_wait_of_infinitely_many_steps_is_bounded(self) -> None:
        """A wait over a zero mean step grows to the slower producer's headroom, no overflow."""
        policy = DepthPolicy(maximum=8, max_bytes=None)
        policy.start_epoch(LoaderStats(started=0.0))
        for i in range(6):
            policy.observe(
                now=i + 1.0,
                step=1.0,
                waited=0.0,
                ready=2,
                fetched=i + 1,
                busy_seconds=0.1 * (i + 1),
                blocked_seconds=0.9 * i,
                largest_item=0,
            )
        policy._step_sum = 0.0  # the loop's mean step is 0: the wait counts infinitely many
        assert (
            policy.observe(
                now=20.0,
                step=0.0,
                waited=5.0,
                ready=0,
                fetched=7,
                busy_seconds=0.7,
                blocked_seconds=5.0,
                largest_item=0,
            )
            == START_DEPTH + SLOWER_HEADROOM
        )
