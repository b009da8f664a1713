"""``BackgroundLoader(..., fetch_threads=N, in_order=False)``: batches as they are ready.

A sample that waits (here for an event the loop sets) holds back only its own
batch; every batch still arrives exactly once, and an error that ends the
epoch arrives after every batch before it. Nothing depends on timing: the
slow sample waits until the loop has received another batch, which only
out-of-order delivery allows.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, CudaPrefetcher, NotStatefulError, sample_seed

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
GRAINS = ["sample", "batch"]


class HeldBack(Dataset[int]):
    """Indices 0..n-1; reading ``held`` waits until ``release`` is set."""

    def __init__(self, n: int, held: int = 0, error: BaseException | None = None) -> None:
        self.n, self.held, self.error = n, held, error
        self.release = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.held:
            if not self.release.wait(WAIT):
                msg = "the loop never released the held sample"
                raise TimeoutError(msg)
            if self.error is not None:
                raise self.error
        return index


def first_values(batches: list[torch.Tensor]) -> list[int]:
    return [int(batch[0]) for batch in batches]


class TestOutOfOrder:
    """Batches are handed over as they are ready, each exactly once."""

    @pytest.mark.parametrize("grain", GRAINS)
    def test_a_held_batch_does_not_hold_back_the_others(self, grain: str) -> None:
        """The loop receives later batches while batch 0 waits, then batch 0 itself."""
        dataset = HeldBack(32)
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=4), fetch_threads=4, in_order=False, fetch_grain=grain
        )
        received: list[torch.Tensor] = []
        for batch in loader:
            received.append(batch)
            dataset.release.set()  # only after a batch other than 0 arrived
        firsts = first_values(received)
        assert firsts[0] != 0
        assert sorted(firsts) == list(range(0, 32, 4))
        expected = [batch.tolist() for batch in DataLoader(range(32), batch_size=4)]
        assert sorted(batch.tolist() for batch in received) == expected

    @pytest.mark.parametrize("grain", GRAINS)
    def test_in_order_by_default(self, grain: str) -> None:
        """Without in_order=False the same loader keeps sampler order."""
        dataset = HeldBack(16)
        dataset.release.set()
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=4), fetch_threads=4, fetch_grain=grain
        )
        assert loader.settings.in_order
        assert first_values(list(loader)) == [0, 4, 8, 12]

    @pytest.mark.parametrize("grain", GRAINS)
    def test_an_error_arrives_and_the_epoch_goes_on(self, grain: str) -> None:
        """A batch's Exception reaches the loop once; every other batch arrives."""
        dataset = HeldBack(24, held=5, error=ValueError("bad sample 5"))
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=4), fetch_threads=3, in_order=False, fetch_grain=grain
        )
        iterator = iter(loader)
        received, errors = [], []
        while True:
            try:
                received.append(next(iterator))
            except StopIteration:
                break
            except ValueError as error:
                errors.append(str(error))
            dataset.release.set()
        assert errors == ["bad sample 5"]
        assert sorted(first_values(received)) == [0, 8, 12, 16, 20]

    @pytest.mark.parametrize("grain", GRAINS)
    def test_an_epoch_ending_error_comes_after_every_batch_before_it(self, grain: str) -> None:
        """A BaseException in batch 3 ends the epoch after batches 0, 1 and 2."""

        class Fatal(BaseException):
            pass

        dataset = HeldBack(32, held=12, error=Fatal("fatal in batch 3"))
        loader = BackgroundLoader(
            DataLoader(dataset, batch_size=4), fetch_threads=2, in_order=False, fetch_grain=grain
        )
        received: list[torch.Tensor] = []
        with pytest.raises(Fatal, match="fatal in batch 3"):
            for batch in loader:
                received.append(batch)
                dataset.release.set()
        assert {0, 4, 8} <= set(first_values(received))
        assert 12 not in first_values(received)

    def test_through_a_cuda_prefetcher(self) -> None:
        """Stacked under CudaPrefetcher (CPU path) every batch still arrives once."""
        dataset = HeldBack(32)
        loader = CudaPrefetcher(
            BackgroundLoader(DataLoader(dataset, batch_size=4), fetch_threads=4, in_order=False),
            device="cpu",
        )
        firsts = []
        for batch in loader:
            firsts.append(int(batch[0]))
            dataset.release.set()
        assert sorted(firsts) == list(range(0, 32, 4))
        assert len(loader) == 8


