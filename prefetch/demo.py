"""``python -m prefetch.demo``: a training loop, plain and with a background thread.

A ``DataLoader(num_workers=0)`` reads a synthetic dataset whose items wait on
simulated storage (a seeded, heavy-tailed sleep, which releases the GIL like
real file reads) and then do a small torch op. A small network trains on the
CPU. The same loop runs with the plain loader and wrapped in
:class:`~prefetch.BackgroundLoader`, epochs alternating, and a table compares
epoch time, the share of time the loop waited for data, and the speed-up.
It takes about 15 seconds on two cores. ``--fetch-threads N`` (or ``auto``)
adds a third loop whose batches are read by ``N`` threads, and
``--latency-ms`` makes storage slower, the case where one thread is not
enough.

The knobs it shows: ``fetch_threads`` is how many threads read the
DataLoader's batches; ``num_threads=1`` is how many cores the torch ops in
those threads may use (one, so they leave the other core to the step); the
DataLoader's ``num_workers`` would start worker processes instead.
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
    parser.add_argument(
        "--fetch-threads",
        type=fetch_threads_argument,
        default=None,
        help="also run BackgroundLoader(DataLoader(...), fetch_threads=N): N threads read "
        "the batches (an int, or auto)",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=MEAN_LATENCY * 1e3,
        help=f"mean simulated storage latency per item, ms ({MEAN_LATENCY * 1e3:g})",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batches < 1 or args.latency_ms < 0:
        parser.error("--epochs and --batches must be >= 1, --latency-ms >= 0")
    torch.set_num_threads(1)  # the step gets one core, the loading thread the other
    dataset = StorageDataset(args.batches * BATCH, mean_latency=args.latency_ms / 1e3)
    loaders: dict[str, Any] = {
        "plain": DataLoader(dataset, batch_size=BATCH, num_workers=0),
        "prefetched": BackgroundLoader(DataLoader(dataset, batch_size=BATCH), num_threads=1),
    }
    labels = {"plain": "plain DataLoader", "prefetched": "BackgroundLoader(DataLoader)"}
    if args.fetch_threads is not None:
        loaders["threads"] = BackgroundLoader(
            DataLoader(dataset, batch_size=BATCH), num_threads=1, fetch_threads=args.fetch_threads
        )
        labels["threads"] = f"fetch_threads={args.fetch_threads!r}"
    print(
        f"prefetch demo: {args.epochs} epoch{'s' if args.epochs != 1 else ''} x "
        f"{args.batches} batches of {BATCH} items.\n"
        f"Each item waits ~{args.latency_ms:.2f} ms (heavy-tailed) on simulated storage,\n"
        "then a small network trains on the batch (one CPU thread). The same loop runs\n"
        "with a plain DataLoader(num_workers=0) and with\n"
        "    BackgroundLoader(DataLoader(...), num_threads=1)\n"
        + (
            f"    BackgroundLoader(DataLoader(...), num_threads=1, "
            f"fetch_threads={args.fetch_threads!r})\n"
            if args.fetch_threads is not None
            else ""
        )
        + "alternating epochs. num_threads=1: the loading thread's torch ops use one core,\n"
        "leaving the other to the step (it is not a count of loading threads).\n",
        flush=True,
    )
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in loaders}
    models = {name: make_model() for name in runs}
    for epoch in range(1, args.epochs + 1):
        for name, loader in loaders.items():
            model, optimizer = models[name]
            with ProgressBar(args.batches, f"epoch {epoch}/{args.epochs} {name:10}") as bar:
                result = run_epoch(loader, model, optimizer, bar)
            if isinstance(loader, BackgroundLoader):
                result["waited"] = loader.stats.wait_fraction  # the loader's own account
            runs[name].append(result)
    plain_time = statistics.median(r["seconds"] for r in runs["plain"])
    rows = []
    for name, label in labels.items():
        seconds = statistics.median(r["seconds"] for r in runs[name])
        waited = statistics.median(r["waited"] for r in runs[name])
        rows.append((label, seconds, waited, plain_time / seconds))
    print("\nMedian over epochs:\n" + table(rows))
    losses = {name: f"{run[-1]['loss']:.4f}" for name, run in runs.items()}
    same = len({run[-1]["loss"] for run in runs.values()}) == 1
    wrapped = loaders["prefetched"]
    print(
        f"\nFinal loss: {', '.join(f'{name} {loss}' for name, loss in losses.items())} "
        f"({'identical' if same else 'different'}: same batches, same order).\n"
        f"BackgroundLoader, all epochs (its items are batches): "
        f"{wrapped.total_stats.summary()}.\n"
        "Prefetching hides loading only when it releases the GIL (file reads, torch ops,\n"
        "DataLoader worker processes) and a core is free. When loading a batch takes longer\n"
        "than the step, one thread cannot hide it: fetch_threads='auto' reads batches in\n"
        "several threads (try --latency-ms 1 --fetch-threads auto); the docs' guide and\n"
        "Benchmarks page have more.",
        flush=True,
    )
    return 0


def fetch_threads_argument(text: str) -> int | str:
    """Parse ``--fetch-threads``: ``auto`` or an int >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"expects 'auto' or an int >= 1, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


if __name__ == "__main__":
    sys.exit(main())
