"""BackgroundLoader keeps each promise of its docstring; one class per promise."""

from __future__ import annotations

import enum
import gc
import importlib
import pathlib
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import prefetch
from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._threads import producers
from prefetch._threads.engine import Engine
from prefetch._threads.thread_side import ThreadSide

from .liveness import engine_of, wait_went_ahead
from .processes import prefetch_threads, wait_until
from .sources import Stateful
from .torch_features import needs_all_threads_profiler

pytestmark = pytest.mark.timeout(30)
TORCH_2_12_PROFILER_WARNING = "ignore:.*Profiler clears events at the end of each cycle:UserWarning"
"""A warning of torch 2.12's profiler that torch 2.13 no longer gives (see the profiler tests)."""


class Recorder:
    """An iterable that records which thread runs ``iter`` and ``next``."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.iter_threads: list[str] = []
        self.next_threads: set[str] = set()
        self.iter_calls = 0

    def __iter__(self) -> Iterator[Any]:
        self.iter_calls += 1
        self.iter_threads.append(threading.current_thread().name)
        return self._produce()

    def _produce(self) -> Iterator[Any]:
        for item in self.items:
            self.next_threads.add(threading.current_thread().name)
            yield item


class Gauge:
    """A source that counts the items it has produced."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.produced = 0

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.produced += 1
            yield i


class TestDelivery:
    """Items arrive complete and in order."""

    @pytest.mark.parametrize("depth", [1, 2, 5, 100])
    def test_every_item_in_order(self, depth: int) -> None:
        """Every item of the source arrives once, in order."""
        assert list(BackgroundLoader(range(1000), depth=depth)) == list(range(1000))

    def test_falsy_items_are_items(self) -> None:
        """None, 0, False, '' and empty containers are delivered, not taken as the end."""
        items = [None, 0, False, "", [], {}, None]
        assert list(BackgroundLoader(items)) == items

    def test_empty_source(self) -> None:
        """An empty source yields nothing and leaves no thread."""
        assert list(BackgroundLoader([])) == []

    def test_generator_source(self) -> None:
        """A generator is drained once; a second epoch is empty, and says why."""
        loader = BackgroundLoader(x * 2 for x in range(5))
        assert list(loader) == [0, 2, 4, 6, 8]
        with pytest.warns(UserWarning, match="consumed by an earlier epoch"):
            assert list(loader) == []

    def test_tensor_batches_from_dataloader(self) -> None:
        """DataLoader batches arrive equal to the unwrapped ones."""
        data = DataLoader(TensorDataset(torch.arange(40.0).view(20, 2)), batch_size=3)
        got = [batch[0] for batch in BackgroundLoader(data)]
        expected = [batch[0] for batch in data]
        assert len(got) == len(expected)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


