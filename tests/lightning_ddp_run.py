"""Child process of tests/test_lightning.py: Lightning ``ddp_spawn`` on two CPU ranks.

``python -m tests.lightning_ddp_run OUT`` trains one epoch with the documented
recipe (a ``DistributedSampler`` built in ``train_dataloader``) and writes, per
rank, ``OUT/rank<r>.json``: the items it trained on, and the warnings an
unsharded wrapped ``DataLoader`` gave on that rank.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from prefetch import BackgroundLoader
from tests.test_lightning import BATCH, Model, dataset, trainer


def sharded_loader() -> Any:
    """The documented recipe: a DistributedSampler when torch.distributed runs."""
    data = dataset()
    sampler = DistributedSampler(data, shuffle=True) if dist.is_initialized() else None
    return BackgroundLoader(DataLoader(data, batch_size=BATCH, sampler=sampler))


class SpawnedModel(Model):
    """Writes, per rank, the items it trained on and whether an unsharded loader warned."""

    def __init__(self, out: str) -> None:
        super().__init__(sharded_loader)
        self.out = out

    def on_train_end(self) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(BackgroundLoader(DataLoader(dataset(), batch_size=BATCH)))
        report = {
            "items": self.seen["train"],
            "warned": [str(w.message) for w in caught if w.category is UserWarning],
        }
        Path(self.out, f"rank{self.global_rank}.json").write_text(json.dumps(report))


def main(out: str) -> None:
    run = trainer(Path(out), max_epochs=1, strategy="ddp_spawn", devices=2)
    run.fit(SpawnedModel(out))


if __name__ == "__main__":
    main(sys.argv[1])
