"""prefetch.lightning.LoaderStatsMonitor with the real Lightning on CPU (issue 24).

A logger that keeps every ``log_metrics`` call stands in for TensorBoard; the
logged values must equal the loaders' own ``stats`` and ``total_stats``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._shared.advice import Figures

from .subprocesses import ROOT, subprocess_env

L = pytest.importorskip("lightning")
from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: E402
from lightning.pytorch.loggers.logger import Logger  # noqa: E402

from prefetch.lightning import LoaderStatsMonitor  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*litlogger.*|.*litmodels.*"),
]

SIZE = 8
BATCH = 2
EPOCHS = 2


class DictLogger(Logger):  # type: ignore[misc]
    """Keeps every ``(step, metrics)`` Lightning logs, as TensorBoard would write them."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "dict"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def ours(self, part: str) -> list[dict[str, float]]:
        """The metrics of each call whose names contain ``part`` (the monitor's), in order."""
        return [metrics for _, metrics in self.logged if any(part in name for name in metrics)]


def data() -> TensorDataset:
    return TensorDataset(torch.arange(float(SIZE)).unsqueeze(1))


class Model(L.LightningModule):  # type: ignore[misc,name-defined]
    """One weight; keeps the loaders it made so the test can read their stats."""

    def __init__(self, val_loaders: int = 1) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.val_loaders = val_loaders
        self.made: dict[str, Any] = {}

    def step(self, batch: Any) -> torch.Tensor:
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        return self.step(batch)

    def validation_step(self, batch: Any, index: int, dataloader_idx: int = 0) -> None:
        self.step(batch)

    def test_step(self, batch: Any, index: int) -> None:
        self.step(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        self.made["train"] = CudaPrefetcher(BackgroundLoader(DataLoader(data(), batch_size=BATCH)))
        return self.made["train"]

    def val_dataloader(self) -> Any:
        loaders = [BackgroundLoader(DataLoader(data(), batch_size=BATCH))]
        loaders += [DataLoader(data(), batch_size=BATCH)] * (self.val_loaders - 1)
        self.made["val"] = loaders
        return loaders[0] if self.val_loaders == 1 else loaders

    def test_dataloader(self) -> Any:
        self.made["test"] = BackgroundLoader(DataLoader(data(), batch_size=BATCH))
        return self.made["test"]


def trainer(root: Path, logger: Any, monitor: Any, **kwargs: Any) -> Any:
    return L.Trainer(
        accelerator="cpu",
        max_epochs=EPOCHS,
        default_root_dir=str(root),
        logger=logger,
        callbacks=[monitor],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        **kwargs,
    )


def expected(wrapper: Any, base: str) -> dict[str, float]:
    """What the monitor logs for one wrapper: its epoch's and its totals' scalars."""
    return {**wrapper.stats.scalars(base), **wrapper.total_stats.scalars(f"{base}total/")}


GROWING = ("source_seconds", "loading_cpu_seconds", "loading_core_wait_seconds")
"""Figures of the loading thread, which may still move after the monitor logged."""


def assert_logged(logged: dict[str, float], want: dict[str, float]) -> None:
    """``logged`` equals ``want``, but the loading thread's times, which may grow after the log.

    Lightning stops at ``len(loader)`` without asking for the end of the data, so
    the loading thread may still be timing its last draw (the one that finds the
    end) when the monitor logs: seen on free-threaded 3.13t.
    """
    assert logged.keys() == want.keys()
    for key, value in want.items():
        if key.endswith(GROWING):
            assert logged[key] <= value, key
        else:
            assert logged[key] == value, key


class TestLoaderStatsMonitor:
    """The callback logs every wrapper's epoch and total stats, equal to the loaders' own."""

    def test_fit_logs_each_layer_equal_to_the_loaders_stats(self, tmp_path: Path) -> None:
        """After fit, the last train and val logs equal each layer's stats and totals."""
        logger, model = DictLogger(), Model()
        trainer(tmp_path, logger, LoaderStatsMonitor()).fit(model)
        train = logger.ours("prefetch/train/")
        assert len(train) == EPOCHS
        outer = model.made["train"]
        want = {
            **expected(outer, "prefetch/train/CudaPrefetcher/"),
            **expected(outer.loader, "prefetch/train/BackgroundLoader/"),
        }
        assert_logged(train[-1], want)
        assert want["prefetch/train/BackgroundLoader/total/epochs"] == EPOCHS
        assert want["prefetch/train/CudaPrefetcher/total/items"] == EPOCHS * SIZE / BATCH
        val = logger.ours("prefetch/val/")
        assert len(val) == EPOCHS  # not after the sanity check
        (loader,) = model.made["val"]
        assert_logged(val[-1], expected(loader, "prefetch/val/BackgroundLoader/"))
        assert val[-1]["prefetch/val/BackgroundLoader/total/epochs"] == EPOCHS + 1  # sanity run

    def test_the_figures_the_summary_reads_are_logged(self, tmp_path: Path) -> None:
        """Each number summary()'s advice reads is logged, for the epoch and the totals."""
        logger, model = DictLogger(), Model()
        trainer(tmp_path, logger, LoaderStatsMonitor(), limit_val_batches=0).fit(model)
        numbers = [
            name
            for name, value in vars(Figures).items()
            if isinstance(value, property) and name not in ("facts", "parallel_fetch_available")
        ]
        assert {"loading_cpu_seconds", "loop_core_wait_seconds", "wait_seconds"} <= set(numbers)
        logged = logger.ours("prefetch/train/")[-1]
        base = "prefetch/train/BackgroundLoader/"
        for name in numbers:
            assert f"{base}{name}" in logged and f"{base}total/{name}" in logged, name
        stats = model.made["train"].loader.stats
        assert logged[f"{base}end_wait_seconds"] == stats.end_wait_seconds
        assert logged[f"{base}wait_seconds"] <= logged[f"{base}elapsed_seconds"]

    def test_test_stage_prefix_and_epoch_only(self, tmp_path: Path) -> None:
        """trainer.test logs the test loader under the prefix given; total=False: epoch only."""
        logger, model = DictLogger(), Model()
        trainer(tmp_path, logger, LoaderStatsMonitor(prefix="data/", total=False)).test(model)
        (logged,) = logger.ours("data/test/")
        assert_logged(logged, model.made["test"].stats.scalars("data/test/BackgroundLoader/"))
        assert logged["data/test/BackgroundLoader/items"] == SIZE / BATCH

    def test_several_loaders_are_named_by_index_and_plain_ones_skipped(
        self, tmp_path: Path
    ) -> None:
        """Two val loaders: the wrapper's names carry its index; the bare DataLoader logs none."""
        logger, model = DictLogger(), Model(val_loaders=2)
        trainer(tmp_path, logger, LoaderStatsMonitor(), limit_train_batches=1).fit(model)
        names = set(logger.ours("prefetch/val/")[-1])
        assert "prefetch/val/0/BackgroundLoader/wait_fraction" in names
        assert not any(name.startswith("prefetch/val/1/") for name in names)

    def test_a_stage_without_wrappers_warns_once(self, tmp_path: Path) -> None:
        """Plain DataLoaders only: nothing logged, and one warning that says why."""
        model = Model()
        model.test_dataloader = lambda: DataLoader(data(), batch_size=BATCH)  # type: ignore[method-assign]
        logger = DictLogger()
        with pytest.warns(UserWarning, match="the test loaders hold no prefetch wrapper") as caught:
            trainer(tmp_path, logger, LoaderStatsMonitor()).test(model)
        assert len([w for w in caught if "prefetch wrapper" in str(w.message)]) == 1
        assert logger.ours("prefetch/") == []

    def test_no_logger_is_refused_at_setup(self, tmp_path: Path) -> None:
        """logger=False: the trainer refuses to start, saying a logger is needed."""
        run = trainer(tmp_path, False, LoaderStatsMonitor())
        with pytest.raises(MisconfigurationException, match="needs a logger"):
            run.test(Model())

    def test_arguments_are_checked(self) -> None:
        """A prefix that is not a str, or nothing to log, is refused at construction."""
        with pytest.raises(TypeError, match=r"prefix=\.\.\.\) expects a str, got 1"):
            LoaderStatsMonitor(prefix=1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="would log nothing"):
            LoaderStatsMonitor(epoch=False, total=False)


class TestOptionalImports:
    """import prefetch imports neither Lightning nor accelerate."""

    @pytest.mark.timeout(60)
    def test_importing_the_package_and_running_an_epoch_imports_no_framework(self) -> None:
        """A fresh interpreter: after import prefetch and an epoch, neither is in sys.modules."""
        code = (
            "import sys\n"
            "from torch.utils.data import DataLoader\n"
            "import prefetch\n"
            "list(prefetch.BackgroundLoader(DataLoader(list(range(4)))))\n"
            "print(sorted({'lightning', 'pytorch_lightning', 'accelerate'} & set(sys.modules)))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=50,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "[]"