class TestLifecycle:
    """Nothing runs before iter(); each iter() is a fresh epoch."""

    def test_nothing_runs_at_construction(self) -> None:
        """Construction neither iterates the source nor starts a thread."""
        source = Recorder([1, 2])
        BackgroundLoader(source)
        assert source.iter_calls == 0
        assert prefetch_threads() == []

    def test_iter_runs_on_the_caller_and_next_in_the_thread(self) -> None:
        """iter(loader) runs on the caller's thread; items are produced in a prefetch- thread."""
        source = Recorder([1, 2, 3])
        assert list(BackgroundLoader(source)) == [1, 2, 3]
        assert source.iter_threads == [threading.current_thread().name]
        assert len(source.next_threads) == 1
        (name,) = source.next_threads
        assert name.startswith("prefetch-")

    def test_thread_is_a_daemon(self) -> None:
        """The producer thread is a daemon, so it never holds the interpreter open."""
        it = iter(BackgroundLoader(range(10)))
        next(it)  # the epoch starts at its first next()
        (thread,) = prefetch_threads()
        assert thread.daemon
        it.close()

    def test_epochs_repeat(self) -> None:
        """A re-iterable source gives a full epoch on every iter()."""
        loader = BackgroundLoader(Recorder(list(range(7))))
        assert [list(loader) for _ in range(3)] == [list(range(7))] * 3

    def test_new_epoch_joins_an_abandoned_thread(self) -> None:
        """Starting an epoch stops and joins the thread of a dropped earlier iterator."""
        loader = BackgroundLoader(range(100), depth=2)
        first = iter(loader)
        next(first)
        (old_thread,) = prefetch_threads()
        first._finalizer.detach()  # as if the collector had not stopped it
        del first
        gc.collect()
        second = iter(loader)
        start = next(second)  # starting the new epoch joins the old thread
        assert not old_thread.is_alive()
        assert [start, *second] == list(range(100))

    def test_open_iterators_stand_on_their_own(self) -> None:
        """A new iter() leaves an open iterator of a re-iterable loader running."""
        loader = BackgroundLoader(range(100), depth=2)
        first = iter(loader)
        assert next(first) == 0
        second = iter(loader)
        assert list(second) == list(range(100))
        assert list(first) == list(range(1, 100))

    def test_persistent_workers_across_broken_epochs(self) -> None:
        """persistent_workers=True survives epochs that are broken off early."""
        data = DataLoader(range(32), batch_size=2, num_workers=2, persistent_workers=True)
        loader = BackgroundLoader(data, depth=4)
        for _ in range(3):
            for i, _batch in enumerate(loader):
                if i == 2:
                    break
        assert [b.tolist() for b in loader] == [b.tolist() for b in data]
        loader.close()
        del data, loader
        gc.collect()


