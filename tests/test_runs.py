"""Runs (issue 22): a fast source and a fast loop meet once per run, every invariant kept.

The thread posts what it drew in runs and the consumer takes every run
posted in one locked section; these tests check that runs do form, and that
order, errors in place, exact resume, the depth and byte bounds and a stop
in the middle of a run all hold with them.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader
from prefetch._threads import producers
from prefetch._threads.consumer_side import ConsumerSide
from prefetch._threads.reports import Reports
from prefetch._threads.thread_side import ThreadSide

from .clocks import FakeClock
from .gil import gil_enabled
from .liveness import consume, engine_of, wait_went_ahead
from .processes import prefetch_threads, wait_until


class Boom(Exception):
    """An error a source raises and goes on after."""


class GoesOn:
    """``range(n)`` that raises ``errors[i]`` instead of item ``i`` and goes on, as a DataLoader."""

    def __init__(self, n: int, errors: dict[int, Exception]) -> None:
        self.n, self.errors, self.index = n, errors, 0

    def __iter__(self) -> GoesOn:
        return self

    def __next__(self) -> int:
        index = self.index
        if index >= self.n:
            raise StopIteration
        self.index += 1
        if index in self.errors:
            raise self.errors[index]
        return index


def outcomes(iterator: Iterator[Any]) -> list[tuple[str, Any]]:
    """Every item and every error ``iterator`` gives, in order, until it ends."""
    seen: list[tuple[str, Any]] = []
    while True:
        try:
            seen.append(("item", next(iterator)))
        except StopIteration:
            return seen
        except Boom as error:
            seen.append(("error", error))


class TestRunsForm:
    """A fast source is handed over many items per locked section, not one."""

    def test_items_per_exchange_and_per_post(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """At depth 64, 20000 ints take a few thousand posts and exchanges at most, not 20000.

        How many depends on the threads' relative speed. With the GIL on, a thread posts
        every 50 µs of draws: 300 to 700 posts here, 1,565 exchanges (tickets come back 16
        at a time). With it off, a waiting loop is woken as soon as a quarter of the
        tickets the thread took are drawn, and the tickets come back 16 at a time: posts
        of 4 to 16 items: 1,179 to 6,378 posts and 1,350 to 6,508 exchanges over 15 new
        processes of 3.13t (a CI run failed the bound of 8 items a post it had with 2,829
        posts). Three items in two posts on average still tell runs from single items.
        """
        posts: list[int] = []
        taken: list[int] = []
        post, exchange = ThreadSide.post, ConsumerSide.exchange

        def spy_post(self: ThreadSide, seq: int, run: Any, *args: Any, **kwargs: Any) -> int:
            posts.append(len(run.items))
            return post(self, seq, run, *args, **kwargs)

        def spy_exchange(self: ConsumerSide, *args: Any, **kwargs: Any) -> Any:
            runs, waited = exchange(self, *args, **kwargs)
            taken.append(sum(len(run.items) for run in runs))
            return runs, waited

        monkeypatch.setattr(ThreadSide, "post", spy_post)
        monkeypatch.setattr(ConsumerSide, "exchange", spy_exchange)
        assert list(BackgroundLoader(range(20_000), depth=64)) == list(range(20_000))
        assert sum(posts) == sum(taken) == 20_000
        per_post, per_exchange = (8, 4) if gil_enabled() else (1.5, 1.5)  # on average, at least
        assert len(posts) <= 20_000 / per_post
        assert len(taken) <= 20_000 / per_exchange

    @pytest.mark.parametrize(
        ("steps", "expected"),
        [
            ([0.0], [1, 39]),  # draws that take no time: the whole count at once
            ([2e-6], [1, 25, 14]),  # 50 µs of draws a post, the count's rest in the last
            ([20e-6], [1] + [2] * 19 + [1]),
            ([30e-6], [1] * 40),  # at least one item a post
            # a draw that turns slow (100 µs) is posted at once, with what was held
            ([1e-6] * 20 + [100e-6] * 3 + [1e-6], [1, 20, 1, 1, 1, 16]),
            # slower draws, each under 50 µs: held for the count, the loop being away
            ([1e-6] * 20 + [30e-6], [1, 39]),
        ],
    )
    def test_posts_follow_the_pace_of_the_draws(
        self, monkeypatch: pytest.MonkeyPatch, steps: list[float], expected: list[int]
    ) -> None:
        """With the loop away, the thread posts what it drew every ``POST_AFTER`` (50 µs) of
        draws, one item first while the pace is unknown, and at once after a draw of 50 µs
        or more, on a clock the source moves (the last step repeats)."""
        clock = FakeClock()
        monkeypatch.setattr(producers, "time", clock)
        posts: list[int] = []
        post = ThreadSide.post

        def spy(self: ThreadSide, seq: int, run: Any, *args: Any, **kwargs: Any) -> int:
            posts.append(len(run.items))
            return post(self, seq, run, *args, **kwargs)

        monkeypatch.setattr(ThreadSide, "post", spy)

        def source() -> Iterator[int]:
            for index in range(100):
                clock.advance(steps[min(index, len(steps) - 1)])
                yield index

        iterator = iter(BackgroundLoader(source(), depth=40))
        try:
            wait_went_ahead(engine_of(iterator))  # no next() yet: the loop never waits
            assert posts == expected
            assert list(iterator) == list(range(100))
        finally:
            iterator.close()

    @pytest.mark.parametrize("depth", [64, "auto"])
    def test_each_item_is_counted_once(self, depth: int | str) -> None:
        """``stats.items`` is the items handed over, those of the fast path included."""
        loader = BackgroundLoader(range(5_000), depth=depth)
        assert sum(1 for _ in loader) == 5_000
        assert loader.stats.items == 5_000


class TestOrderAndErrors:
    """Errors raised between items stand in their place inside runs, as the same objects."""

    @pytest.mark.parametrize("depth", [1, 2, 8, 64, "auto"])
    def test_same_outcomes_as_the_source(self, depth: Any) -> None:
        """Items and errors (several in a row, at the start and the end) arrive in source order."""
        errors: dict[int, Exception] = {i: Boom(i) for i in (0, 3, 50, 51, 52, 200, 1999)}
        expected = outcomes(GoesOn(2000, errors))
        got = outcomes(iter(BackgroundLoader(GoesOn(2000, errors), depth=depth)))
        assert [kind for kind, _ in got] == [kind for kind, _ in expected]
        assert all(a is b or a == b for (_, a), (_, b) in zip(got, expected, strict=True))


class TestResume:
    """A checkpoint taken anywhere inside a run resumes right after the last item handed over."""

    @pytest.mark.parametrize("taken", [0, 1, 7, 31, 32, 33, 100, 199, 200])
    def test_state_after_k_items(self, taken: int) -> None:
        """Take k items (the thread runs ahead in runs), save, load: the rest is the plain rest."""
        loader = BackgroundLoader(StatefulDataLoader(list(range(200)), batch_size=None), depth=64)
        iterator = iter(loader)
        head = [int(next(iterator)) for _ in range(taken)]
        wait_went_ahead(engine_of(iterator))  # the thread read as far ahead as it may
        state = loader.state_dict()
        iterator.close()
        loader.load_state_dict(state)
        assert head + [int(x) for x in loader] == list(range(200))


class TestBounds:
    """Runs never pass the depth or the byte budget, and reach them when the loop is slow."""

    @pytest.mark.parametrize("depth", [1, 4, 32])
    def test_items_ahead_reach_and_never_pass_the_depth(self, depth: int) -> None:
        """Items drawn and not handed over: at most depth at every step, depth when the loop lags.

        Tickets come back every quarter of the depth (and wake the thread), so
        between two returns it may have up to a quarter less room: depth is
        reached right after a return.
        """
        drawn = [0]

        def source() -> Iterator[int]:
            for index in range(200):
                drawn[0] += 1
                yield index

        ahead = []
        for handed, _ in enumerate(BackgroundLoader(source(), depth=depth), start=1):
            wait_until(
                lambda: drawn[0] - handed >= depth or drawn[0] == 200,  # noqa: B023
                0.02,
                0.001,
                collect=False,
            )
            ahead.append(drawn[0] - handed)
        assert max(ahead) == depth
        assert min(ahead[: 200 - depth]) >= depth - max(1, depth // 4)

    def test_bytes_reach_and_never_pass_the_budget(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """1 KiB tensors, 8 KiB budget, depth 64: the bytes buffered peak at exactly 8 KiB."""
        seen: list[int] = []
        post = ThreadSide.post

        def spy(self: ThreadSide, *args: Any, **kwargs: Any) -> int:
            took = post(self, *args, **kwargs)
            seen.append(self.shared.snapshot().buffered_bytes)
            return took

        monkeypatch.setattr(ThreadSide, "post", spy)
        items = [torch.zeros(256) for _ in range(100)]
        loader = BackgroundLoader(items, depth=64, max_bytes=8 * 1024)
        got = consume(loader, step=0.001)
        assert all(a is b for a, b in zip(got, items, strict=True))
        assert max(seen) <= 8 * 1024
        assert loader.stats.peak_bytes == 8 * 1024

    def test_a_used_up_run_gives_every_ticket_back(self) -> None:
        """When the loop takes the last item it holds and no run is queued, every ticket
        comes back then, not only at the quarter-depth returns: the thread can fill the
        whole depth again while the loop holds that item.
        """
        depth = 30  # tickets come back every 7 items; the 30th is a run's last
        gate = threading.Event()
        drawn = [0]

        def source() -> Iterator[int]:
            for index in range(100):
                if index == depth:
                    gate.wait(10.0)  # nothing is posted after item 29 until the loop took it
                drawn[0] += 1
                yield index

        iterator = iter(BackgroundLoader(source(), depth=depth))
        engine = engine_of(iterator)
        try:
            wait_went_ahead(engine)  # items 0..29 drawn and posted
            assert [next(iterator) for _ in range(depth)] == list(range(depth))
            gate.set()
            wait_went_ahead(engine)  # as far as the tickets given back let it
            assert drawn[0] - depth == depth
        finally:
            gate.set()
            iterator.close()

    def test_no_byte_limit_counts_no_bytes(self) -> None:
        """Without max_bytes a fixed depth measures no item (peak_bytes 0); an iterator's
        items are not collated (collate_seconds 0); with a limit the bytes count."""
        items = [torch.zeros(256) for _ in range(40)]
        loader = BackgroundLoader(items, depth=8)
        assert all(a is b for a, b in zip(loader, items, strict=True))
        assert (loader.stats.peak_bytes, loader.stats.collate_seconds) == (0, 0.0)
        bounded = BackgroundLoader(items, depth=8, max_bytes=1 << 20)
        assert len(list(bounded)) == 40
        assert bounded.stats.peak_bytes >= 1024

    @pytest.mark.parametrize("budget", [8 * 1024, 64 * 1024])
    def test_every_ticket_and_byte_comes_back(self, budget: int) -> None:
        """After a whole epoch nothing is in flight: every item's ticket and bytes are back,
        those of runs the loop went through between two exchanges included."""
        items = [torch.zeros(256) for _ in range(300)]
        iterator = iter(BackgroundLoader(items, depth=64, max_bytes=budget))
        engine = engine_of(iterator)
        assert len(list(iterator)) == 300
        snapshot = engine.snapshot()
        assert (snapshot.in_flight, snapshot.buffered_bytes) == (0, 0)


class TestReadyReported:
    """What the adaptive depth hears at a hand-over: the items the loop could take at once."""

    def test_ready_is_what_the_loop_holds(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Reported ``ready`` (this item included) is at least 1 and at most what was drawn
        and not handed before; it reaches that bound whenever the loop just took every run
        (the thread waits for tickets before each ``next()``, having posted all it drew).
        """
        drawn = [0]

        def source() -> Iterator[int]:
            for index in range(120):
                drawn[0] += 1
                yield index

        seen: list[tuple[int, int]] = []  # (ready reported, drawn and not handed before)
        hand_over = Reports.hand_over

        def spy(self: Reports, ready: int, stats: Any, engine: Any) -> bool:
            seen.append((ready, drawn[0] - (stats.items - 1)))
            return hand_over(self, ready, stats, engine)

        monkeypatch.setattr(Reports, "hand_over", spy)
        iterator = iter(BackgroundLoader(source()))  # depth="auto": reports are on
        engine = engine_of(iterator)
        try:
            for _ in range(120):
                wait_went_ahead(engine)  # drawn == posted: the thread waits with nothing held
                next(iterator)
        finally:
            iterator.close()  # its thread ends here, whatever failed
        assert seen
        assert all(1 <= ready <= most for ready, most in seen), seen
        assert any(ready == most > 1 for ready, most in seen), seen