class Augmented(HeldBack):
    """Each sample is its index plus noise drawn from :func:`prefetch.sample_seed`."""

    def __getitem__(self, index: int) -> torch.Tensor:  # type: ignore[override]
        value = super().__getitem__(index)
        generator = torch.Generator().manual_seed(sample_seed())
        return value + torch.rand((), generator=generator)


class TestSeededAugmentations:
    """Per-sample seeds do not depend on when a batch is handed over."""

    @pytest.mark.parametrize("grain", GRAINS)
    def test_same_batches_as_in_order(self, grain: str) -> None:
        """A seeded epoch out of order has the in-order epoch's batches, bit for bit."""

        torch.manual_seed(0)
        first = int(next(iter(DataLoader(range(24), batch_size=4, shuffle=True)))[0])

        def epoch(in_order: bool) -> list[list[float]]:
            dataset = Augmented(24, held=first)  # a sample of the first batch waits
            torch.manual_seed(0)
            loader = BackgroundLoader(
                DataLoader(dataset, batch_size=4, shuffle=True),
                fetch_threads=3,
                in_order=in_order,
                fetch_grain=grain,
            )
            if in_order:
                dataset.release.set()
            batches = []
            for batch in loader:
                batches.append(batch.tolist())
                dataset.release.set()
            return batches

        in_order, out_of_order = epoch(True), epoch(False)
        assert in_order != out_of_order  # the held batch came later
        assert sorted(in_order) == sorted(out_of_order)


class TestNoCheckpoint:
    """A loader that delivers out of order has no state_dict, and says why."""

    def test_state_dict_is_refused_with_the_reason(self) -> None:
        """Over a StatefulDataLoader, state_dict raises NotStatefulError naming in_order."""
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = BackgroundLoader(
            StatefulDataLoader(list(range(8)), batch_size=2), fetch_threads=2, in_order=False
        )
        assert not hasattr(loader, "state_dict")
        with pytest.raises(NotStatefulError, match="in_order=False"):
            loader.state_dict()
        stacked = CudaPrefetcher(loader, device="cpu")
        with pytest.raises(NotStatefulError, match="in_order=False"):
            stacked.load_state_dict({})
        assert sorted(value for batch in loader for value in batch.tolist()) == list(range(8))

    def test_in_order_keeps_state_dict(self) -> None:
        """The same loader in order still checkpoints."""
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = BackgroundLoader(StatefulDataLoader(list(range(8)), batch_size=2), fetch_threads=2)
        assert callable(loader.state_dict)


class TestArguments:
    """Bad values for in_order get an error naming the argument."""

    def test_needs_fetch_threads(self) -> None:
        """in_order=False without fetch_threads: ValueError naming both."""
        with pytest.raises(ValueError, match=r"in_order=False.*fetch_threads=None"):
            BackgroundLoader(DataLoader(range(4)), in_order=False)

    def test_not_a_bool(self) -> None:
        """A non-bool in_order: TypeError with the value given."""
        with pytest.raises(TypeError, match=r"in_order=\.\.\.\) expects True or False, got 0"):
            BackgroundLoader(DataLoader(range(4)), fetch_threads=2, in_order=0)  # type: ignore[arg-type]

    def test_repr_says_so(self) -> None:
        """repr shows in_order=False, and only then."""
        loader = BackgroundLoader(DataLoader(range(4)), fetch_threads=2, in_order=False)
        assert repr(loader).endswith("fetch_threads=2, in_order=False)")
        assert "in_order" not in repr(BackgroundLoader(DataLoader(range(4)), fetch_threads=2))