class TestDepth:
    """At most ``depth`` items are produced and not yet consumed."""

    @pytest.mark.parametrize("depth", [1, 2, 3, 8])
    def test_depth_is_exact(self, depth: int) -> None:
        """The source never runs more than depth items past what was received, and gets there."""
        source = Gauge(50)
        ahead: list[int] = []
        iterator = iter(BackgroundLoader(source, depth=depth))
        for received, _item in enumerate(iterator, start=1):
            wait_went_ahead(engine_of(iterator))  # the producer ran as far ahead as it may
            ahead.append(source.produced - received)
        assert max(ahead) == depth
        assert min(ahead) >= 0

    @pytest.mark.parametrize("depth", [1, 2, 4])
    def test_engine_never_exceeds_depth(self, depth: int) -> None:
        """The engine's count of items drawn and not consumed never exceeds depth."""
        seen: list[int] = []
        original = ThreadSide.post

        def spy(self: ThreadSide, *args: Any, **kwargs: Any) -> int:
            seen.append(self.shared.snapshot().in_flight)
            return original(self, *args, **kwargs)

        ThreadSide.post = spy  # type: ignore[method-assign]
        try:
            iterator = iter(BackgroundLoader(range(200), depth=depth))
            for _ in iterator:
                wait_went_ahead(engine_of(iterator))  # the producer went as far as it may
        finally:
            ThreadSide.post = original  # type: ignore[method-assign]
        assert max(seen) == depth

    @pytest.mark.parametrize("depth", [2.0, None, True])
    def test_depth_not_an_int(self, depth: object) -> None:
        """A depth that is neither 'auto' nor an int is a TypeError naming the argument."""
        with pytest.raises(TypeError, match=r"depth=.*expects 'auto' or an int >= 1, got"):
            BackgroundLoader([], depth=depth)  # type: ignore[arg-type]

    @pytest.mark.parametrize("depth", ["2", "Auto", ""])
    def test_depth_other_string(self, depth: str) -> None:
        """A string other than 'auto' is a ValueError quoting the value."""
        with pytest.raises(ValueError, match=rf"depth=.*got {depth!r}"):
            BackgroundLoader([], depth=depth)  # type: ignore[arg-type]

    def test_loader_not_iterable(self) -> None:
        """A non-iterable loader is a TypeError at construction."""
        with pytest.raises(TypeError, match=r"loader=.*expects an iterable, got int"):
            BackgroundLoader(42)  # type: ignore[arg-type]

    def test_loader_a_class(self) -> None:
        """The class instead of an instance (it has ``__iter__`` as an attribute) is refused at
        construction too, saying so; an iterable class (an ``Enum``) is still taken."""
        with pytest.raises(TypeError, match=r"loader=.*got the class DataLoader itself"):
            BackgroundLoader(DataLoader)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^CudaPrefetcher\(loader=.*got the class list"):
            CudaPrefetcher(list, device="cpu")  # type: ignore[arg-type]
        assert list(BackgroundLoader(Color)) == [Color.RED, Color.BLUE]


class Color(enum.Enum):
    """A class that is iterable: its metaclass has ``__iter__``."""

    RED = 1
    BLUE = 2


class Boom(Exception):
    """A source error."""


def failing(n: int, error: BaseException) -> Iterator[int]:
    """Yield ``range(n)``, then raise ``error``."""
    yield from range(n)
    raise error


class TestErrors:
    """Source errors arrive as the same object, after the items before them."""

    @pytest.mark.parametrize("error", [Boom("x"), KeyboardInterrupt("k"), SystemExit(3)])
    @pytest.mark.parametrize("depth", [1, 4])
    def test_same_object_after_every_item(self, error: BaseException, depth: int) -> None:
        """The error object is re-raised after every earlier item, BaseException too."""
        got: list[int] = []
        with pytest.raises(type(error)) as caught:
            for item in BackgroundLoader(failing(5, error), depth=depth):
                got.append(item)
        assert caught.value is error
        assert got == [0, 1, 2, 3, 4]

    def test_epoch_is_over_after_an_error(self) -> None:
        """After the error, the iterator is exhausted."""
        it = iter(BackgroundLoader(failing(1, Boom())))
        assert next(it) == 0
        with pytest.raises(Boom):
            next(it)
        with pytest.raises(StopIteration):
            next(it)

    def test_iter_error_raises_on_the_caller(self) -> None:
        """An error in iter(source) is raised by the first next(), on the caller, with no thread."""

        class BadIter:
            def __iter__(self) -> Iterator[int]:
                raise Boom("iter")

        it = iter(BackgroundLoader(BadIter()))
        with pytest.raises(Boom):
            next(it)
        assert prefetch_threads() == []
        with pytest.raises(StopIteration):
            next(it)

    def test_worker_error_does_not_keep_workers_alive(self) -> None:
        """After a worker error leaves the loop, the workers end while the error is held."""

        class Bad(torch.utils.data.Dataset[int]):
            def __len__(self) -> int:
                return 20

            def __getitem__(self, i: int) -> int:
                if i == 9:
                    raise ValueError("bad item 9")
                return i

        data = DataLoader(Bad(), batch_size=1, num_workers=2)
        loader = BackgroundLoader(data, depth=2)
        with pytest.raises(ValueError, match="bad item 9") as caught:
            for _ in loader:
                pass
        held = caught.value
        assert wait_until(lambda: not torch.multiprocessing.active_children(), 5, collect=False)
        assert held.__traceback__ is not None  # the error and its frames were held meanwhile

    @pytest.mark.parametrize("threads", [None, 2])
    def test_dead_thread_raises_runtime_error(
        self, monkeypatch: pytest.MonkeyPatch, threads: int | None
    ) -> None:
        """If the threads die without a message, next() raises RuntimeError promptly,
        naming each of them."""
        monkeypatch.setattr(Engine, "_work", lambda self, held: self._leave(None, held))
        it = iter(BackgroundLoader(DataLoader(range(3)), fetch_threads=threads))
        names = ", ".join(repr(thread.name) for thread in engine_of(it).threads)
        assert names.count("'prefetch-") == (threads or 1)
        started = time.monotonic()
        with pytest.raises(RuntimeError) as raised:
            next(it)
        assert str(raised.value) == (
            f"prefetch thread(s) {names} exited without delivering an item, an error or "
            "the end of the data"
        )
        assert time.monotonic() - started < 2


class Stuck:
    """A source whose second ``next()`` blocks until released; ``entered`` says it is there."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __iter__(self) -> Iterator[int]:
        try:
            yield 0
            self.entered.set()
            self.release.wait(20)
            yield 1
        finally:
            self.finished.set()


class TestShutdown:
    """break, close(), with and garbage collection stop the thread."""

    def wait_no_threads(self, seconds: float = 2.0) -> bool:
        return wait_until(lambda: not prefetch_threads(), seconds, collect=False)

    def test_break_stops_the_thread(self) -> None:
        """An early break stops the thread within two seconds."""
        for i in BackgroundLoader(range(10_000), depth=4):
            if i == 3:
                break
        assert self.wait_no_threads()

    def test_close_stops_the_thread(self) -> None:
        """close() on the loader ends the current epoch's thread before it returns."""
        loader = BackgroundLoader(range(10_000))
        it = iter(loader)
        next(it)
        loader.close()
        assert prefetch_threads() == []
        with pytest.raises(StopIteration):
            next(it)

    def test_with_block_stops_the_thread(self) -> None:
        """Leaving a with block ends the thread, also on an exception."""
        with pytest.raises(Boom), BackgroundLoader(range(10_000)) as loader:
            for i in loader:
                if i == 2:
                    raise Boom
        assert prefetch_threads() == []

    def test_garbage_collection_stops_the_thread(self) -> None:
        """Dropping an abandoned iterator stops its thread and releases the source."""
        source = Stuck()
        source.release.set()
        it = iter(BackgroundLoader(source))
        assert next(it) == 0
        del it
        gc.collect()
        assert self.wait_no_threads()
        assert source.finished.wait(2)

    def test_close_returns_while_source_is_stuck(self) -> None:
        """close() returns promptly even when the thread is blocked inside the source."""
        source = Stuck()
        it = iter(BackgroundLoader(source, depth=2))
        assert next(it) == 0
        assert source.entered.wait(10), "the producer never asked the source for item 1"
        started = time.monotonic()
        it.close()
        assert time.monotonic() - started < 1.0
        source.release.set()  # the source returns; the thread then exits by itself
        assert self.wait_no_threads()
        assert source.finished.wait(2)

    def test_source_released_on_break(self) -> None:
        """A generator created by iter(source) is closed when the epoch stops early."""
        source = Stuck()
        source.release.set()
        loader = BackgroundLoader(source)
        for _ in loader:
            break
        loader.close()
        assert source.finished.wait(2)

    def test_workers_gone_after_break_and_close(self) -> None:
        """A multi-worker DataLoader's processes are gone after break + close, every epoch."""
        data = DataLoader(range(64), batch_size=2, num_workers=2)
        loader = BackgroundLoader(data, depth=3)
        for _ in range(3):
            for i, _batch in enumerate(loader):
                if i == 1:
                    break
            loader.close()
            assert torch.multiprocessing.active_children() == []


EXIT_SCRIPT = """
import time
from prefetch import BackgroundLoader, CudaPrefetcher

class Source:
    def __iter__(self):
        try:
            yield from range(1000)
        finally:
            print("released", flush=True)

iterator = iter(BackgroundLoader(Source(), depth=2))
next(iterator)
deadline = time.monotonic() + 30
while not iterator._engine.snapshot().waiting_threads:  # until the producer waits for space
    assert time.monotonic() < deadline, "the producer never filled the buffer"
    time.sleep(0.002)
print("exiting", flush=True)  # the iterator is never closed
"""


class TestInterpreterExit:
    """At exit, live producers are stopped and release their sources, within a bound."""

    @pytest.mark.timeout(60)
    def test_abandoned_producer_releases_its_source_at_exit(self) -> None:
        """A process with an open epoch exits promptly, and the source's finally block runs."""
        import subprocess
        import sys

        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=50
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["exiting", "released"]
        assert time.monotonic() - started < 45


class TestPassThrough:
    """len, set_epoch and attributes reach the wrapped loader."""

    def test_len(self) -> None:
        """len() is the wrapped loader's len."""
        assert len(BackgroundLoader(range(17))) == 17
        data = DataLoader(range(10), batch_size=3)
        assert len(BackgroundLoader(data)) == 4

    def test_len_of_unsized_source(self) -> None:
        """len() of an unsized source is a TypeError naming the source type."""
        with pytest.raises(TypeError, match="generator"):
            len(BackgroundLoader(x for x in range(3)))

    def test_set_epoch_reaches_distributed_sampler(self) -> None:
        """set_epoch reshuffles a DistributedSampler behind the wrapper."""
        dataset = range(64)
        sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=1)
        loader = BackgroundLoader(DataLoader(dataset, sampler=sampler, batch_size=64))
        loader.set_epoch(0)
        first = next(iter(loader)).tolist()
        loader.set_epoch(1)
        second = next(iter(loader)).tolist()
        loader.close()
        assert sorted(first) != first or sorted(second) != second
        assert first != second
        assert sampler.epoch == 1

    def test_set_epoch_order_of_targets(self) -> None:
        """set_epoch goes to the loader's own method, else its sampler(s) and dataset."""

        class Target:
            epoch = -1

            def set_epoch(self, epoch: int) -> None:
                self.epoch = epoch

        class BatchSampler:
            sampler = Target()

        class Loader:
            sampler = None
            batch_sampler = BatchSampler()
            dataset = Target()

            def __iter__(self) -> Iterator[int]:
                return iter([])

        loader = Loader()
        BackgroundLoader(loader).set_epoch(5)
        assert loader.batch_sampler.sampler.epoch == 5
        assert loader.dataset.epoch == 5

        class Own(Loader):
            def set_epoch(self, epoch: int) -> None:
                self.own = epoch

        own = Own()
        BackgroundLoader(own).set_epoch(7)
        assert own.own == 7
        assert own.dataset.epoch == 5  # not reached: the loader handles it

    def test_set_epoch_rejects_non_int(self) -> None:
        """set_epoch with a non-int is a TypeError naming the value."""
        with pytest.raises(TypeError, match=r"got '1'"):
            BackgroundLoader([]).set_epoch("1")  # type: ignore[arg-type]

    def test_attributes_read_through(self) -> None:
        """dataset, sampler and batch_size come from the wrapped DataLoader."""
        data = DataLoader(range(10), batch_size=5)
        loader = BackgroundLoader(data)
        assert loader.dataset is data.dataset
        assert loader.sampler is data.sampler
        assert loader.batch_size == 5
        with pytest.raises(AttributeError, match="neither has the wrapped"):
            _ = loader.no_such_attribute


