"""prefetch.compat: a drop-in for prefetch_generator, measured against the original."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import prefetch_generator
import pytest

from prefetch import compat

from . import liveness
from .liveness import engine_of, wait_for
from .processes import prefetch_threads, wait_until

pytestmark = pytest.mark.timeout(30)

IMPLEMENTATIONS: dict[str, Callable[..., Any]] = {
    "original": prefetch_generator.BackgroundGenerator,
    "compat": compat.BackgroundGenerator,
}


def drain_original(generator: Any) -> None:
    """Unblock a leaked original thread by emptying its queue until it ends."""
    while generator.is_alive():
        while not generator.queue.empty():
            generator.queue.get_nowait()
        generator.join(0.01)


def waits_in_put(original: Any) -> bool:
    """Whether the original's thread waits inside ``Queue.put`` of its full queue.

    Its queue cannot empty while the test takes nothing, so it waits there for good.
    Read from the queue's own state under its mutex: a waiter on ``not_full`` (only
    ``put`` waits there) while the queue is full. Not from the thread's frames: walking
    a running thread's frames from another thread crashed 3.13t.
    """
    waiting = original.queue
    with waiting.mutex:
        return bool(waiting.not_full._waiters) and waiting._qsize() >= waiting.maxsize


def went_ahead(generator: Any) -> bool:
    """Whether the producer of ``generator`` (either implementation) went as far as it may."""
    if isinstance(generator, compat.BackgroundGenerator):
        return liveness.went_ahead(engine_of(generator._iterator))  # the loader epoch inside
    return waits_in_put(generator)


def settled(generator: Any, counter: list[int]) -> int:
    """Return ``counter[0]`` once the producer of ``generator`` went as far ahead as it may."""
    wait_for(lambda: went_ahead(generator), "the producer to wait for room", collect=False)
    return counter[0]


class TestSameBehaviour:
    """Code written for prefetch_generator works unchanged with compat."""

    @pytest.mark.parametrize("name", IMPLEMENTATIONS)
    @pytest.mark.parametrize("max_prefetch", [1, 3, 0])
    def test_full_iteration(self, name: str, max_prefetch: int) -> None:
        """Both deliver every item in order, for bounded and unbounded queues."""
        generator = IMPLEMENTATIONS[name](iter(range(50)), max_prefetch=max_prefetch)
        assert list(generator) == list(range(50))

    @pytest.mark.parametrize("name", IMPLEMENTATIONS)
    def test_next_method_and_exception(self, name: str) -> None:
        """.next() works and an Exception from the source reaches the caller."""

        def source() -> Iterator[int]:
            yield 1
            raise ValueError("bad")

        generator = IMPLEMENTATIONS[name](source())
        assert generator.next() == 1
        with pytest.raises(ValueError, match="bad"):
            generator.next()

    @pytest.mark.parametrize("name", IMPLEMENTATIONS)
    def test_preprocess_func(self, name: str) -> None:
        """The deprecated preprocess_func argument still applies to each item."""
        assert list(IMPLEMENTATIONS[name](iter([1, 2]), 1, lambda x: x * 10)) == [10, 20]

    def test_decorators(self) -> None:
        """@background and @prefetch wrap a generator function like the original's."""
        for decorate in (compat.background, compat.prefetch):

            @decorate(max_prefetch=2)
            def count(n: int) -> Iterator[int]:
                yield from range(n)

            assert list(count(5)) == [0, 1, 2, 3, 4]
            assert count.__name__ == "count"

    @pytest.mark.parametrize("max_prefetch", [1, 2, 5])
    def test_max_prefetch_buffers_as_the_original(self, max_prefetch: int) -> None:
        """At the same max_prefetch both take max_prefetch + 1 items ahead of the consumer."""
        leads = {}
        for name, cls in IMPLEMENTATIONS.items():
            produced = [0]

            def source(counter: list[int] = produced) -> Iterator[int]:
                for i in range(50):
                    counter[0] += 1
                    yield i

            generator = cls(source(), max_prefetch=max_prefetch)
            first = settled(generator, produced)
            assert next(generator) == 0
            second = settled(generator, produced) - 1
            leads[name] = (first, second)
            list(generator)
        expected = (max_prefetch + 1, max_prefetch + 1)
        assert leads == {"original": expected, "compat": expected}

    def test_bad_max_prefetch(self) -> None:
        """A non-int max_prefetch is a TypeError naming the argument."""
        with pytest.raises(TypeError, match=r"^BackgroundGenerator\(max_prefetch=.*got '2'"):
            compat.BackgroundGenerator(iter([]), max_prefetch="2")  # type: ignore[arg-type]

    def test_bad_max_prefetch_of_the_decorator(self) -> None:
        """The decorator's error names the decorator, not the class it builds later."""
        with pytest.raises(TypeError, match=r"^background\(max_prefetch=...\) .* got 1.5 of"):
            compat.background(max_prefetch=1.5)  # type: ignore[arg-type]


