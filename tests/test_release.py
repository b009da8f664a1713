"""What is let go, and when: prefetched items, the user's generator, the source before its error.

Each class pins one ordering or lifetime rule that the rest of the suite
would not notice losing (found by mutating the engine).
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
import weakref
from collections.abc import Iterator

import pytest
from torch.utils.data import DataLoader

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._threads import iterator as background_iterator

from . import fake_device
from .liveness import LIVENESS_SECONDS, take, wait_for
from .processes import live_child_pids, prefetch_threads, settle
from .sources import SlowDataset, Tracked

pytestmark = pytest.mark.timeout(60)


class Made:
    """Tracked items made by ``items()``, and how many are alive (weak references)."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref[Tracked]] = []

    def track(self, index: int) -> Tracked:
        item = Tracked(index)
        self.refs.append(weakref.ref(item))
        return item

    def items(self, n: int = 50) -> Iterator[Tracked]:
        for index in range(n):
            yield self.track(index)  # no local: the suspended generator holds no item

    def live(self) -> int:
        return sum(ref() is not None for ref in self.refs)


class TestAbandonedEpoch:
    """After ``break`` and garbage collection the loader keeps no prefetched item alive."""

    def test_prefetched_items_freed(self) -> None:
        """Items the thread buffered ahead of a broken loop are freed, the loader still alive."""
        made = Made()

        class Source:  # re-iterable: nothing read ahead is carried to a next epoch
            def __iter__(self) -> Iterator[Tracked]:
                return made.items()

        loader = BackgroundLoader(Source(), depth=4)
        for first in loader:
            assert first.index == 0
            # 1 handed over + 4 buffered: the buffer is full before we leave.
            wait_for(lambda: made.live() == 5, lambda: f"{made.live()} alive, not 5")
            break
        del first
        gc.collect()
        wait_for(lambda: not prefetch_threads(), lambda: "thread still alive", LIVENESS_SECONDS)
        gc.collect()
        assert made.live() == 0, f"{made.live()} prefetched items kept alive after break + GC"
        assert loader.stats.items == 1

    def test_a_one_shot_sources_read_ahead_is_kept_until_the_loader_goes(self) -> None:
        """Over a generator the 4 items read ahead are kept for the next epoch, freed with it."""
        made = Made()
        loader = BackgroundLoader(made.items(), depth=4)
        for first in loader:
            assert first.index == 0
            wait_for(lambda: made.live() == 5, lambda: f"{made.live()} alive, not 5")
            break
        del first
        gc.collect()
        wait_for(lambda: not prefetch_threads(), lambda: "thread still alive", LIVENESS_SECONDS)
        assert made.live() == 4  # read ahead, not handed over: the next epoch's first items
        del loader
        gc.collect()
        assert made.live() == 0


class TestUserGenerator:
    """A generator the user passed in is never closed; one we made with ``iter()`` is."""

    @staticmethod
    def generator(closed: list[bool]) -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            closed.append(True)

    @pytest.mark.parametrize("how", ["close", "break", "exhaust-next-epoch"])
    def test_background_leaves_it_open(self, how: str) -> None:
        """BackgroundLoader(g): break, close() or a new epoch leave g open and resumable."""
        closed: list[bool] = []
        g = self.generator(closed)
        loader = BackgroundLoader(g, depth=2)
        for _ in loader:
            break
        if how == "close":
            loader.close()
        else:
            for _ in loader:  # the next epoch stops the previous one first
                break
            loader.close()
        assert settle() == ([], [])
        assert closed == []
        assert next(g) > 0  # still running where the thread left it

    def test_device_leaves_it_open(self) -> None:
        """CudaPrefetcher(g): close() in mid-epoch leaves g open and resumable."""
        closed: list[bool] = []
        g = self.generator(closed)
        prefetcher = CudaPrefetcher(g, device="cpu")
        iterator = iter(prefetcher)  # held, so close() stops this very epoch
        assert next(iterator) == 0
        prefetcher.close()
        assert closed == []
        assert next(g) == 1

    def test_own_iterator_is_closed(self) -> None:
        """An iterator created by iter(loader) is closed when the epoch stops early."""
        closed: list[bool] = []

        class Source:
            def __iter__(self) -> Iterator[int]:
                return TestUserGenerator.generator(closed)

        loader = BackgroundLoader(Source(), depth=2)
        for _ in loader:
            break
        loader.close()
        assert closed == [True]


class Fatal(BaseException):
    """A source error that ends the epoch (not an ``Exception``, as ``SystemExit`` is not)."""


class SlowToRelease:
    """Iterators that end with ``Fatal`` at ``fail_at`` and take ``delay`` s to close."""

    def __init__(self, fail_at: int, delay: float) -> None:
        self.fail_at = fail_at
        self.delay = delay
        self.released = threading.Event()
        self.calls_after_error = 0

    def __iter__(self) -> Iterator[int]:
        return self.Iterator(self)

    class Iterator:
        """Counts up, raises ``Fatal`` at ``fail_at``; ``close()`` is slow (hung workers)."""

        def __init__(self, owner: SlowToRelease) -> None:
            self.owner = owner
            self.index = 0
            self.error: Fatal | None = None

        def __iter__(self) -> SlowToRelease.Iterator:
            return self

        def __next__(self) -> int:
            if self.error is not None:
                self.owner.calls_after_error += 1
                raise StopIteration
            if self.index == self.owner.fail_at:
                self.error = Fatal(f"item {self.index} is broken")
                raise self.error
            self.index += 1
            return self.index - 1

        def close(self) -> None:
            time.sleep(self.owner.delay)
            self.owner.released.set()


