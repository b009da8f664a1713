"""Random sequences of loader operations give the items and states a list model predicts.

The system under test is ``BackgroundLoader(ListSource)`` or
``CudaPrefetcher(BackgroundLoader(ListSource))`` (CPU path). The model is a few
integers: where the source stands as far as the consumer can know, which
epoch's permutation is being read, how far the consumer got, and what
``state_dict()`` must say. The only thing the model cannot predict is how far
the producer ran ahead before an epoch was stopped early; there it keeps a
range (at most the wrappers' total depth) and learns the exact value from the
next epoch's start state.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from prefetch import BackgroundLoader, CudaPrefetcher

from .errors import make_errors
from .processes import prefetch_threads, wait_until
from .sources import ListSource

SIZE = 6
ERROR_KINDS = sorted(make_errors())


@dataclass
class Epoch:
    """The model of one running epoch."""

    epoch: int
    order: list[int]
    index: int  # the next index the consumer will receive
    end: int  # the index where the epoch stops (SIZE, or the failing index)
    error: BaseException | None
    done: bool = False


class LoaderMachine(RuleBasedStateMachine):
    """Drive a prefetching loader and a list model with the same random operations."""

    states = Bundle("states")

    def __init__(self) -> None:
        super().__init__()
        self.source = ListSource(SIZE)
        self.loader: Any = None
        self.iterator: Any = None
        self.ahead = 0
        # The model of the source, as the consumer can know it.
        self.pos: int | None = 0  # None: somewhere in [pos_low, pos_high]
        self.pos_low = self.pos_high = 0
        self.next_epoch = 0
        self.active_epoch = 0
        self.expected_state: dict[str, int] = {"pos": 0, "epoch": 0}
        self.current: Epoch | None = None
        self.delivered = 0

    @initialize(
        inner=st.integers(1, 4),
        outer=st.one_of(st.none(), st.integers(1, 3)),
    )
    def build(self, inner: int, outer: int | None) -> None:
        """Wrap the source: BackgroundLoader(depth=inner), optionally inside a CudaPrefetcher."""
        background = BackgroundLoader(self.source, depth=inner)
        if outer is None:
            self.loader = background
            self.ahead = inner
        else:
            self.loader = CudaPrefetcher(background, device="cpu", depth=outer)
            self.ahead = inner + outer

    # ------------------------------------------------------------------ helpers

    def _stop_current(self) -> None:
        """Model: the running epoch was stopped early; the source position becomes a range."""
        current = self.current
        if current is not None and not current.done:
            current.done = True
            self.pos = None
            self.pos_low = current.index
            self.pos_high = min(current.end, current.index + self.ahead)

    # ------------------------------------------------------------------ rules

    @rule(
        fail=st.one_of(st.none(), st.integers(0, SIZE - 1)),
        kind=st.sampled_from(ERROR_KINDS),
    )
    def start_epoch(self, fail: int | None, kind: str) -> None:
        """iter(loader), optionally making the source fail at index ``fail``."""
        error = make_errors()[kind] if fail is not None else None
        self.source.fail_at, self.source.error = fail, error
        # A loop leaves the previous epoch's iterator behind (a `for` loop drops it),
        # so the new iter() stops and joins its thread first. (Two iterators held at
        # once both run; ListSource's iterators share one position: test_iteration.)
        self.iterator = None
        self.iterator = iter(self.loader)
        self._stop_current()  # a new epoch stops the previous one
        start_state = self.loader.state_dict()  # starts the idle epoch: iter(source) runs now
        self.source.fail_at, self.source.error = None, None  # read at iter(source) only
        # The start-of-epoch state may be read before iter(source) (the raw position, the
        # previous epoch's number) or after it (the normalized position, the new epoch).
        before_or_after = {self.active_epoch, self.next_epoch}
        assert start_state["epoch"] in before_or_after, (start_state, before_or_after)
        if self.pos is None:
            # Learn how far the producer ran before the previous epoch was stopped.
            possible = set(range(self.pos_low, self.pos_high + 1))
            assert start_state["pos"] in possible | {0 if SIZE in possible else -1}, (
                start_state,
                self.pos_low,
                self.pos_high,
            )
        else:
            normalized = self.pos if self.pos < SIZE else 0
            assert start_state in (
                {"pos": self.pos, "epoch": self.active_epoch},
                {"pos": normalized, "epoch": self.next_epoch},
            ), start_state
        self.pos = start_state["pos"]
        self.expected_state = dict(start_state)
        start = self.pos if self.pos < SIZE else 0
        self.active_epoch = self.next_epoch
        self.pos = start
        end = fail if fail is not None and fail >= start else SIZE
        self.current = Epoch(
            epoch=self.active_epoch,
            order=ListSource.order(self.active_epoch, SIZE),
            index=start,
            end=end,
            error=error if end < SIZE else None,
        )

    @precondition(lambda self: self.iterator is not None)
    @rule()
    def take(self) -> None:
        """next(iterator): the next item, the injected error (same object), or StopIteration."""
        current = self.current
        assert current is not None
        if current.done:
            with pytest.raises(StopIteration):
                next(self.iterator)
            return
        if current.index == current.end:
            current.done = True
            self.pos = current.end
            if current.error is not None:
                with pytest.raises(BaseException) as info:
                    next(self.iterator)
                assert info.value is current.error
            else:
                with pytest.raises(StopIteration):
                    next(self.iterator)
            with pytest.raises(StopIteration):
                next(self.iterator)
            return
        item = next(self.iterator)
        expected = (current.epoch, current.index, current.order[current.index])
        assert item == expected
        current.index += 1
        self.delivered += 1
        self.expected_state = {"pos": current.index, "epoch": current.epoch}

    @precondition(lambda self: self.iterator is not None)
    @rule(on_loader=st.booleans())
    def close(self, on_loader: bool) -> None:
        """close() on the iterator or on the loader; the epoch is over."""
        if on_loader:
            self.loader.close()
        else:
            self.iterator.close()
        self._stop_current()
        with pytest.raises(StopIteration):
            next(self.iterator)

    @precondition(lambda self: self.iterator is not None)
    @rule()
    def abandon(self) -> None:
        """Drop the iterator without closing it (garbage collection stops its thread)."""
        self.iterator = None
        gc.collect()
        self._stop_current()

    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch: int) -> None:
        """set_epoch passes through to the source; it affects the next iter() only."""
        self.loader.set_epoch(epoch)
        self.next_epoch = epoch

    @rule(target=states)
    def save(self) -> dict[str, int]:
        """state_dict() is the state after the last item the consumer received."""
        state = self.loader.state_dict()
        assert state == self.expected_state
        return dict(state)

    @rule(state=states)
    def load(self, state: dict[str, int]) -> None:
        """load_state_dict() stops the epoch, saying so; the next iter() resumes after that item."""
        self.loader.load_state_dict(dict(state))
        was_open = self.current is not None and not self.current.done
        if self.current is not None:
            self.current.done = True
        self.pos = state["pos"]
        self.next_epoch = self.active_epoch = state["epoch"]
        self.expected_state = dict(state)
        if self.iterator is not None:
            if was_open:  # an open epoch never ends silently
                with pytest.raises(RuntimeError, match="load_state_dict"):
                    next(self.iterator)
            with pytest.raises(StopIteration):
                next(self.iterator)

    @invariant()
    def at_most_two_threads(self) -> None:
        """Never more than the current producer plus one that is still stopping."""
        assert len(prefetch_threads()) <= 2

    def teardown(self) -> None:
        """Close everything; no prefetch thread survives the example."""
        if self.loader is not None:
            self.loader.close()
        self.iterator = None
        self.current = None
        assert wait_until(lambda: not prefetch_threads(), 3.0), prefetch_threads()


LoaderMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class TestLoaderModel(LoaderMachine.TestCase):  # type: ignore[misc,valid-type]
    """Random operation sequences agree with the list model (hypothesis, < 30 s)."""

    pytestmark = pytest.mark.timeout(120)
