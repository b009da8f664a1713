"""Iteration semantics of the wrappers (issue 11): several iterators, errors, ends, one-shots.

Every stack must give the loop what the unwrapped loader gives it.
"""

from __future__ import annotations

import gc
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader, CudaPrefetcher

from .liveness import engine_of, wait_went_ahead
from .processes import prefetch_threads, wait_until
from .sources import OneShot

STACKS: dict[str, Callable[[Any], Any]] = {
    "background": lambda loader: BackgroundLoader(loader, depth=2),
    "background-auto": lambda loader: BackgroundLoader(loader),
    "cuda(background)": lambda loader: CudaPrefetcher(BackgroundLoader(loader), device="cpu"),
    "cuda": lambda loader: CudaPrefetcher(loader, device="cpu", depth=2),
    "background(background)": lambda loader: BackgroundLoader(BackgroundLoader(loader)),
}


def as_lists(batches: Iterable[Any]) -> list[Any]:
    """Turn tensor batches into lists, for comparison."""
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in batches]


class Faulty(Dataset[int]):
    """Ten items; reading item 2 or 3 raises ``ValueError``."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index in (2, 3):
            msg = f"bad item {index}"
            raise ValueError(msg)
        return index


def skip_failures(iterable: Iterable[Any]) -> list[Any]:
    """Loop as a training loop that skips bad batches does; record batches and errors."""
    seen: list[Any] = []
    iterator = iter(iterable)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return seen
        except ValueError as error:  # a worker's error carries its traceback in its text
            seen.append(("error", str(error).strip().splitlines()[-1].removeprefix("ValueError: ")))
            continue
        seen.append(batch.tolist() if isinstance(batch, torch.Tensor) else batch)


class TestSeveralIterators:
    """Each iter() stands on its own where the wrapped loader allows it."""

    @pytest.mark.parametrize("stack", STACKS)
    def test_zip_of_a_list(self, stack: str) -> None:
        """zip(L, L) over a list gives every pair, as zip(list, list) does."""
        data = list(range(6))
        loader = STACKS[stack](data)
        assert list(zip(loader, loader, strict=True)) == list(zip(data, data, strict=True))

    @pytest.mark.parametrize("stack", STACKS)
    def test_zip_of_a_dataloader(self, stack: str) -> None:
        """zip(L, L) over a DataLoader gives what zip(dl, dl) gives."""
        data = DataLoader(range(10), batch_size=3)
        loader = STACKS[stack](data)
        got = [(a.tolist(), b.tolist()) for a, b in zip(loader, loader, strict=True)]
        assert got == [(a.tolist(), b.tolist()) for a, b in zip(data, data, strict=True)]

    @pytest.mark.parametrize("stack", STACKS)
    def test_nested_loops(self, stack: str) -> None:
        """A nested loop over the same loader runs the outer loop to its end."""
        data = list(range(4))
        loader = STACKS[stack](data)
        got = [(i, j) for i in loader for j in loader]
        assert got == [(i, j) for i in data for j in data]

    @pytest.mark.parametrize("stack", STACKS)
    def test_one_shot_source_older_iterator_says_why(self, stack: str) -> None:
        """Over a one-shot iterator, a new iter() makes the older raise RuntimeError once."""
        loader = STACKS[stack](iter(range(10)))
        first = iter(loader)
        assert next(first) == 0
        second = iter(loader)
        assert next(first) == 1  # an idle iter() changes nothing
        head = next(second)  # the newer epoch starts: the older one is stopped
        with pytest.raises(RuntimeError, match="one-shot range_iterator"):
            next(first)
        with pytest.raises(StopIteration):
            next(first)
        rest = [head, *second]
        assert rest == sorted(rest) and set(rest) <= set(range(1, 10)) and rest[-1] == 9

    @pytest.mark.parametrize("stack", STACKS)
    def test_one_shot_source_finished_iterator_just_ends(self, stack: str) -> None:
        """An older iterator that already reached the end is not told why: it just ends."""
        loader = STACKS[stack](iter(range(3)))
        first = iter(loader)
        assert list(first) == [0, 1, 2]
        second = iter(loader)
        with pytest.warns(UserWarning, match="consumed by an earlier epoch"):
            assert list(second) == []  # the newer epoch starts and stops the older one
        with pytest.raises(StopIteration):
            next(first)

    @pytest.mark.parametrize("stack", ["background", "cuda(background)", "cuda"])
    def test_persistent_workers_older_iterator_says_why(self, stack: str) -> None:
        """With persistent workers a new iter() makes the older raise RuntimeError."""
        data = DataLoader(range(8), batch_size=2, num_workers=2, persistent_workers=True)
        loader = STACKS[stack](data)
        try:
            first = iter(loader)
            assert next(first).tolist() == [0, 1]
            second = iter(loader)
            head = next(second)  # the newer epoch starts: the older one is stopped
            with pytest.raises(RuntimeError, match="persistent_workers=True"):
                next(first)
            assert [head.tolist(), *as_lists(second)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        finally:
            loader.close()
            data._iterator = None  # shut the persistent workers down
            del data, loader
            gc.collect()

    @pytest.mark.parametrize("stack", STACKS)
    def test_close_stops_every_open_iterator(self, stack: str) -> None:
        """close() ends every open iterator and leaves no thread."""
        loader = STACKS[stack](list(range(50)))
        first, second = iter(loader), iter(loader)
        assert next(first) == 0 and next(second) == 0
        loader.close()
        assert list(first) == [] and list(second) == []
        assert prefetch_threads() == []

    def test_stats_and_state_follow_the_latest_iterator(self) -> None:
        """stats and state_dict() describe the most recent iter()."""
        data = StatefulDataLoader(list(range(6)))
        loader = BackgroundLoader(data, depth=2)
        first = iter(loader)
        assert [next(first).item() for _ in range(3)] == [0, 1, 2]
        second = iter(loader)
        assert next(second).item() == 0
        assert loader.stats is second.stats and first.stats.items == 3
        resumed = StatefulDataLoader(list(range(6)))
        resumed.load_state_dict(loader.state_dict())
        assert [b.item() for b in resumed] == [1, 2, 3, 4, 5]
        first.close()
        second.close()

    @pytest.mark.parametrize("stack", ["background", "cuda(background)"])
    def test_load_state_dict_stops_every_open_iterator(self, stack: str) -> None:
        """load_state_dict() ends every open iterator, each saying why once: never silently."""
        loader = STACKS[stack](StatefulDataLoader(list(range(20))))
        first, second = iter(loader), iter(loader)
        next(first), next(second)
        state = loader.state_dict()
        loader.load_state_dict(state)
        for old in (first, second):
            with pytest.raises(RuntimeError, match=r"load_state_dict\(\) stopped this epoch"):
                next(old)
            assert list(old) == []
        assert [b.item() for b in loader] == list(range(1, 20))


class TestErrorsDoNotEndTheEpoch:
    """After a batch raises an Exception, the epoch goes on as far as the source does."""

    EXPECTED = [[0, 1], ("error", "bad item 2"), [4, 5], [6, 7], [8, 9]]

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_unwrapped_reference(self, num_workers: int) -> None:
        """The unwrapped DataLoader gives the sequence the wrappers must reproduce."""
        data = DataLoader(Faulty(), batch_size=2, num_workers=num_workers)
        assert skip_failures(data) == self.EXPECTED

    @pytest.mark.parametrize("num_workers", [0, 2])
    @pytest.mark.parametrize("stack", ["background", "cuda(background)", "cuda"])
    def test_skipping_failing_batches(self, stack: str, num_workers: int) -> None:
        """A loop that skips a failing batch sees what it sees without the wrapper."""
        data = DataLoader(Faulty(), batch_size=2, num_workers=num_workers)
        assert skip_failures(STACKS[stack](data)) == self.EXPECTED

    @pytest.mark.parametrize("stack", STACKS)
    def test_same_object_and_the_generator_ends(self, stack: str) -> None:
        """The source's error object arrives at its place; a generator that raised is done."""
        error = ValueError("boom")

        def source() -> Iterator[int]:
            yield from range(3)
            raise error

        iterator = iter(STACKS[stack](source()))
        assert [next(iterator) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError, match="boom") as caught:
            next(iterator)
        assert caught.value is error
        with pytest.raises(StopIteration):
            next(iterator)

    @pytest.mark.parametrize("stack", STACKS)
    def test_an_iterator_that_goes_on(self, stack: str) -> None:
        """A source iterator that raises and then continues is followed to its end."""

        class Flaky:
            def __iter__(self) -> Iterator[int]:
                return FlakyIterator()

        class FlakyIterator:
            def __init__(self) -> None:
                self.index = -1

            def __iter__(self) -> FlakyIterator:
                return self

            def __next__(self) -> int:
                self.index += 1
                if self.index >= 6:
                    raise StopIteration
                if self.index % 2:
                    raise KeyError(self.index)
                return self.index

        seen: list[Any] = []
        iterator = iter(STACKS[stack](Flaky()))
        while True:
            try:
                seen.append(next(iterator))
            except KeyError as error:
                seen.append(error.args[0])
            except StopIteration:
                break
        assert seen == [0, 1, 2, 3, 4, 5]

    @pytest.mark.parametrize("error", [KeyboardInterrupt("k"), SystemExit(3)])
    @pytest.mark.parametrize("stack", ["background", "cuda(background)"])
    def test_base_exceptions_end_the_epoch(self, stack: str, error: BaseException) -> None:
        """A KeyboardInterrupt or SystemExit from the source ends the epoch."""

        class Endless:
            def __iter__(self) -> Iterator[int]:
                return self.run()

            def run(self) -> Iterator[int]:
                yield 0
                raise error

        iterator = iter(STACKS[stack](Endless()))
        assert next(iterator) == 0
        with pytest.raises(type(error)) as caught:
            next(iterator)
        assert caught.value is error
        with pytest.raises(StopIteration):
            next(iterator)

    @pytest.mark.parametrize("stack", ["background", "cuda(background)", "cuda"])
    def test_workers_end_while_the_error_is_held(self, stack: str) -> None:
        """After an uncaught error leaves the loop, the workers end; the error stays held."""
        data = DataLoader(Faulty(), batch_size=2, num_workers=2)
        loader = STACKS[stack](data)
        with pytest.raises(ValueError, match="bad item 2") as caught:
            for _ in loader:
                pass
        held = caught.value
        assert wait_until(lambda: not torch.multiprocessing.active_children(), 10, collect=False)
        assert held.__traceback__ is not None