class Tracked:
    """An item whose making and collection are counted."""

    made = freed = 0

    def __init__(self) -> None:
        Tracked.made += 1
        weakref.finalize(self, Tracked.count)

    @staticmethod
    def count() -> None:
        Tracked.freed += 1


class TestStopHalfServed:
    """close() in the middle of a run frees every item of it the loop did not take."""

    def test_close_frees_the_rest(self) -> None:
        """Five items of a run taken, the thread ahead: after close() only those five are alive."""
        Tracked.made = Tracked.freed = 0
        items = (Tracked() for _ in range(500))
        iterator = iter(BackgroundLoader(items, depth=64))
        kept = [next(iterator) for _ in range(5)]
        assert wait_until(lambda: Tracked.made >= 5 + 32, 2.0, collect=False)  # a run ahead
        iterator.close()
        del iterator
        assert wait_until(lambda: not prefetch_threads(), 2.0)
        gc.collect()
        assert len(kept) == 5
        assert Tracked.freed == Tracked.made - 5  # every item drawn and not handed over


def _raise(error: BaseException) -> bool:
    raise error


def first_error(loader: BackgroundLoader[Any]) -> BaseException:
    """Return the first ``next()``'s error; its traceback holds this frame's iterator."""
    iterator = iter(loader)
    try:
        next(iterator)
    except Boom as error:
        return error
    raise AssertionError("no error")


class TestPostedErrorNotKept:
    """The thread keeps nothing it posted: an error raised in the loop carries the loop's frames."""

    @pytest.mark.parametrize("depth", [1, 8])
    def test_dropping_the_error_frees_the_epoch(self, depth: int) -> None:
        """The loop drops the error (and with it the iterator): the thread, waiting, is stopped."""
        # A source that keeps no reference to its error (as a DataLoader re-raising a worker's).
        source = (Boom(0) if i == 0 else i for i in range(100))
        failing = (x for x in source if not isinstance(x, Boom) or _raise(x))
        error = first_error(BackgroundLoader(failing, depth=depth))
        assert isinstance(error, Boom)
        del error
        assert wait_until(lambda: not prefetch_threads(), 3.0)  # the collector frees the cycle
