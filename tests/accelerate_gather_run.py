"""Child process of tests/test_same_training_accelerate.py: gather_for_metrics on 2 ranks.

``torchrun --nproc_per_node=2 -m tests.accelerate_gather_run OUT SAMPLES``
evaluates two epochs of ``SAMPLES`` sample ids, batch 2 per rank, with
accelerate's prepared loader (its last batch padded to the full size), plain
and through each wrapper stack, and with a ``DistributedSampler`` of its own
(unprepared) plain and through ``fetch_threads``. Writes, per rank,
``OUT/rank<r>.json``: for each stack, per epoch, per step, the rank's batch,
accelerate's flags and what ``gather_for_metrics`` returned.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from tests.same_training import STACKS, THREAD_STACKS

BATCH = 2
EPOCHS = 2


def evaluate(accelerator: Any, loader: Any) -> list[list[dict[str, Any]]]:
    """Two epochs over ``loader``: per step, the batch, the flags and the gathered ids."""
    state = accelerator.gradient_state
    epochs = []
    for epoch in range(EPOCHS):
        if hasattr(loader, "set_epoch"):  # a DataLoader with a sampler of its own has none
            loader.set_epoch(epoch)
        steps = []
        for batch in loader:
            steps.append(
                {
                    "batch": batch.tolist(),
                    "end_of_dataloader": state.end_of_dataloader,
                    "remainder": state.remainder,
                    "gathered": accelerator.gather_for_metrics(batch).tolist(),
                }
            )
        epochs.append(steps)
    return epochs


def main(out: str, samples: int) -> None:
    from accelerate import Accelerator  # here: pytest imports this module for its doctests

    accelerator = Accelerator(cpu=True)
    data = torch.arange(samples)
    record: dict[str, Any] = {}

    def prepared() -> Any:
        return accelerator.prepare(DataLoader(data, batch_size=BATCH))

    record["plain"] = evaluate(accelerator, prepared())
    for name, wrap in STACKS.items():
        record[name] = evaluate(accelerator, wrap(prepared()))

    def own(wrap: Callable[[Any], Any]) -> Any:
        sampler = DistributedSampler(data, shuffle=False)
        return wrap(DataLoader(data, batch_size=BATCH, sampler=sampler))

    record["own_sampler"] = evaluate(accelerator, own(lambda loader: loader))
    for name, wrap in THREAD_STACKS.items():
        record[name] = evaluate(accelerator, own(wrap))
    rank = accelerator.process_index
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