class TestThreadLike:
    """The Thread methods code calls on the original answer the same on compat."""

    @pytest.mark.parametrize("name", IMPLEMENTATIONS)
    def test_join_and_is_alive(self, name: str) -> None:
        """Alive while blocked on a full buffer; join(timeout) returns; ended once drained."""
        generator = IMPLEMENTATIONS[name](iter(range(10)), max_prefetch=1)
        assert generator.is_alive()
        generator.join(timeout=0.05)
        assert generator.is_alive()  # blocked: nobody consumes
        assert list(generator) == list(range(10))
        generator.join(timeout=5)
        assert not generator.is_alive()

    @pytest.mark.parametrize("name", IMPLEMENTATIONS)
    def test_daemon_name_ident_and_start(self, name: str) -> None:
        """A daemon thread with a name and an ident, already started (start() raises)."""
        generator = IMPLEMENTATIONS[name](iter(range(3)))
        assert generator.daemon is True
        assert isinstance(generator.name, str) and generator.name
        assert isinstance(generator.ident, int)
        with pytest.raises(RuntimeError, match="started once"):
            generator.start()
        assert list(generator) == [0, 1, 2]
        generator.join(timeout=5)

    def test_stated_differences(self) -> None:
        """Not a Thread subclass, read-only daemon/name, no internals: as the docs say."""
        original = prefetch_generator.BackgroundGenerator(iter(range(3)))
        ours = compat.BackgroundGenerator(iter(range(3)))
        assert isinstance(original, threading.Thread)
        assert not isinstance(ours, threading.Thread)
        assert ours.name.startswith("prefetch-")
        with pytest.raises(RuntimeError):
            original.daemon = False  # type: ignore[misc]
        with pytest.raises(AttributeError):
            ours.daemon = False  # type: ignore[misc]
        for attribute in ("queue", "generator", "Continue", "run"):
            assert hasattr(original, attribute)
            assert not hasattr(ours, attribute)
        assert list(original) == list(ours) == [0, 1, 2]
        original.join(timeout=5)


class TestArguments:
    """Bad input is an error naming compat's own argument."""

    def test_not_iterable_names_generator(self) -> None:
        """BackgroundGenerator(3) names the generator argument and the value."""
        with pytest.raises(TypeError, match=r"BackgroundGenerator\(generator=...\).*int 3"):
            compat.BackgroundGenerator(3)  # type: ignore[arg-type]


class TestWhereTheOriginalFails:
    """The scenarios users hit: the original fails, compat holds."""

    def test_early_break_leaks_the_original_thread(self) -> None:
        """After break + gc the original's thread stays blocked; compat's is gone."""
        original = prefetch_generator.BackgroundGenerator(iter(range(100)), max_prefetch=1)
        for item in original:
            if item == 2:
                break
        gc.collect()
        # leaked: its thread waits in queue.put for good (the wait fails if it never does)
        wait_for(lambda: waits_in_put(original), "the original's thread to wait in put()")
        drain_original(original)

        ours = compat.BackgroundGenerator(iter(range(100)), max_prefetch=1)
        for item in ours:
            if item == 2:
                break
        del ours
        gc.collect()
        assert wait_until(lambda: not prefetch_threads(), 2.0, collect=False)

    @pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(2)])
    def test_base_exception_truncates_the_original(self, error: BaseException) -> None:
        """A KeyboardInterrupt/SystemExit in the source silently ends the original's data."""

        def source() -> Iterator[int]:
            yield 1
            raise error

        # the original's thread dies printing the error; keep it out of pytest's warnings
        hook, threading.excepthook = threading.excepthook, lambda args: None
        try:
            assert list(prefetch_generator.BackgroundGenerator(source())) == [1]
        finally:
            threading.excepthook = hook
        got: list[int] = []
        with pytest.raises(type(error)) as caught:
            for item in compat.BackgroundGenerator(source()):
                got.append(item)
        assert caught.value is error
        assert got == [1]

    def test_none_item_is_delivered(self) -> None:
        """None is an item for both (the pre-1.0.3 copies ended the data on it)."""
        assert list(compat.BackgroundGenerator(iter([1, None, 2]))) == [1, None, 2]

    def test_decorated_generator_is_closed_on_break(self) -> None:
        """Stopping a @background generator early runs its finally block."""
        finished = threading.Event()

        @compat.background(max_prefetch=1)
        def source() -> Iterator[int]:
            try:
                yield from range(1000)
            finally:
                finished.set()

        for item in source():
            if item == 1:
                break
        gc.collect()
        assert finished.wait(2)
