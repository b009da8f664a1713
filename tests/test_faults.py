"""A source failing mid-epoch or in a protocol method: items first, then its same error object.

Every test here has a hard timeout; "promptly" means within a few seconds,
never a speed claim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, CudaPrefetcher, NotStatefulError
from prefetch.compat import BackgroundGenerator

from .errors import CustomBaseError, KwOnlyError, NoSuperError, make_errors
from .processes import prefetch_threads, wait_until
from .sources import FailingIterable, ListSource, drain

Wrap = Callable[[Any], Any]

WRAPPERS: dict[str, Wrap] = {
    "background-d1": lambda src: BackgroundLoader(src, depth=1),
    "background-d4": lambda src: BackgroundLoader(src, depth=4),
    "cuda-cpu-d2": lambda src: CudaPrefetcher(src, device="cpu", depth=2),
    "stacked": lambda src: CudaPrefetcher(BackgroundLoader(src, depth=3), device="cpu", depth=2),
}

ERROR_KINDS = sorted(make_errors())


class TestSourceRaisesAfterItems:
    """An error raised by the source after N items arrives intact, in its place."""

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    @pytest.mark.parametrize("kind", ERROR_KINDS)
    @pytest.mark.parametrize("after", [0, 1, 5])
    def test_same_object_after_every_earlier_item(
        self, wrapper: str, kind: str, after: int
    ) -> None:
        """The exact exception object arrives after the N items before it; then the epoch ends."""
        error = make_errors()[kind]
        loader = WRAPPERS[wrapper](FailingIterable(list(range(10)), fail_at=after, error=error))
        iterator = iter(loader)
        items, raised = drain(iterator)
        assert items == list(range(after))
        assert raised is error
        with pytest.raises(StopIteration):
            next(iterator)
        assert wait_until(lambda: not prefetch_threads(), 3.0)

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("kind", ERROR_KINDS)
    def test_compat_generator_delivers_the_same_object(self, kind: str) -> None:
        """prefetch.compat.BackgroundGenerator hands over the same object after the items."""
        error = make_errors()[kind]
        items, raised = drain(BackgroundGenerator(FailingIterable([0, 1, 2], 2, error), 2))
        assert items == [0, 1]
        assert raised is error

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("kind", ["KwOnlyError", "NoSuperError", "CustomBaseError"])
    def test_single_process_dataloader_passes_the_object(self, kind: str) -> None:
        """Through DataLoader(num_workers=0) the dataset's exception is still the same object."""
        error = make_errors()[kind]

        class Raising(Dataset[int]):
            def __len__(self) -> int:
                return 8

            def __getitem__(self, index: int) -> int:
                if index == 5:
                    raise error
                return index

        loader = CudaPrefetcher(BackgroundLoader(DataLoader(Raising()), depth=2), device="cpu")
        items, raised = drain(iter(loader))
        assert [int(x) for x in items] == [0, 1, 2, 3, 4]
        assert raised is error

    @pytest.mark.timeout(30)
    def test_unusual_constructors_are_not_rebuilt(self) -> None:
        """Exceptions that cannot be rebuilt from args keep type, attributes and identity."""
        for error in (KwOnlyError(code=11), NoSuperError(4, 5)):
            loader = BackgroundLoader(FailingIterable([1, 2], fail_at=1, error=error))
            items, raised = drain(iter(loader))
            assert items == [1]
            assert raised is error
        assert isinstance(raised, NoSuperError) and raised.total == 9

    @pytest.mark.timeout(30)
    def test_loader_is_reusable_after_an_error(self) -> None:
        """After an epoch ends with an error, the next epoch runs in full."""
        source = FailingIterable(list(range(6)), fail_at=3, error=KeyboardInterrupt())
        loader = CudaPrefetcher(BackgroundLoader(source, depth=2), device="cpu")
        items, raised = drain(iter(loader))
        assert items == [0, 1, 2] and isinstance(raised, KeyboardInterrupt)
        source.fail_at = None
        assert list(loader) == list(range(6))

    @pytest.mark.timeout(30)
    def test_consumer_side_base_exception_stops_the_thread(self) -> None:
        """A KeyboardInterrupt raised in the loop body stops the producer (no leak)."""
        loader = BackgroundLoader(range(10**9), depth=3)
        with pytest.raises(KeyboardInterrupt):
            for item in loader:
                if item == 5:
                    raise KeyboardInterrupt
        assert wait_until(lambda: not prefetch_threads(), 3.0)


