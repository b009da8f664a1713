"""An epoch starts at its first ``next()``, not at ``iter()`` (issue 24).

A framework may call ``iter()`` only to check that a loader is iterable and
drop the iterator (Lightning does, for anything that is not a DataLoader):
that must read nothing, start no thread or worker process, and leave the
seeded random state where it was, so the run sees the plain loader's order.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from prefetch import BackgroundLoader, CudaPrefetcher

from .processes import live_child_pids, prefetch_threads, wait_until

L = pytest.importorskip("lightning")


class Counted(Dataset[torch.Tensor]):
    """Sixteen samples whose reads are counted (in any process: a shared tensor)."""

    def __init__(self) -> None:
        self.reads = torch.zeros(1, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        self.reads += 1
        return torch.tensor([float(index)])


def shuffled(dataset: Dataset[Any], **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(dataset, batch_size=2, shuffle=True, **kwargs)


STACKS: dict[str, Callable[[Dataset[Any]], Any]] = {
    "background": lambda data: BackgroundLoader(shuffled(data)),
    "workers": lambda data: BackgroundLoader(shuffled(data, num_workers=2)),
    "fetch_threads": lambda data: BackgroundLoader(shuffled(data), fetch_threads=4),
    "cuda_over_background": lambda data: CudaPrefetcher(BackgroundLoader(shuffled(data))),
    "cuda": lambda data: CudaPrefetcher(shuffled(data)),
}


class TestIterStartsNothing:
    """iter() without next() reads nothing, starts nothing, draws no random number."""

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_no_read_no_thread_no_worker_no_draw(self, stack: str) -> None:
        """Between iter() and its drop: no read, no prefetch thread, no child, RNG untouched."""
        data = Counted()
        loader = STACKS[stack](data)
        rng = torch.get_rng_state()
        threads = threading.active_count()
        iterator = iter(loader)
        assert int(data.reads) == 0
        assert prefetch_threads() == [] and threading.active_count() == threads
        assert live_child_pids() == []
        assert torch.equal(torch.get_rng_state(), rng)
        assert loader.stats.items == 0
        del iterator
        gc.collect()
        assert torch.equal(torch.get_rng_state(), rng) and int(data.reads) == 0

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_a_dropped_iter_leaves_the_seeded_order(self, stack: str) -> None:
        """A probe iter() before the epoch: the same seeded order as without it."""
        torch.manual_seed(7)
        plain = [batch[0].tolist() for batch in shuffled(TensorDataset(torch.arange(16.0)))]
        data = TensorDataset(torch.arange(16.0))
        torch.manual_seed(7)
        loader = STACKS[stack](data)
        iter(loader)  # a framework looking: dropped at once
        got = [batch[0].flatten().tolist() for batch in loader]
        assert got == plain
        assert wait_until(lambda: not prefetch_threads() and not live_child_pids(), 10.0)

    def test_the_first_next_starts_on_the_callers_thread(self) -> None:
        """iter(source) of the wrapped loader runs inside the first next(), on that thread."""
        seen: list[str] = []

        class Looks:
            def __iter__(self) -> Any:
                seen.append(threading.current_thread().name)
                return iter([1, 2])

        iterator = iter(BackgroundLoader(Looks()))
        assert seen == []
        assert next(iterator) == 1
        assert seen == [threading.current_thread().name]
        iterator.close()

    def test_an_error_of_iter_reaches_the_first_next(self) -> None:
        """iter(loader) raising: the first next() raises it, no thread starts, then the end."""

        class Broken:
            def __iter__(self) -> Any:
                raise ValueError("cannot iterate")

        iterator = iter(BackgroundLoader(Broken()))
        with pytest.raises(ValueError, match="cannot iterate"):
            next(iterator)
        assert prefetch_threads() == []
        with pytest.raises(StopIteration):
            next(iterator)

    @pytest.mark.parametrize("stack", ["background", "cuda_over_background", "cuda"])
    def test_close_before_next_never_starts(self, stack: str) -> None:
        """close() on an idle iterator ends it: next() stops, nothing was read."""
        data = Counted()
        iterator = iter(STACKS[stack](data))
        iterator.close()
        with pytest.raises(StopIteration):
            next(iterator)
        assert int(data.reads) == 0 and prefetch_threads() == []

    @pytest.mark.parametrize("stack", ["background", "cuda_over_background", "cuda"])
    def test_the_loader_s_close_leaves_an_idle_iterator_whole(self, stack: str) -> None:
        """The loader's close() stops open epochs only: an idle one then reads a whole epoch."""
        data = Counted()
        loader = STACKS[stack](data)
        iterator = iter(loader)
        loader.close()
        assert int(data.reads) == 0
        got = sorted(float(value) for batch in iterator for value in batch.flatten())
        assert got == [float(index) for index in range(16)]