class TestCheckpointAtTheEnd:
    """A state taken after the end resumes into the next full epoch, as unwrapped."""

    @staticmethod
    def make(num_workers: int = 0) -> StatefulDataLoader:
        return StatefulDataLoader(list(range(6)), batch_size=2, num_workers=num_workers)

    def resume(self, state: Any) -> list[list[int]]:
        fresh = self.make()
        fresh.load_state_dict(state)
        return as_lists(fresh)

    def test_unwrapped_reference(self) -> None:
        """Unwrapped: after the last batch an empty epoch; after StopIteration a full one."""
        data = self.make()
        iterator = iter(data)
        for _ in range(3):
            next(iterator)
        assert self.resume(data.state_dict()) == []
        with pytest.raises(StopIteration):
            next(iterator)
        assert self.resume(data.state_dict()) == [[0, 1], [2, 3], [4, 5]]

    @pytest.mark.parametrize("num_workers", [0, 2])
    @pytest.mark.parametrize("stack", STACKS)
    def test_after_a_finished_epoch(self, stack: str, num_workers: int) -> None:
        """After list(wrapper), its state resumes a new loader into a full epoch."""
        wrapper = STACKS[stack](self.make(num_workers))
        assert as_lists(wrapper) == [[0, 1], [2, 3], [4, 5]]
        state = wrapper.state_dict()
        resumed = STACKS[stack](self.make(num_workers))
        resumed.load_state_dict(state)
        assert as_lists(resumed) == [[0, 1], [2, 3], [4, 5]]

    @pytest.mark.parametrize("stack", STACKS)
    def test_after_the_last_batch_as_unwrapped(self, stack: str) -> None:
        """After the last batch and before StopIteration, the state is what unwrapped gives."""
        wrapper = STACKS[stack](self.make())
        iterator = iter(wrapper)
        for _ in range(3):
            next(iterator)
        assert self.resume(wrapper.state_dict()) == []
        with pytest.raises(StopIteration):
            next(iterator)
        assert self.resume(wrapper.state_dict()) == [[0, 1], [2, 3], [4, 5]]


