"""Lightning 2.6 with the real package: fit, validate and test through the wrappers (issue 11).

Single process with the default ``ModelCheckpoint``, and ``ddp_spawn`` with
two CPU processes (gloo) to check that each rank trains on its own shard.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader, CudaPrefetcher

from .subprocesses import ROOT, subprocess_env

L = pytest.importorskip("lightning")

pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*litlogger.*|.*litmodels.*"),
]

SIZE = 12
BATCH = 2


def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(float(SIZE)).unsqueeze(1))


STACKS: dict[str, Callable[[], Any]] = {
    "background": lambda: BackgroundLoader(DataLoader(dataset(), batch_size=BATCH)),
    "cuda_over_background": lambda: CudaPrefetcher(
        BackgroundLoader(DataLoader(dataset(), batch_size=BATCH))
    ),
    "cuda": lambda: CudaPrefetcher(DataLoader(dataset(), batch_size=BATCH)),
    "stateful": lambda: BackgroundLoader(StatefulDataLoader(dataset(), batch_size=BATCH)),
    "threads": lambda: BackgroundLoader(DataLoader(dataset(), batch_size=BATCH), fetch_threads=3),
    "threads_stateful": lambda: BackgroundLoader(
        StatefulDataLoader(dataset(), batch_size=BATCH), fetch_threads=3
    ),
}


class Model(L.LightningModule):  # type: ignore[misc,name-defined]
    """A one-weight model that records the items of every step."""

    def __init__(self, make: Callable[[], Any]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.make = make
        self.seen: dict[str, list[float]] = {"train": [], "val": [], "test": []}

    def step(self, stage: str, batch: Any) -> torch.Tensor:
        (x,) = batch
        self.seen[stage] += x.flatten().tolist()
        return self.layer(x).pow(2).mean()

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        return self.step("train", batch)

    def validation_step(self, batch: Any, index: int) -> None:
        self.log("val_loss", self.step("val", batch))

    def test_step(self, batch: Any, index: int) -> None:
        self.log("test_loss", self.step("test", batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        return self.make()

    def val_dataloader(self) -> Any:
        return self.make()

    def test_dataloader(self) -> Any:
        return self.make()


def trainer(root: Path, **kwargs: Any) -> Any:
    return L.Trainer(
        accelerator="cpu",
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


class TestLightningSingleProcess:
    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_fit_validate_test_with_default_checkpointing(self, stack: str, tmp_path: Path) -> None:
        """fit, validate and test run through each stack and save a checkpoint each epoch."""
        model = Model(STACKS[stack])
        run = trainer(tmp_path, max_epochs=2)
        run.fit(model)
        (metrics,) = run.validate(model, verbose=False)
        (tested,) = run.test(model, verbose=False)
        items = [float(i) for i in range(SIZE)]
        assert sorted(model.seen["train"]) == sorted(items * 2)
        assert model.seen["test"] == items
        assert set(metrics) == {"val_loss"} and set(tested) == {"test_loss"}
        checkpoint = torch.load(run.checkpoint_callback.best_model_path, weights_only=False)
        assert checkpoint["epoch"] == 1

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_checkpoint_holds_loader_state_only_when_stateful(
        self, stack: str, tmp_path: Path
    ) -> None:
        """Lightning saves a loader state for a StatefulDataLoader inside, and none otherwise."""
        run = trainer(tmp_path, max_epochs=1)
        run.fit(Model(STACKS[stack]))
        checkpoint = torch.load(run.checkpoint_callback.best_model_path, weights_only=False)
        saved = checkpoint["loops"]["fit_loop"]["state_dict"].get("combined_loader")
        if stack.endswith("stateful"):
            assert saved is not None and saved[0]["_num_yielded"] == SIZE // BATCH
        else:
            assert saved is None


# --- DDP: two spawned CPU processes -------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
class TestLightningDDP:
    def test_ranks_train_on_disjoint_shards_and_unsharded_loader_warns(
        self, tmp_path: Path
    ) -> None:
        """Under ddp_spawn the ranks' items are disjoint and cover the data; unsharded warns.

        Runs in a child Python (tests/lightning_ddp_run.py): the spawn start
        method leaves a resource-tracker process alive until its parent exits.
        """
        command = [sys.executable, "-m", "tests.lightning_ddp_run", str(tmp_path)]
        done = subprocess.run(
            command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=170
        )
        assert done.returncode == 0, done.stderr[-3000:]
        reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
        first, second = (report["items"] for report in reports)
        assert not set(first) & set(second)
        assert sorted(first + second) == [float(i) for i in range(SIZE)]
        for report in reports:
            (message,) = report["warned"]
            assert "every rank reads every item" in message and "DistributedSampler" in message