class TestSourceRaisesInProtocol:
    """Errors from the source's own methods (iter, len, set_epoch, state_dict) pass through."""

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    @pytest.mark.parametrize("kind", ["ValueError", "KeyboardInterrupt", "CustomBaseError"])
    def test_iter_raises(self, wrapper: str, kind: str) -> None:
        """An error in the source's __iter__ is raised by the first next(); no thread starts."""
        error = make_errors()[kind]

        class BadIter:
            def __iter__(self) -> Iterator[int]:
                raise error

        loader = WRAPPERS[wrapper](BadIter())
        iterator = iter(loader)  # lazy: nothing runs yet
        with pytest.raises(BaseException) as info:
            next(iterator)
        assert info.value is error
        assert not prefetch_threads()
        with pytest.raises(StopIteration):  # the epoch is over
            next(iterator)

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    def test_len_raises(self, wrapper: str) -> None:
        """An error (other than TypeError) in the source's __len__ reaches len() as is."""
        error = KwOnlyError(code=3)

        class BadLen(FailingIterable):
            def __len__(self) -> int:
                raise error

        loader = WRAPPERS[wrapper](BadLen([1, 2, 3]))
        with pytest.raises(KwOnlyError) as info:
            len(loader)
        assert info.value is error
        assert [x for x in loader] == [1, 2, 3]  # not list(): it asks len() for a hint

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
    def test_set_epoch_raises(self, wrapper: str) -> None:
        """An error in the source's set_epoch reaches the caller of set_epoch as is."""
        error = CustomBaseError("set_epoch")

        class BadEpoch(FailingIterable):
            def set_epoch(self, epoch: int) -> None:
                raise error

        loader = WRAPPERS[wrapper](BadEpoch([1, 2]))
        with pytest.raises(CustomBaseError) as info:
            loader.set_epoch(1)
        assert info.value is error
        assert list(loader) == [1, 2]

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("fail_pos", [2, 4, 7])
    def test_state_dict_raises_in_the_producer(self, fail_pos: int) -> None:
        """An error from state_dict() read after an item loses that item's state, not the item.

        Every item arrives; asking for the state right after that item raises
        NotStatefulError chained to the error; one item later the state is back.
        """
        error = NoSuperError(0, 0)

        class BadState(ListSource):
            def state_dict(self) -> dict[str, int]:
                if self.pos == fail_pos:
                    raise error
                return super().state_dict()

        loader = BackgroundLoader(BadState(10), depth=3)
        iterator = iter(loader)
        items = [next(iterator) for _ in range(fail_pos)]
        with pytest.raises(NotStatefulError, match="NoSuperError") as info:
            loader.state_dict()
        assert info.value.__cause__ is error
        items.append(next(iterator))
        assert loader.state_dict() == {"pos": fail_pos + 1, "epoch": 0}
        items.extend(iterator)
        assert [index for _, index, _ in items] == list(range(10))

    @pytest.mark.timeout(30)
    def test_state_dict_raises_at_epoch_start(self) -> None:
        """A BaseException from the start-of-epoch state_dict() is raised by next(); no thread."""
        error = SystemExit(9)

        class BadState(ListSource):
            def state_dict(self) -> dict[str, int]:
                raise error

        loader = BackgroundLoader(BadState(5))
        iterator = iter(loader)  # lazy: the epoch starts at the first next()
        with pytest.raises(SystemExit) as info:
            next(iterator)
        assert info.value is error
        assert not prefetch_threads()

    @pytest.mark.timeout(30)
    def test_load_state_dict_raises(self) -> None:
        """An error from the source's load_state_dict() reaches the caller; the loader works on."""
        error = KwOnlyError(code=1)

        class BadLoad(ListSource):
            def load_state_dict(self, state: dict[str, int]) -> None:
                raise error

        source = BadLoad(4)
        loader = BackgroundLoader(source, depth=2)
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(KwOnlyError) as info:
            loader.load_state_dict({"pos": 0, "epoch": 0})
        assert info.value is error
        assert not prefetch_threads()
        # The source keeps its own position (the producer ran ahead of the consumer).
        start = source.pos
        assert [index for _, index, _ in loader] == list(range(start, 4))
