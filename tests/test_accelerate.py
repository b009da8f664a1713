"""accelerate 1.15 with the real package: prepare, then wrap (issue 11); warn the other way (24).

Every test that makes an ``Accelerator`` makes it with the ``make_accelerator``
fixture (tests/accelerators.py), which resets accelerate's process-wide state
afterwards.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from prefetch import BackgroundLoader, CudaPrefetcher, NotStatefulError, Stateful

accelerate = pytest.importorskip("accelerate")

SIZE = 10
BATCH = 2

WRAPS: dict[str, Callable[[Any], Any]] = {
    "none": lambda loader: loader,
    "background": BackgroundLoader,
    "cuda_over_background": lambda loader: CudaPrefetcher(BackgroundLoader(loader)),
}


def batches(loader: Any) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


class TestPrepareThenWrap:
    @pytest.mark.parametrize("stateful", [False, True])
    @pytest.mark.parametrize("wrap", sorted(WRAPS))
    def test_len_set_epoch_and_items_match_the_prepared_loader(
        self, wrap: str, stateful: bool, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """A wrapped prepared loader has its len, forwards set_epoch and gives its batches."""
        accelerator = make_accelerator(stateful)
        prepared = accelerator.prepare(DataLoader(list(range(SIZE)), batch_size=BATCH))
        loader = WRAPS[wrap](prepared)
        assert len(loader) == SIZE // BATCH
        loader.set_epoch(3)
        assert prepared.iteration == 3
        assert batches(loader) == [[i, i + 1] for i in range(0, SIZE, BATCH)]
        assert batches(loader) == [[i, i + 1] for i in range(0, SIZE, BATCH)]

    @pytest.mark.parametrize("wrap", ["background", "cuda_over_background"])
    def test_without_stateful_option_the_wrapper_is_not_stateful(
        self, wrap: str, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """Without use_stateful_dataloader, the wrapper has no state and says how to get one."""
        accelerator = make_accelerator(False)
        loader = WRAPS[wrap](accelerator.prepare(DataLoader(list(range(SIZE)), batch_size=BATCH)))
        assert not hasattr(loader, "state_dict") and not isinstance(loader, Stateful)
        with pytest.raises(NotStatefulError, match="use_stateful_dataloader=True"):
            loader.state_dict()

    @pytest.mark.parametrize("wrap", ["background", "cuda_over_background"])
    @pytest.mark.parametrize("taken", [0, 2, SIZE // BATCH])
    def test_resume_with_stateful_option_is_exact(
        self, wrap: str, taken: int, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """With use_stateful_dataloader, a state after n batches resumes at batch n + 1."""
        accelerator = make_accelerator(True)

        def make() -> Any:
            loader = DataLoader(list(range(SIZE)), batch_size=BATCH)
            return WRAPS[wrap](accelerator.prepare(loader))

        loader = make()
        assert isinstance(loader, Stateful)
        iterator = iter(loader)
        seen = [next(iterator).tolist() for _ in range(taken)]
        state = loader.state_dict()
        rest = [batch.tolist() for batch in iterator]
        resumed = make()
        resumed.load_state_dict(state)
        if taken < SIZE // BATCH:
            assert seen + batches(resumed) == seen + rest == batches(make())
        assert torch.tensor(seen + rest).flatten().tolist() == list(range(SIZE))


class TestWrapThenPrepare:
    def test_prepare_returns_a_wrapper_untouched(
        self, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """prepare() on a wrapper returns the same object: the documented reason to wrap last."""
        loader = BackgroundLoader(DataLoader(list(range(SIZE)), batch_size=BATCH))
        assert make_accelerator(False).prepare(loader) is loader


class TestParallelFetchRefused:
    @pytest.mark.parametrize("stateful", [False, True])
    def test_prepared_loader_is_refused_naming_its_own_iteration(
        self, stateful: bool, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """fetch_threads over a prepared loader is refused at once: it would skip its __iter__."""
        prepared = make_accelerator(stateful).prepare(DataLoader(list(range(SIZE)), batch_size=2))
        with pytest.raises(TypeError, match=r"fetch_threads.*defines its own __iter__\(\)"):
            BackgroundLoader(prepared, fetch_threads=2)


UNPREPARED = r"BackgroundLoader wraps a DataLoader that accelerate has not prepared"


def first_epoch_warnings(loader: Any) -> list[str]:
    """The warnings the loader's first epoch raises (every one recorded, none an error)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(loader)
    return [str(warning.message) for warning in caught]


class TestWrapBeforePrepareWarns:
    """A wrapper over a DataLoader accelerate has not prepared warns once an Accelerator exists."""

    def test_wrap_then_prepare_warns_at_the_first_epoch_naming_the_fix(
        self, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """prepare(wrapper) does nothing; the first epoch warns how to order the two, once."""
        accelerator = make_accelerator(False)
        loader = BackgroundLoader(DataLoader(list(range(SIZE)), batch_size=BATCH))
        assert accelerator.prepare(loader) is loader
        with pytest.warns(UserWarning, match=UNPREPARED) as caught:
            assert batches(loader) == [[i, i + 1] for i in range(0, SIZE, BATCH)]
        (message,) = [str(w.message) for w in caught]
        assert "BackgroundLoader(accelerator.prepare(dataloader))" in message
        assert first_epoch_warnings(loader) == []  # once per wrapper

    def test_accelerator_made_after_the_wrapper_is_seen_at_the_first_epoch(
        self, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """The check runs at the first epoch, so the Accelerator may come after the wrapper."""
        loader = CudaPrefetcher(BackgroundLoader(DataLoader(list(range(SIZE)), batch_size=BATCH)))
        make_accelerator(False)
        (message,) = first_epoch_warnings(loader)
        assert message.startswith("BackgroundLoader wraps a DataLoader")  # the inner one only

    @pytest.mark.parametrize(
        "make",
        [
            pytest.param(
                lambda a: BackgroundLoader(a.prepare(DataLoader(range(SIZE)))), id="prepared"
            ),
            pytest.param(
                lambda a: BackgroundLoader(DataLoader(range(SIZE)), fetch_threads=2),
                id="fetch_threads",
            ),
            pytest.param(
                lambda a: BackgroundLoader(
                    DataLoader(range(SIZE), sampler=DistributedSampler(range(SIZE), 2, 0))
                ),
                id="sharded_by_hand",
            ),
            pytest.param(lambda a: BackgroundLoader(list(range(SIZE))), id="not_a_dataloader"),
        ],
    )
    def test_no_warning_where_nothing_is_lost(
        self, make: Callable[[Any], Any], make_accelerator: Callable[[bool], Any]
    ) -> None:
        """Prepared, parallel fetch (it cannot read a prepared one), sharded, or no DataLoader."""
        loader = make(make_accelerator(False))
        assert first_epoch_warnings(loader) == []

    def test_no_warning_without_an_accelerator(self) -> None:
        """accelerate imported but no Accelerator made: a plain DataLoader wrapper is quiet."""
        assert not accelerate.state.is_initialized()
        loader = BackgroundLoader(DataLoader(list(range(SIZE)), batch_size=BATCH))
        assert first_epoch_warnings(loader) == []
