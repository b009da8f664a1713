"""Distributed training with prefetching: DDP over a DistributedSampler, resumable mid-epoch.

The loader stack is the one the README recommends::

    CudaPrefetcher(BackgroundLoader(StatefulDataLoader(dataset, sampler=DistributedSampler(...))))

``set_epoch`` goes through both wrappers to the sampler, and the checkpoint
holds the model, the optimizer and ``loader.state_dict()`` -- the loader's
state as of the last batch this rank trained on, however far the background
thread and the device prefetcher had run ahead -- so a run stopped mid-epoch
and resumed ends with exactly the weights of an uninterrupted run.

Run on CPU (gloo) or GPUs (nccl, one per process); ``python
examples/ddp_train.py`` alone trains as one process and writes to
``runs/ddp_train``::

    torchrun --nproc_per_node=2 examples/ddp_train.py --out runs/full
    torchrun --nproc_per_node=2 examples/ddp_train.py --out runs/part \\
        --checkpoint-at 1:5 --stop-after-checkpoint
    torchrun --nproc_per_node=2 examples/ddp_train.py --out runs/resumed --resume runs/part

Each rank writes ``rank<r>.json`` (the dataset indices it trained on, per
epoch) and ``weights_rank<r>.pt`` (its final weights) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader, CudaPrefetcher


class Regression(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """A fixed synthetic regression problem; items carry their index."""

    def __init__(self, size: int, features: int = 8, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=generator)
        weight = torch.randn(features, 1, generator=generator)
        self.y = self.x @ weight + 0.1 * torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return index, self.x[index], self.y[index]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/ddp_train"),
        help="directory for per-rank outputs (default: runs/ddp_train)",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dataset-size", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--depth", type=int, default=2, help="BackgroundLoader depth")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument(
        "--checkpoint-at",
        default=None,
        help="EPOCH:STEP -- save a checkpoint after STEP batches of EPOCH (0-based epoch)",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="where checkpoints go (default: --out)"
    )
    parser.add_argument(
        "--stop-after-checkpoint", action="store_true", help="exit right after the checkpoint"
    )
    parser.add_argument("--resume", type=Path, default=None, help="checkpoint directory to resume")
    return parser.parse_args(argv)


def choose_device(local_rank: int, local_world: int) -> torch.device:
    """This rank's device: its own GPU when every rank on this node has one, else the CPU.

    Ranks on a node see the same GPUs, and rank ``LOCAL_RANK`` takes GPU
    ``LOCAL_RANK``; two ranks never share one. The test is per node
    (``LOCAL_WORLD_SIZE``, not ``WORLD_SIZE``), so it holds for several
    nodes; all ranks of a node decide alike, so they agree on the backend
    (nodes are assumed to be alike). A launcher that shows each rank a single
    GPU should set ``LOCAL_RANK=0`` for it, or pass the device explicitly.
    """
    if torch.cuda.is_available() and local_rank < local_world <= torch.cuda.device_count():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def setup() -> tuple[int, int, torch.device]:
    """Join the process group (nccl with one GPU per process, else gloo)."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = choose_device(local_rank, local_world)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the process group and the prefetcher
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    return rank, world, device


def single_process_defaults() -> None:
    """Started with plain ``python`` (no torchrun): run as a group of one on this machine."""
    if "MASTER_ADDR" in os.environ:
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def checkpoint_path(directory: Path, rank: int) -> Path:
    return directory / f"checkpoint_rank{rank}.pt"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    single_process_defaults()
    rank, world, device = setup()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)

    dataset = Regression(args.dataset_size, seed=args.seed)
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    data = StatefulDataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers
    )
    loader = CudaPrefetcher(
        BackgroundLoader(data, depth=args.depth, pin_memory=device.type == "cuda"),
        device=device,  # "cpu" too: the model is there, whatever the machine has
    )

    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    log: dict[str, list[int]] = {}
    start_epoch, start_step = 0, 0
    if rank == 0:
        backend = dist.get_backend()
        print(f"{world} rank(s), {backend} on {device}; outputs in {args.out}", flush=True)
    if args.resume is not None:
        checkpoint = torch.load(checkpoint_path(args.resume, rank), weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])
        log = checkpoint["log"]
        start_epoch, start_step = checkpoint["epoch"], checkpoint["step"]
        if rank == 0:
            print(f"resumed from {args.resume} at epoch {start_epoch}, step {start_step}")
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )

    stop_at = None
    if args.checkpoint_at:
        epoch_text, step_text = args.checkpoint_at.split(":")
        stop_at = (int(epoch_text), int(step_text))
    checkpoint_dir = args.checkpoint_dir or args.out

    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # through both wrappers to the DistributedSampler
        seen = log.setdefault(str(epoch), [])
        step = start_step if epoch == start_epoch else 0
        total, batches = torch.zeros((), device=device), 0  # summed on the device: one sync
        for indices, x, y in loader:
            loss = nn.functional.mse_loss(ddp(x), y)
            total += loss.detach()
            batches += 1
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen.extend(indices.tolist())  # one device-to-host copy, not one per index
            step += 1
            if stop_at == (epoch, step):
                checkpoint_dir.mkdir(parents=True, exist_ok=True)
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "loader": loader.state_dict(),  # as of this batch, not the prefetched ones
                        "log": log,
                        "epoch": epoch,
                        "step": step,
                    },
                    checkpoint_path(checkpoint_dir, rank),
                )
                if rank == 0:
                    print(f"checkpoint at epoch {epoch}, step {step} in {checkpoint_dir}")
                if args.stop_after_checkpoint:
                    loader.close()
                    write_outputs(args.out, rank, world, log, model, stopped=True)
                    dist.barrier()
                    dist.destroy_process_group()
                    return 0
        if rank == 0 and batches:
            mean = total.item() / batches
            print(f"epoch {epoch}: mean loss {mean:.5f} over this rank's {batches} batches")

    loader.close()
    write_outputs(args.out, rank, world, log, model, stopped=False)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def write_outputs(
    out: Path, rank: int, world: int, log: dict[str, list[int]], model: nn.Module, stopped: bool
) -> None:
    """Write this rank's indices per epoch and its final weights."""
    record: dict[str, Any] = {"rank": rank, "world_size": world, "epochs": log, "stopped": stopped}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    weights = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save(weights, out / f"weights_rank{rank}.pt")


if __name__ == "__main__":
    sys.exit(main())