class TestPinMemory:
    """pin_memory=True pins in the thread; without an accelerator it warns once."""

    def test_warns_without_accelerator(self) -> None:
        """Without an accelerator pin_memory warns once and passes items through."""
        if torch.accelerator.is_available():
            pytest.skip("needs a machine without an accelerator")
        batch = {"x": torch.ones(2)}
        with pytest.warns(UserWarning, match="no accelerator"):
            loader = BackgroundLoader([batch, batch], pin_memory=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = list(loader) + list(loader)
        assert all(item is batch for item in got)
        assert loader.settings.pin_memory is False

    def test_pins_nested_batches_in_the_thread(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every nested tensor leaf goes through pinning, inside the producer thread."""
        from prefetch._shared import pinning as pinning
        from prefetch._threads import fetch_options
        from prefetch._threads import loader as background

        calls: list[tuple[str, int]] = []
        selected: list[tuple[str, int | None]] = []

        def fake_pin(tensor: torch.Tensor) -> torch.Tensor:
            calls.append((threading.current_thread().name, int(tensor.sum())))
            return tensor + 100

        monkeypatch.setattr(pinning, "_pin_tensor", fake_pin)
        monkeypatch.setattr(pinning, "accelerator_available", lambda: True)
        monkeypatch.setattr(background, "current_device_index", lambda: 3)
        monkeypatch.setattr(
            fetch_options,
            "select_device",
            lambda index: selected.append((threading.current_thread().name, index)),
        )
        batch = {"a": [torch.tensor(1), (torch.tensor(2),)], "b": "label"}
        (out,) = list(BackgroundLoader([batch], pin_memory=True))
        assert out["a"][0].item() == 101 and out["a"][1][0].item() == 102 and out["b"] == "label"
        assert sorted(value for _, value in calls) == [1, 2]
        assert all(name.startswith("prefetch-") for name, _ in calls)
        assert len(selected) == 1
        assert selected[0][0].startswith("prefetch-") and selected[0][1] == 3

    def test_a_pinning_error_arrives_in_its_place(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Pinning that raises for one item: the loop gets that error where the item was,
        then the items after it (an Exception does not end the epoch)."""
        from prefetch._shared import pinning as pinning
        from prefetch._threads import fetch_options
        from prefetch._threads import loader as background

        error = ValueError("cannot pin item 1")

        def fake_pin(tensor: torch.Tensor) -> torch.Tensor:
            if int(tensor) == 1:
                raise error
            return tensor + 100

        monkeypatch.setattr(pinning, "_pin_tensor", fake_pin)
        monkeypatch.setattr(pinning, "accelerator_available", lambda: True)
        monkeypatch.setattr(background, "current_device_index", lambda: 0)
        monkeypatch.setattr(fetch_options, "select_device", lambda index: None)
        iterator = iter(BackgroundLoader([torch.tensor(i) for i in range(3)], pin_memory=True))
        assert int(next(iterator)) == 100
        with pytest.raises(ValueError) as raised:
            next(iterator)
        assert raised.value is error
        assert [int(item) for item in iterator] == [102]

    @pytest.mark.parametrize("threads", [None, 2])
    def test_pins_a_dataloaders_collated_batches(
        self, monkeypatch: pytest.MonkeyPatch, threads: int | None
    ) -> None:
        """A DataLoader's batches, read by the loader's threads, are pinned once collated."""
        from prefetch._shared import pinning as pinning
        from prefetch._threads import fetch_options
        from prefetch._threads import loader as background

        pinned: list[tuple[str, list[int]]] = []

        def fake_pin(tensor: torch.Tensor) -> torch.Tensor:
            pinned.append((threading.current_thread().name, tensor.tolist()))
            return tensor + 100

        monkeypatch.setattr(pinning, "_pin_tensor", fake_pin)
        monkeypatch.setattr(pinning, "accelerator_available", lambda: True)
        monkeypatch.setattr(background, "current_device_index", lambda: 0)
        monkeypatch.setattr(fetch_options, "select_device", lambda index: None)
        data = DataLoader(range(6), batch_size=2)
        loader = BackgroundLoader(data, pin_memory=True, fetch_threads=threads)
        assert [batch.tolist() for batch in loader] == [[100, 101], [102, 103], [104, 105]]
        assert sorted(values for _, values in pinned) == [[0, 1], [2, 3], [4, 5]]
        assert all(name.startswith("prefetch-") for name, _ in pinned)

    def test_a_pinning_dataloader_pins_its_batches_read_by_threads(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``DataLoader(pin_memory=True)`` read by ``fetch_threads``: each collated batch is
        pinned as the DataLoader's own iterator pins it, for its pin device."""
        from prefetch._threads import parallel_fetch

        pinned: list[tuple[str, list[int], Any]] = []

        def fake_pin(batch: torch.Tensor, device: Any) -> torch.Tensor:
            pinned.append((threading.current_thread().name, batch.tolist(), device))
            return batch + 100

        # Without an accelerator torch's iterator turns pin_memory off: say it is on.
        monkeypatch.setattr(parallel_fetch, "pin_settings", lambda iterator: (True, "fake:0"))
        monkeypatch.setattr(parallel_fetch, "pin", fake_pin)
        loader = BackgroundLoader(DataLoader(range(6), batch_size=2), fetch_threads=2)
        assert [batch.tolist() for batch in loader] == [[100, 101], [102, 103], [104, 105]]
        assert sorted(values for _, values, _ in pinned) == [[0, 1], [2, 3], [4, 5]]
        assert {device for _, _, device in pinned} == {"fake:0"}
        assert all(name.startswith("prefetch-") for name, _, _ in pinned)


class TestCheckpoint:
    """state_dict resumes right after the last item the consumer received."""

    @pytest.mark.parametrize("depth", [1, 3, 8])
    @pytest.mark.parametrize("stop_after", [0, 1, 5, 19, 20])
    def test_resume_is_exact(self, depth: int, stop_after: int) -> None:
        """Items consumed before the checkpoint plus items after resume form the epoch."""
        source = Stateful(20)
        loader = BackgroundLoader(source, depth=depth)
        consumed: list[int] = []
        it = iter(loader)
        for _ in range(stop_after):
            consumed.append(next(it))
        wait_went_ahead(engine_of(it))  # the thread ran ahead as far as it may
        state = loader.state_dict()
        loader.close()
        fresh = BackgroundLoader(Stateful(20), depth=depth)
        fresh.load_state_dict(state)
        assert consumed + list(fresh) == list(range(20))

    @pytest.mark.parametrize("stop_after", range(1, 9))
    def test_resume_is_exact_inside_a_run(
        self, monkeypatch: pytest.MonkeyPatch, stop_after: int
    ) -> None:
        """Each item of a run moves the state, those the iterator hands over between two
        exchanges (its fast path) too: a checkpoint after any of them resumes right after it.

        Started before the first ``next()``, the thread posts its 8 draws as runs of 1 and 7
        items (it posts once before it knows the source's rate; ``POST_AFTER`` raised keeps
        the rest together, however slow the machine).
        """
        monkeypatch.setattr(producers, "POST_AFTER", 1e3)
        loader = BackgroundLoader(Stateful(20), depth=8)
        it = iter(loader)
        it.start()
        wait_went_ahead(engine_of(it))
        consumed = [next(it) for _ in range(stop_after)]
        state = loader.state_dict()
        loader.close()
        fresh = BackgroundLoader(Stateful(20), depth=8)
        fresh.load_state_dict(state)
        assert consumed + list(fresh) == list(range(20))

    def test_state_dict_needs_a_stateful_loader(self) -> None:
        """state_dict on a loader without one is a TypeError naming the loader type."""
        with pytest.raises(TypeError, match="got range"):
            BackgroundLoader(range(3)).state_dict()

    def test_state_dict_is_read_in_the_thread(self) -> None:
        """The state is read in the producer thread right after each item."""
        threads: set[str] = set()

        class Spy(Stateful):
            def state_dict(self) -> dict[str, int]:
                threads.add(threading.current_thread().name)
                return super().state_dict()

        list(BackgroundLoader(Spy(3)))
        assert any(name.startswith("prefetch-") for name in threads)


class TestStats:
    """stats counts items, waiting and time in the source."""

    def test_counts_and_wait(self) -> None:
        """A slow source shows up as waiting; items are counted."""

        def slow() -> Iterator[int]:
            for i in range(5):
                time.sleep(0.02)
                yield i

        loader = BackgroundLoader(slow())
        assert list(loader) == list(range(5))
        stats = loader.stats
        assert stats.items == 5
        assert stats.source_seconds >= 0.09
        assert stats.wait_seconds > 0.05  # the loop took no time: it waited for ~0.1 s of reads
        # elapsed ends at the last item; the wait for the end of the data after it is
        # end_wait_seconds, so the waits counted are within the epoch's time
        assert 0 < stats.wait_fraction <= 1 and stats.wait_seconds <= stats.elapsed_seconds
        assert "waited" in stats.summary() and "5 items" in stats.summary()

    def test_fast_source_barely_waits(self) -> None:
        """With a fast source and a slow consumer, the wait share is small."""
        loader = BackgroundLoader(range(10), depth=4)
        for _ in loader:
            time.sleep(0.01)
        assert loader.stats.wait_fraction < 0.5

    # torch 2.12 (the newest torch for free-threaded 3.13t, make test-ft) warns "Profiler
    # clears events at the end of each cycle" on every profile's first start without
    # acc_events: its prepare_trace creates the profiler, then tests `profiler is not None`.
    # torch 2.13 tests before creating it, so it warns only when a profile restarts. Once per
    # process (warn-once): the first profiler test that runs fails under filterwarnings=error,
    # with or without the GIL. Nothing of prefetch's is involved.
    @pytest.mark.filterwarnings(TORCH_2_12_PROFILER_WARNING)
    @needs_all_threads_profiler
    def test_fetch_is_a_profiler_range(self) -> None:
        """Each fetch is a 'prefetch.fetch' range when the profiler traces all threads."""
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile

        config = _ExperimentalConfig(profile_all_threads=True)
        with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
            list(BackgroundLoader(range(3)))
        names = [event.name for event in prof.events()]
        assert names.count("prefetch.fetch") >= 3

    @pytest.mark.filterwarnings(TORCH_2_12_PROFILER_WARNING)  # as above
    def test_wait_is_a_profiler_range_on_the_loop_thread(self) -> None:
        """A stall shows as 'prefetch.wait' on the training loop's own thread."""
        from torch.profiler import ProfilerActivity, profile

        def slow() -> Iterator[int]:
            for i in range(3):
                time.sleep(0.01)
                yield i

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            list(BackgroundLoader(slow()))
        assert [event.name for event in prof.events()].count("prefetch.wait") >= 3


def test_public_api_is_explicit() -> None:
    """The package exports exactly the documented names; internal modules export none."""
    assert set(prefetch.__all__) == {
        "BackgroundIterator",
        "BackgroundLoader",
        "BackgroundSettings",
        "CudaPrefetcher",
        "DepthEvent",
        "DeviceIterator",
        "FetchInfo",
        "LoaderFacts",
        "LoaderStats",
        "LoaderTimeoutError",
        "Normalize",
        "NotStatefulError",
        "Stateful",
        "ThreadEvent",
        "TorchWorkaroundWarning",
        "TotalStats",
        "fetch_info",
        "return_freed_memory",
        "sample_seed",
    }
    for name in prefetch.__all__:
        assert getattr(prefetch, name).__module__.startswith("prefetch._")
    assert isinstance(prefetch.__version__, str)
    root = pathlib.Path(prefetch.__file__).parent
    internal = sorted(root.glob("_[a-z]*/*.py"))
    assert internal, "no internal modules found"
    for path in internal:
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(f"prefetch.{name}")
        assert not hasattr(module, "__all__"), f"{path} declares __all__"
    assert not sorted(root.glob("_[a-z]*.py")), (
        "internal modules live in _torch, _shared, _threads, _device"
    )


class TestReleaseErrors:
    """An error while releasing the source is never silently dropped."""

    @pytest.mark.timeout(30)
    def test_release_error_after_a_stop_is_reported(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A source whose cleanup raises after close() reaches threading.excepthook."""
        reported: list[BaseException | None] = []
        monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))
        cleanup_error = Boom("cleanup failed")

        class Source:
            def __iter__(self) -> Iterator[int]:
                try:
                    yield from range(100)
                finally:
                    raise cleanup_error

        loader = BackgroundLoader(Source(), depth=2)
        for _ in loader:
            break
        loader.close()
        assert reported == [cleanup_error]

    def test_release_error_at_the_end_reaches_the_loop(self) -> None:
        """A cleanup error when the source ends is raised to the loop, after every item."""
        cleanup_error = Boom("cleanup failed")

        class Source:
            def __iter__(self) -> Iterator[int]:
                yield 1

        def closing_error(source: Iterator[int], owned: bool) -> None:
            raise cleanup_error

        from prefetch._threads import tasks as _tasks

        got: list[int] = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_tasks, "release_source", closing_error)
            with pytest.raises(Boom) as caught:
                for item in BackgroundLoader(Source()):
                    got.append(item)
        assert caught.value is cleanup_error and got == [1]
