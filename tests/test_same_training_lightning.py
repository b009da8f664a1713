"""Lightning trains, epoch after epoch, on the order the plain loader gives it (issue 33).

A ``DataLoader(shuffle=True)`` seeded with a ``generator`` (or only with
torch's global seed) under ``Trainer.fit(max_epochs=3)``, with dropout in the
model, plain and through each wrapper stack: the same batches in the same
order in every epoch, and the same losses. Lightning stops an epoch after
``len(loader)`` batches and never makes the ``next()`` that finds the end;
torch's ``RandomSampler`` draws its next permutation's seed from the
generator in that call, so a wrapper that makes it moves the generator on
and changes the next epoch's order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from .same_training import STACKS, THREAD_STACKS, assert_same_steps

L = pytest.importorskip("lightning")

from .test_lightning import pytestmark  # noqa: E402, F401  (Lightning's chatter, ignored as there)

SIZE = 12
BATCH = 2
EPOCHS = 3
SEED = 0

WRAPS: dict[str, Callable[[Any], Any]] = {"plain": lambda loader: loader, **STACKS, **THREAD_STACKS}


def shuffled(seeded_by: str) -> DataLoader[Any]:
    """A shuffled DataLoader over sample ids, seeded by its own generator or by the global seed."""
    data = TensorDataset(torch.arange(float(SIZE)).unsqueeze(1))
    generator = torch.Generator().manual_seed(SEED) if seeded_by == "generator" else None
    return DataLoader(data, batch_size=BATCH, shuffle=True, generator=generator)


class Model(L.LightningModule):  # type: ignore[misc,name-defined]
    """A linear layer behind dropout; records, per step, the epoch, the sample ids and the loss."""

    def __init__(self, make: Callable[[], Any]) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(1, 1))
        self.make = make
        self.steps: list[tuple[int, list[float], float]] = []

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        self.steps.append((self.current_epoch, x.flatten().tolist(), loss.item()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        return self.make()


def fit(
    make: Callable[..., Any], root: Path, limit: int | None = None, module: type[Any] | None = None
) -> list[tuple[int, list[float], float]]:
    """Three epochs from torch's global seed (``limit`` batches each); what every step saw.

    ``module`` is the LightningModule class (default :class:`Model`), made with ``make``.
    """
    torch.manual_seed(SEED)
    model = (module or Model)(make)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=EPOCHS,
        limit_train_batches=limit,
        default_root_dir=str(root),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return model.steps


@pytest.mark.parametrize("seeded_by", ["generator", "global_seed"])
class TestSeededShuffle:
    """Three epochs of a seeded shuffle: plain's batches, in plain's order, plain's losses."""

    def test_plain_reshuffles_each_epoch(self, seeded_by: str, tmp_path: Path) -> None:
        """The reference: every epoch a new order of all samples."""
        steps = fit(lambda: shuffled(seeded_by), tmp_path)
        orders = [[i for e, ids, _ in steps if e == epoch for i in ids] for epoch in range(EPOCHS)]
        assert all(sorted(order) == list(map(float, range(SIZE))) for order in orders)
        assert len({tuple(order) for order in orders}) == EPOCHS

    @pytest.mark.parametrize("stack", sorted(set(WRAPS) - {"plain"}))
    def test_every_epoch_as_plain(self, seeded_by: str, stack: str, tmp_path: Path) -> None:
        plain = fit(lambda: shuffled(seeded_by), tmp_path / "plain")
        wrapped = fit(lambda: WRAPS[stack](shuffled(seeded_by)), tmp_path / "wrapped")
        assert_same_steps(plain, wrapped, f"{stack} ({seeded_by})")


def short_last_batch() -> DataLoader[Any]:
    """Ten samples in batches of four, seeded: drawing the short last batch draws the next order."""
    data = TensorDataset(torch.arange(10.0).unsqueeze(1))
    generator = torch.Generator().manual_seed(SEED)
    return DataLoader(data, batch_size=4, shuffle=True, generator=generator)


class TestLimitTrainBatches:
    """``limit_train_batches=1`` cuts every epoch short of the short last batch the wrapper read."""

    @pytest.mark.parametrize("stack", sorted(set(WRAPS) - {"plain"}))
    def test_every_epoch_as_plain(self, stack: str, tmp_path: Path) -> None:
        plain = fit(short_last_batch, tmp_path / "plain", limit=1)
        assert len({tuple(ids) for _, ids, _ in plain}) == EPOCHS  # each epoch its own order
        wrapped = fit(lambda: WRAPS[stack](short_last_batch()), tmp_path / "wrapped", limit=1)
        assert_same_steps(plain, wrapped, f"{stack} (limit_train_batches=1)")


class SharedGenerator(Model):
    """Trains on 40 samples in batches of 8 and validates on a loader built with the same generator.

    The validation ``DataLoader`` is not shuffled, yet its every ``iter()`` draws
    a seed from the generator, while the training epoch's iterator is still open.
    """

    def __init__(self, make: Callable[[], Any]) -> None:
        super().__init__(make)
        self.generator = torch.Generator().manual_seed(SEED)

    def train_dataloader(self) -> Any:
        data = TensorDataset(torch.arange(40.0).unsqueeze(1))
        return self.make(DataLoader(data, batch_size=8, shuffle=True, generator=self.generator))

    def val_dataloader(self) -> Any:
        data = TensorDataset(torch.arange(6.0).unsqueeze(1))
        return DataLoader(data, batch_size=3, generator=self.generator)

    def validation_step(self, batch: Any, index: int) -> None:
        (x,) = batch
        self.steps.append((-1, x.flatten().tolist(), 0.0))


class TestValidationSharesTheGenerator:
    """The validation loader's draws from the shared generator stay: later epochs are plain's."""

    @pytest.mark.parametrize("stack", sorted(set(WRAPS) - {"plain"}))
    def test_every_epoch_as_plain(self, stack: str, tmp_path: Path) -> None:
        plain = fit(lambda loader: loader, tmp_path / "plain", module=SharedGenerator)
        wrapped = fit(WRAPS[stack], tmp_path / "wrapped", module=SharedGenerator)
        assert_same_steps(plain, wrapped, stack)