class TestErrorAfterRelease:
    """An error that ends the epoch reaches the loop only after the source was released."""

    def test_slow_release_delays_the_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With a release slower than close()'s timeout the final error still waits for it."""
        monkeypatch.setattr(background_iterator, "CLOSE_TIMEOUT", 0.1)
        source = SlowToRelease(fail_at=3, delay=0.6)
        iterator = iter(BackgroundLoader(source, depth=2))
        assert [take(iterator) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(Fatal, match="item 3 is broken"):
            take(iterator)
        assert source.released.is_set(), "the error reached the loop before the source released"

    def test_dataloader_workers_gone_once_the_loop_drops_the_error(self) -> None:
        """A worker's error goes on (the DataLoader can); once it ends the loop, workers exit."""
        data = DataLoader(SlowDataset(8), batch_size=1, num_workers=2, sampler=[0, 1, -1, 2])
        got: list[int] = []
        with pytest.raises(ValueError, match="poisoned index -1") as caught:
            for batch in BackgroundLoader(data, depth=2):
                got.append(int(batch))
        assert got == [0, 1]
        held = caught.value
        wait_for(
            lambda: live_child_pids() == [],
            lambda: f"workers {live_child_pids()} alive while the error is held",
            WORKER_EXIT_SECONDS,
        )
        assert held.__traceback__ is not None  # the error and its frames were held meanwhile


WORKER_EXIT_SECONDS = 15.0
"""How long DataLoader worker processes may take to exit once released: their shutdown
joins processes, and on a loaded 2-core machine that took over 2 s (1 run in 30, with four
heavy jobs beside it). A worker kept alive by the held error never exits."""


class TestDeviceEarlyRelease:
    """The device path releases its source as soon as an epoch-ending error is queued."""

    def test_source_released_before_the_error_is_due(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The source is closed, and never asked again, while batches before its error wait."""
        fake_device.install(monkeypatch)
        source = SlowToRelease(fail_at=3, delay=0.0)
        # The producer's Fatal reaches the device iterator as its source's own error (queued
        # in its place), not as an interrupt on the loop's thread.
        prefetcher = CudaPrefetcher(BackgroundLoader(source, depth=4), depth=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # unpinned CPU tensors: expected here
            iterator = iter(prefetcher)
            got = [int(next(iterator))]  # queues batches 1 and 2, then the error, behind it
            assert source.released.is_set(), "source still open while the error waits its turn"
            got += [int(next(iterator)) for _ in range(2)]
            with pytest.raises(Fatal, match="item 3 is broken"):
                next(iterator)
            with pytest.raises(StopIteration):
                next(iterator)
        assert got == [0, 1, 2]
        assert source.calls_after_error == 0, "the source was asked for more after its end"


class StateRaises(DataLoader):  # type: ignore[type-arg]
    """A checkpointing DataLoader whose ``state_dict`` raises ``Fatal`` (Ctrl-C inside it)."""

    def state_dict(self) -> dict[str, int]:
        raise Fatal("state_dict interrupted")

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Never called here."""


class CloseRaises:
    """A stateful loader whose ``state_dict`` raises ``Fatal`` and whose iterator's
    ``close()`` raises ``ValueError``."""

    def __iter__(self) -> Iterator[int]:
        return self.Iterator()

    def state_dict(self) -> dict[str, int]:
        raise Fatal("state_dict interrupted")

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Never called here."""

    class Iterator:
        """Never read; its release fails."""

        def __iter__(self) -> CloseRaises.Iterator:
            return self

        def __next__(self) -> int:
            raise AssertionError("never read")

        def close(self) -> None:
            raise ValueError("close failed")


class TestRefusedStart:
    """An epoch start that raises after ``iter()`` of the loader releases what it made."""

    @pytest.mark.parametrize("wrapper", ["background", "cuda"])
    def test_no_worker_outlives_an_error_before_the_launch(
        self, wrapper: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The start state's read raises: the error comes out of the first ``next()``
        raised, and the worker processes ``iter()`` started do not outlive it, though
        the traceback (held here, as a logger or a debugger would) holds its frames."""
        fake_device.install(monkeypatch)
        data = StateRaises(SlowDataset(8, delay=0.0), batch_size=2, num_workers=2)
        loader = BackgroundLoader(data) if wrapper == "background" else CudaPrefetcher(data)
        with pytest.raises(Fatal, match="state_dict interrupted") as raised:
            next(iter(loader))
        wait_for(lambda: not live_child_pids(), lambda: f"worker processes {live_child_pids()}")
        wait_for(lambda: not prefetch_threads(), lambda: f"threads {prefetch_threads()}")
        assert raised.tb is not None  # held until here

    def test_an_error_releasing_the_source_is_a_note_on_the_first(self) -> None:
        """The release raises too: the start's error is the one raised, the release's
        error a note on it."""
        with pytest.raises(Fatal, match="state_dict interrupted") as raised:
            next(iter(BackgroundLoader(CloseRaises())))
        assert raised.value.__notes__ == [
            "releasing the source after it raised failed too: ValueError('close failed')"
        ]
