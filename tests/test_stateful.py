"""State only where there is state, and the unsharded-rank warning (issue 11).

A framework treats a loader with ``state_dict``/``load_state_dict`` as
checkpointable; the wrappers have them exactly when what they wrap does, and
deciding so never breaks iteration.
"""

from __future__ import annotations

import inspect
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader, CudaPrefetcher, NotStatefulError, Stateful

from .sources import Stateful as StatefulRange

STACKS: dict[str, Callable[[Any], Any]] = {
    "background": BackgroundLoader,
    "cuda": lambda loader: CudaPrefetcher(loader, device="cpu"),
    "cuda_over_background": lambda loader: CudaPrefetcher(BackgroundLoader(loader), device="cpu"),
}


class RaisingState(StatefulRange):
    """A loader with both methods whose state_dict() raises from the ``fail_from``-th call."""

    def __init__(self, size: int, fail_from: int) -> None:
        super().__init__(size)
        self.calls = 0
        self.fail_from = fail_from

    def state_dict(self) -> dict[str, int]:
        self.calls += 1
        if self.calls >= self.fail_from:
            msg = "no state here"
            raise AttributeError(msg)
        return super().state_dict()


class TestStatefulOnlyWhenWrappedIs:
    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_plain_dataloader_wrapper_has_no_state_methods(self, stack: str) -> None:
        """Over a plain DataLoader no wrapper of the stack has state_dict or load_state_dict."""
        loader = STACKS[stack](DataLoader(range(4)))
        for layer in (loader, loader.loader):
            assert not hasattr(layer, "state_dict") and not hasattr(layer, "load_state_dict")
            assert not isinstance(layer, Stateful)
            assert inspect.getattr_static(layer, "state_dict", None) is None  # Lightning on 3.12+
        assert type(loader).__name__ == type(loader).__mro__[1].__name__  # its class's name
        assert [int(x) for x in loader] == [0, 1, 2, 3]

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_asking_anyway_names_the_cause(self, stack: str) -> None:
        """state_dict() over a plain DataLoader is a NotStatefulError naming DataLoader."""
        loader = STACKS[stack](DataLoader(range(4)))
        with pytest.raises(NotStatefulError, match=r"got DataLoader, which has no state_dict\(\)"):
            loader.state_dict()
        with pytest.raises(TypeError, match="load_state_dict"):
            loader.load_state_dict({})

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_stateful_loader_wrapper_is_stateful_and_keeps_its_class(self, stack: str) -> None:
        """Over a StatefulDataLoader every layer matches Stateful and is still its own class."""
        loader = STACKS[stack](StatefulDataLoader(range(4)))
        assert isinstance(loader, Stateful) and isinstance(loader.loader, Stateful)
        assert isinstance(loader, CudaPrefetcher if stack != "background" else BackgroundLoader)
        assert type(loader).__name__ == type(loader).__mro__[1].__name__

    @pytest.mark.parametrize("stateful", [False, True])
    def test_pickling_keeps_statefulness(self, stateful: bool) -> None:
        """A pickled and unpickled wrapper is as stateful as before and still iterates."""
        inner = StatefulDataLoader(range(3)) if stateful else DataLoader(range(3))
        copy = pickle.loads(pickle.dumps(CudaPrefetcher(BackgroundLoader(inner), device="cpu")))
        assert isinstance(copy, Stateful) is stateful
        assert [int(x) for x in copy] == [0, 1, 2]


class TestStateDictThatRaises:
    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_raising_at_epoch_start_iterates_as_non_stateful(self, stack: str) -> None:
        """A state_dict() that raises at the epoch start: all items come, the wrapper turns
        non-stateful, and state_dict() names the error."""
        loader = STACKS[stack](RaisingState(5, fail_from=1))
        assert list(loader) == list(range(5))
        assert list(loader) == list(range(5))
        assert not hasattr(loader, "state_dict")
        with pytest.raises(NotStatefulError, match="raised AttributeError: no state here"):
            loader.state_dict()

    @pytest.mark.parametrize("stack", ["background", "cuda"])
    def test_raising_after_an_item_loses_only_that_state(self, stack: str) -> None:
        """A state_dict() that starts raising mid-epoch: all items come; state_dict() says why."""
        loader = STACKS[stack](RaisingState(5, fail_from=3))
        assert list(loader) == list(range(5))
        with pytest.raises(NotStatefulError, match="RaisingState, whose state_dict"):
            loader.state_dict()


@pytest.fixture
def two_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torch.distributed look initialised with two processes."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)  # a DataLoader asks too


class Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


class TestUnshardedWarning:
    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_warns_once_for_a_dataloader_every_rank_reads(
        self, stack: str, two_ranks: None
    ) -> None:
        """World size 2 and a non-sharding sampler: one UserWarning naming the fix."""
        loader = STACKS[stack](DataLoader(range(4), shuffle=True))
        with pytest.warns(UserWarning, match="every rank reads every item") as caught:
            assert sorted(int(x) for x in loader) == [0, 1, 2, 3]
            assert sorted(int(x) for x in loader) == [0, 1, 2, 3]
        assert len(caught) == 1 and "DistributedSampler" in str(caught[0].message)
        assert caught[0].filename == __file__  # points at the loop, through any stack

    @pytest.mark.parametrize(
        "make",
        [
            lambda: DataLoader(range(4), sampler=DistributedSampler(range(4), 2, 0)),
            lambda: DataLoader(Stream()),
            lambda: [0, 1, 2, 3],
        ],
        ids=["distributed_sampler", "iterable_dataset", "list"],
    )
    def test_silent_when_sharded_or_unknowable(
        self, make: Callable[[], Any], two_ranks: None
    ) -> None:
        """A DistributedSampler, an IterableDataset or a non-DataLoader gives no warning."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(BackgroundLoader(make()))
        assert [str(warning.message) for warning in caught] == []

    def test_silent_on_one_process(self) -> None:
        """Without torch.distributed initialised there is nothing to warn about."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(BackgroundLoader(DataLoader(range(2)))) == [0, 1]