class TestStart:
    """iterator.start() starts the epoch before the first next(), once, on the caller's thread."""

    @pytest.mark.parametrize("stack", ["background", "fetch_threads", "cuda_over_background"])
    def test_start_reads_ahead_before_next(self, stack: str) -> None:
        """After start() the thread reads without a next(); the items are the same."""
        data = Counted()
        iterator = iter(STACKS[stack](data))
        iterator.start()
        assert wait_until(lambda: int(data.reads) > 0, 5.0, collect=False)
        assert prefetch_threads() != []
        got = sorted(float(value) for batch in iterator for value in batch.flatten())
        assert got == [float(index) for index in range(16)]

    def test_start_twice_and_after_close_does_nothing(self) -> None:
        """A second start() changes nothing; start() on a closed idle epoch starts nothing."""
        seen: list[str] = []

        class Looks:
            def __iter__(self) -> Any:
                seen.append(threading.current_thread().name)
                return iter([1, 2])

        iterator = iter(BackgroundLoader(Looks()))
        iterator.start()
        iterator.start()
        assert seen == [threading.current_thread().name]
        assert list(iterator) == [1, 2]
        closed = iter(BackgroundLoader(Looks()))
        closed.close()
        closed.start()
        assert len(seen) == 1 and list(closed) == []

    @pytest.mark.parametrize("fetch_threads", [None, 2])
    def test_the_sampler_starts_on_the_callers_thread(self, fetch_threads: int | None) -> None:
        """The sampler's first draw (a seeded shuffle's permutation) is made by start(), on
        the caller's thread, as the plain loop's first next() makes it: not by a thread at
        a moment that depends on timing."""
        drew: list[int] = []

        class Sampler(torch.utils.data.Sampler[int]):
            def __len__(self) -> int:
                return 4

            def __iter__(self) -> Any:
                drew.append(threading.get_ident())
                yield from range(4)

        loader = DataLoader(list(range(4)), batch_size=2, sampler=Sampler())
        iterator = iter(BackgroundLoader(loader, fetch_threads=fetch_threads))
        iterator.start()
        assert drew == [threading.get_ident()]
        assert [batch.tolist() for batch in iterator] == [[0, 1], [2, 3]]

    def test_an_error_of_iter_reaches_start(self) -> None:
        """iter(loader) raising inside start(): start() raises it and the epoch is over."""

        class Broken:
            def __iter__(self) -> Any:
                raise ValueError("cannot iterate")

        iterator = iter(BackgroundLoader(Broken()))
        with pytest.raises(ValueError, match="cannot iterate"):
            iterator.start()
        assert prefetch_threads() == [] and list(iterator) == []


class Recorder(L.LightningModule):  # type: ignore[misc,name-defined]
    """Records the order of the training items of the first epoch."""

    def __init__(self, loader: Callable[[], Any]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.loader = loader
        self.order: list[float] = []

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        (x,) = batch
        self.order += x.flatten().tolist()
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        return self.loader()


@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")
@pytest.mark.filterwarnings("ignore:.*litlogger.*|.*litmodels.*")
class TestLightningOrder:
    """Under Lightning with seed_everything, a wrapped loader sees the plain loader's order."""

    @pytest.mark.parametrize("stack", ["background", "fetch_threads", "cuda_over_background"])
    def test_seeded_order_as_plain(self, stack: str, tmp_path: Path) -> None:
        """Lightning's iter() probe of the wrapper moves no random state: the orders match."""

        def order(make: Callable[[], Any]) -> list[float]:
            L.seed_everything(1234, verbose=False)
            model = Recorder(make)
            L.Trainer(
                accelerator="cpu",
                default_root_dir=str(tmp_path),
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                max_epochs=1,
            ).fit(model)
            return model.order

        data = TensorDataset(torch.arange(64.0).unsqueeze(1))
        plain = order(lambda: shuffled(data))
        wrapped = order(lambda: STACKS[stack](data))
        assert sorted(plain) == [float(i) for i in range(64)]
        assert wrapped == plain
