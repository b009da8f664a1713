"""Workload ``pipeline``: a DataLoader feeding a small CNN on the CPU.

A synthetic image dataset (simulated storage read, then crop / flip /
normalise with torch ops) behind ``DataLoader`` with ``num_workers`` 0 and 2
(``prefetch_factor`` 2 and 8), each used plainly, through the ``DataLoaderX``
pattern and through :class:`~prefetch.BackgroundLoader`. The training step
and the BackgroundLoader thread each use one intra-op thread; the DataLoaderX
thread keeps torch's default, as the pattern does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.baselines import DataLoaderX
from benchmarks.common import (
    Column,
    Config,
    Measure,
    Target,
    WorkloadResult,
    interleave,
    speedup_row,
    timed_epoch,
)
from benchmarks.data import SyntheticImages, small_cnn
from prefetch import BackgroundLoader

__all__ = ["LOADERS", "run"]

BATCH = 32
LOADERS: dict[str, dict[str, Any]] = {
    "workers=0": {"num_workers": 0},
    "workers=2 prefetch_factor=2": {"num_workers": 2, "prefetch_factor": 2},
    "workers=2 prefetch_factor=8": {"num_workers": 2, "prefetch_factor": 8},
}
BACKGROUND = "BackgroundLoader depth=auto (default)"
"""The wrapper as people use it: ``BackgroundLoader(loader, num_threads=1)``, default depth."""
WRAPPERS = ("plain", "DataLoaderX", BACKGROUND)
WAITED = 0.10
"""A plain loop that waits more than this share of its epoch 'waited for data'."""
NOISE = 0.05


def run(config: Config) -> WorkloadResult:
    """Time epochs of every loader and wrapper; see the module docstring."""
    batches = config.size(12, 3)
    dataset = SyntheticImages(batches * BATCH)
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = batch
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        optimizer.step()

    def variant(kwargs: dict[str, Any], wrapper: str) -> Callable[[], Measure]:
        def make() -> Any:
            if wrapper == "DataLoaderX":
                return DataLoaderX(dataset, batch_size=BATCH, **kwargs)
            loader = DataLoader(dataset, batch_size=BATCH, **kwargs)
            return BackgroundLoader(loader, num_threads=1) if wrapper == BACKGROUND else loader

        def epoch() -> Measure:
            loader = make()
            measure = timed_epoch(lambda: loader, step)
            if isinstance(loader, BackgroundLoader):
                measure["reported_wait_fraction"] = loader.stats.wait_fraction
            return measure

        return epoch

    variants = {
        f"{name} {wrapper}": variant(kwargs, wrapper)
        for name, kwargs in LOADERS.items()
        for wrapper in WRAPPERS
    }
    repeats = config.scaled_repeats(2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samples = interleave(variants, repeats, "pipeline", warmup=config.warmup)
    finally:
        torch.set_num_threads(threads)
    result = WorkloadResult(
        name="pipeline",
        title="DataLoader pipeline with a small CNN (CPU)",
        status="ok",
        description=(
            f"{batches} batches of {BATCH} images (3x112x112 crops of 128x128 uint8, "
            f"{dataset.read_seconds * 1e3:.1f} ms simulated read per image, then crop, flip "
            "and normalise with torch ops), a two-convolution CNN trained with SGD, one "
            "intra-op thread. Epoch time includes starting worker processes. Speed-up: "
            "median over repeats of the plain epoch time / this one, same DataLoader "
            "settings. 'waited' is the share of the epoch spent inside next(), measured "
            "around the loop; 'reported' is BackgroundLoader.stats.wait_fraction. "
            "BackgroundLoader runs with its default depth (depth='auto')."
        ),
        baseline="plain",
        params={"batches": batches, "batch_size": BATCH, "repeats": repeats},
        columns=[
            Column("loader", "DataLoader", "{}"),
            Column("wrapper", "wrapper", "{}"),
            Column("seconds", "epoch s", "{:.3f}"),
            Column("speedup", "speed-up", "{:.2f}x"),
            Column("wait_fraction", "waited", "{:.0%}"),
            Column("reported_wait_fraction", "reported", "{:.0%}"),
        ],
        plot="grouped",
    )
    result.notes.append(
        "With 2 worker processes on a 2-core machine the workers and the training step already "
        "keep both cores busy: a thread adds no core, so expect about 1.0x there even when the "
        "loop waits. The DataLoaderX thread runs its torch ops with torch's default intra-op "
        "thread count, competing with the step; BackgroundLoader uses num_threads=1."
    )
    for name in LOADERS:
        for wrapper in WRAPPERS:
            keys = ["seconds", "wait_fraction"]
            if wrapper == BACKGROUND:
                keys.append("reported_wait_fraction")
            key = f"{name} {wrapper}"
            row = speedup_row(samples, key, f"{name} plain", keys, loader=name, wrapper=wrapper)
            result.rows.append(row)
    rows = {row.variant: row.values for row in result.rows}
    for name in LOADERS:
        waited = float(rows[f"{name} plain"]["wait_fraction"])
        speedup = float(rows[f"{name} {BACKGROUND}"]["speedup"])
        if waited > WAITED:
            result.targets.append(
                Target(
                    f"pipeline {name}: speed-up (plain loop waited {waited:.0%})",
                    speedup > 1 + NOISE,
                    f"{speedup:.2f}x",
                )
            )
        else:
            result.targets.append(
                Target(
                    f"pipeline {name}: no slow-down (plain loop waited {waited:.0%})",
                    speedup >= 1 - NOISE,
                    f"{speedup:.2f}x",
                )
            )
    return result
