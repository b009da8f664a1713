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
    def test_the_wrapper_goes_inside_the_prepared_loader(
        self, wrap: str, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """The prepared loader itself comes back, reading ahead through its base_dataloader."""
        accelerator = make_accelerator(False)
        prepared = accelerator.prepare(DataLoader(list(range(SIZE)), batch_size=BATCH))
        base = prepared.base_dataloader
        loader = WRAPS[wrap](prepared)
        assert loader is prepared and prepared in accelerator._dataloaders
        inside = prepared.base_dataloader
        assert isinstance(inside, (BackgroundLoader, CudaPrefetcher))
        while isinstance(inside, (BackgroundLoader, CudaPrefetcher)):
            inside = inside.loader
        assert inside is base
        assert batches(loader) == [[i, i + 1] for i in range(0, SIZE, BATCH)]
        assert loader.stats.items == SIZE // BATCH  # the wrapper's, read through

    def test_without_stateful_option_the_loader_is_as_stateful_as_prepared(
        self, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """Statefulness is the prepared loader's own: the base inside is not stateful."""
        accelerator = make_accelerator(False)
        loader = BackgroundLoader(accelerator.prepare(DataLoader(list(range(SIZE)), batch_size=2)))
        assert not hasattr(loader.base_dataloader, "state_dict")
        with pytest.raises(NotStatefulError, match="state_dict"):
            loader.base_dataloader.state_dict()

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


class TestParallelFetchInside:
    @pytest.mark.parametrize("stateful", [False, True])
    def test_fetch_threads_read_the_prepared_loaders_base(
        self, stateful: bool, make_accelerator: Callable[[bool], Any]
    ) -> None:
        """fetch_threads over a prepared loader read its base DataLoader: the same batches."""
        accelerator = make_accelerator(stateful)

        def prepared() -> Any:
            return accelerator.prepare(DataLoader(list(range(SIZE)), batch_size=2, shuffle=True))

        torch.manual_seed(0)
        plain = [batches(loader) for loader in [prepared()] for _ in range(2)]
        torch.manual_seed(0)  # before prepare(): a stateful one draws a seed there
        loader = BackgroundLoader(prepared(), fetch_threads=2)
        assert loader.base_dataloader.fetch_threads == 2
        assert [batches(loader) for _ in range(2)] == plain


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
