"""``python -m prefetch.demo``: a training loop, plain and with a background thread.

A ``DataLoader(num_workers=0)`` reads a synthetic dataset whose items wait on
simulated storage (a seeded, heavy-tailed sleep, which releases the GIL like
real file reads) and then do a small torch op. A small network trains on the
CPU. The same loop runs with the plain loader and wrapped in
:class:`~prefetch.BackgroundLoader`, epochs alternating, and a table compares
epoch time, the share of time the loop waited for data, and the speed-up.
It takes about 15 seconds on two cores.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader
from prefetch._shared.progress import ProgressBar

__all__ = ["StorageDataset", "main", "run_epoch"]

FEATURES = 1024
CLASSES = 10
BATCH = 32
MEAN_LATENCY = 0.00012
"""Mean simulated storage latency per item, in seconds."""


class StorageDataset(Dataset[tuple[torch.Tensor, int]]):
    """Items that wait on simulated storage, then decode with a small torch op.

    Args:
        length: Number of items.
        mean_latency: Mean of the seeded log-normal read latency, in seconds.
        seed: Seed for the latencies and the stored data.
    """

    def __init__(self, length: int, mean_latency: float = MEAN_LATENCY, seed: int = 0) -> None:
        rng = random.Random(seed)
        raw = [rng.lognormvariate(0.0, 1.0) for _ in range(length)]
        scale = mean_latency * length / sum(raw) if length else 0.0
        self.latencies = [value * scale for value in raw]
        generator = torch.Generator().manual_seed(seed)
        self.stored = torch.randint(0, 256, (64, FEATURES), dtype=torch.uint8, generator=generator)

    def __len__(self) -> int:
        return len(self.latencies)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latencies[index])  # the "read": releases the GIL
        features = self.stored[index % len(self.stored)].float().div_(255.0)  # the "decode"
        return features, index % CLASSES


def make_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    """Return a small, seeded network and its optimizer."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, 1536),
        nn.ReLU(),
        nn.Linear(1536, 512),
        nn.ReLU(),
        nn.Linear(512, CLASSES),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def run_epoch(
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    bar: ProgressBar,
) -> dict[str, float]:
    """Train one epoch; return its time, the time spent waiting in ``next()`` and the loss."""
    clock = time.perf_counter
    started = clock()
    waited = 0.0
    loss = torch.zeros(())
    iterator = iter(loader)
    while True:
        before = clock()
        try:
            features, labels = next(iterator)
        except StopIteration:
            waited += clock() - before
            break
        waited += clock() - before
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        optimizer.step()
        bar.update(note=f"loss {loss.item():.3f}")
    seconds = clock() - started
    return {"seconds": seconds, "waited": waited / seconds, "loss": float(loss.item())}


def table(rows: Sequence[tuple[str, float, float, float]]) -> str:
    """Format ``(name, epoch seconds, wait share, speed-up)`` rows as a text table."""
    lines = [
        f"{'':30}{'epoch time':>12}{'waited for data':>18}{'speed-up':>11}",
        f"{'':30}{'-' * 10:>12}{'-' * 15:>18}{'-' * 8:>11}",
    ]
    for name, seconds, waited, speedup in rows:
        lines.append(f"{name:30}{seconds:>10.2f} s{waited:>18.0%}{speedup:>10.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demonstration and print the comparison."""
    parser = argparse.ArgumentParser(
        prog="python -m prefetch.demo",
        description=(
            "Train a small network on simulated slow storage twice, with a plain "
            "DataLoader and with BackgroundLoader(DataLoader), epochs alternating, "
            "and compare epoch times and the time the loop waited for data."
        ),
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs per loop (3)")
    parser.add_argument("--batches", type=int, default=80, help="batches per epoch (80)")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batches < 1:
        parser.error("--epochs and --batches must be >= 1")
    torch.set_num_threads(1)  # the step gets one core, the loading thread the other
    dataset = StorageDataset(args.batches * BATCH)
    plain: Any = DataLoader(dataset, batch_size=BATCH, num_workers=0)
    wrapped = BackgroundLoader(DataLoader(dataset, batch_size=BATCH, num_workers=0), num_threads=1)
    print(
        f"prefetch demo: {args.epochs} epoch{'s' if args.epochs != 1 else ''} x "
        f"{args.batches} batches of {BATCH} items.\n"
        f"Each item waits ~{MEAN_LATENCY * 1e3:.2f} ms (heavy-tailed) on simulated storage,\n"
        "then a small network trains on the batch (one CPU thread). The same loop runs\n"
        "with a plain DataLoader(num_workers=0) and with\n"
        "    BackgroundLoader(DataLoader(...), num_threads=1)\n"
        "alternating epochs.\n",
        flush=True,
    )
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "prefetched": []}
    models = {name: make_model() for name in runs}
    for epoch in range(1, args.epochs + 1):
        for name, loader in (("plain", plain), ("prefetched", wrapped)):
            model, optimizer = models[name]
            with ProgressBar(args.batches, f"epoch {epoch}/{args.epochs} {name:10}") as bar:
                result = run_epoch(loader, model, optimizer, bar)
            if name == "prefetched":
                result["waited"] = wrapped.stats.wait_fraction  # the loader's own account
            runs[name].append(result)
    plain_time = statistics.median(r["seconds"] for r in runs["plain"])
    rows = []
    for name, label in (
        ("plain", "plain DataLoader"),
        ("prefetched", "BackgroundLoader(DataLoader)"),
    ):
        seconds = statistics.median(r["seconds"] for r in runs[name])
        waited = statistics.median(r["waited"] for r in runs[name])
        rows.append((label, seconds, waited, plain_time / seconds))
    print("\nMedian over epochs:\n" + table(rows))
    same = runs["plain"][-1]["loss"] == runs["prefetched"][-1]["loss"]
    print(
        f"\nFinal loss: plain {runs['plain'][-1]['loss']:.4f}, prefetched "
        f"{runs['prefetched'][-1]['loss']:.4f} ({'identical' if same else 'different'}: "
        "same batches, same order).\n"
        f"Its last epoch (the loader's items are batches here): {wrapped.stats.summary()}.\n"
        "Prefetching hides loading only when it releases the GIL (file reads, torch ops,\n"
        "DataLoader worker processes) and a core is free; the docs' Benchmarks page has more.",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