class TestOneShotSources:
    """A later epoch over a used-up iterator or generator warns once."""

    @pytest.mark.parametrize("stack", STACKS)
    def test_warns_once(self, stack: str) -> None:
        """The second epoch warns that an earlier epoch consumed the source; the third does not."""
        loader = STACKS[stack](x for x in range(3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(loader) == [0, 1, 2]
        with pytest.warns(UserWarning, match="consumed by an earlier epoch") as record:
            assert list(loader) == []
        assert len(record) == 1
        assert record[0].filename == __file__
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(loader) == []

    @pytest.mark.parametrize("stack", STACKS)
    def test_an_epoch_cut_short_loses_nothing(self, stack: str) -> None:
        """After a break the next epoch starts with the first item the loop did not take."""
        loader = STACKS[stack](iter(range(100)))
        for item in loader:
            if item == 1:
                break
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and no warning: the source is not used up
            assert list(loader) == list(range(2, 100))

    def test_carried_items_a_closed_epoch_never_drew_are_kept(self) -> None:
        """Epoch 1 reads 8 ahead; epoch 2, at depth 1 (as an adaptive depth may start),
        is closed after one item, its thread having drawn only some of the 8: the rest
        start epoch 3, in order (they were lost: 3.13t lost one in ~8,000 runs this way)."""
        loader = BackgroundLoader(iter(range(40)), depth=8)
        first = iter(loader)
        assert next(first) == 0
        wait_went_ahead(engine_of(first))
        first.close()
        loader._depth.value = 1  # the next epoch's depth, set as a policy would
        second = iter(loader)
        assert next(second) == 1
        second.close()
        loader._depth.value = 8
        assert list(loader) == list(range(2, 40))

    def test_an_end_carried_and_drawn_still_warns_the_next_epoch(self) -> None:
        """Epoch 1 read to the end and was closed; epoch 2 hands the rest and that end;
        epoch 3 is empty and says why, as after any used-up one-shot source."""
        loader = BackgroundLoader(iter(range(3)), depth=8)
        first = iter(loader)
        assert next(first) == 0
        wait_went_ahead(engine_of(first))
        first.close()
        assert list(loader) == [1, 2]
        with pytest.warns(UserWarning, match="this epoch is empty"):
            assert list(loader) == []

    @pytest.mark.parametrize("stack", STACKS)
    def test_close_keeps_the_read_ahead_too(self, stack: str) -> None:
        """Closed mid-epoch, then the loader closed: the next epoch starts where the loop was."""
        loader = STACKS[stack](iter(range(20)))
        iterator = iter(loader)
        assert [next(iterator) for _ in range(3)] == [0, 1, 2]
        iterator.close()
        loader.close()
        second = iter(loader)
        assert next(second) == 3
        del second
        assert list(loader) == list(range(4, 20))

    @pytest.mark.parametrize("stack", STACKS)
    def test_errors_and_the_end_are_carried_in_place(self, stack: str) -> None:
        """A source error read ahead comes in its place next epoch; an end found ends it."""

        def source() -> Iterator[int]:
            yield 0
            yield 1
            raise ValueError("bad")

        loader = STACKS[stack](source())
        iterator = iter(loader)
        assert next(iterator) == 0
        del iterator  # the thread may have read 1 and the error already
        rest = iter(loader)
        assert next(rest) == 1
        with pytest.raises(ValueError, match="bad"):
            next(rest)
        assert list(rest) == []


class TestReadAheadCarried:
    """What a closed epoch read ahead of a one-shot source is the next epoch's, in order."""

    @pytest.mark.parametrize("depth", [2, 16])
    def test_a_close_at_any_item_keeps_the_rest_the_error_and_the_end(self, depth: int) -> None:
        """Closed after k items, once the thread went as far as it may: the next epoch
        gives items k.., the source's error in its place, then ends without asking the
        source again (it found the end once).
        """
        size = 6
        for taken in range(size + 1):
            source = OneShot(size)
            loader = BackgroundLoader(source, depth=depth)
            iterator = iter(loader)
            wait_went_ahead(engine_of(iterator))  # runs may end anywhere: k cuts some
            assert [next(iterator) for _ in range(taken)] == list(range(taken))
            iterator.close()
            rest = iter(loader)
            assert [next(rest) for _ in range(taken, size)] == list(range(taken, size))
            with pytest.raises(ValueError, match="bad"):
                next(rest)
            assert list(rest) == []
            assert source.ends == 1, f"the source was asked past its end again ({taken=})"


class TestMessages:
    """len() and repr say the right thing."""

    def test_len_names_the_dataset(self) -> None:
        """len() of a wrapped DataLoader(IterableDataset) says the dataset lacks __len__."""

        class Stream(IterableDataset[int]):
            def __iter__(self) -> Iterator[int]:
                return iter(range(3))

        stream = DataLoader(Stream())
        for wrapper in (BackgroundLoader(stream), CudaPrefetcher(stream)):
            with pytest.raises(TypeError, match="the dataset 'Stream' of the wrapped 'DataLoader'"):
                len(wrapper)

    def test_repr_is_never_cut(self) -> None:
        """A long loader repr is replaced by its type name, not cut mid-token."""
        loader = BackgroundLoader(list(range(1000)), depth=3)
        assert repr(loader) == "BackgroundLoader(<list object>, depth=3)"
        assert repr(CudaPrefetcher(loader, device="cpu")) == (
            "CudaPrefetcher(BackgroundLoader(<list object>, depth=3), device='cpu')"
        )
        assert repr(BackgroundLoader([1, 2])) == "BackgroundLoader([1, 2], depth='auto')"

    def test_repr_names_each_option_set(self) -> None:
        """Each option set beyond the depth follows it, in the order of the arguments."""
        data = DataLoader(range(4))
        assert repr(BackgroundLoader(data, fetch_threads=2, timeout=2.5, in_order=False)) == (
            "BackgroundLoader(<DataLoader object>, depth='auto', fetch_threads=2, timeout=2.5, "
            "in_order=False)"
        )
        assert repr(BackgroundLoader(data, 4, timeout=3)) == (
            "BackgroundLoader(<DataLoader object>, depth=4, timeout=3)"
        )


class TestAttributesAreTheLoaders:
    """A DataLoader attribute read on a wrapper is the wrapped DataLoader's, never an option."""

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_every_dataloader_keyword_reads_through(self, stack: str) -> None:
        """Each DataLoader.__init__ keyword read on the wrapper equals the DataLoader's value."""
        plain = DataLoader(list(range(8)), batch_size=2, num_workers=2, timeout=3, drop_last=True)
        loader = STACKS[stack](plain)
        names = [name for name in inspect.signature(DataLoader.__init__).parameters][1:]
        differ = {
            name: (getattr(loader, name), getattr(plain, name))
            for name in names
            if hasattr(plain, name) and getattr(loader, name) is not getattr(plain, name)
        }
        assert differ == {}
        assert {"timeout", "pin_memory", "num_workers"} <= set(names)

    def test_the_wrappers_own_options_are_its_settings(self) -> None:
        """BackgroundLoader's timeout, pin_memory and in_order are in .settings, as resolved."""
        plain = DataLoader(list(range(8)), batch_size=2)
        loader = BackgroundLoader(plain, depth=3, timeout=4, fetch_threads=2, in_order=False)
        settings = loader.settings
        assert (settings.depth, settings.timeout, settings.in_order) == (3, 4.0, False)
        assert (settings.fetch_threads, settings.pin_memory) == (2, False)
        assert (loader.timeout, loader.in_order) == (plain.timeout, plain.in_order)
