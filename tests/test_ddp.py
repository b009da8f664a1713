"""DDP through the wrappers: ranks see disjoint shards and a resumed run equals an unbroken one.

Two processes on the loopback interface (gloo on CPU), launched with
``python -m torch.distributed.run``. One uninterrupted run, one run stopped
right after a mid-epoch checkpoint, and a run resumed from that checkpoint.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from .subprocesses import ROOT, torchrun

SCRIPT = ROOT / "examples" / "ddp_train.py"
WORLD = 2
EPOCHS = 3
SIZE = 96
BATCH = 4
CHECKPOINT = (1, 5)  # after 5 batches of epoch 1
LAUNCH_TIMEOUT = 150

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"
    ),
]


def launch(out: Path, *extra: str) -> None:
    """Run the example on WORLD processes; fail with its output if it fails or hangs."""
    arguments = ["--out", str(out), "--epochs", str(EPOCHS), "--dataset-size", str(SIZE)]
    arguments += ["--batch-size", str(BATCH), *extra]
    torchrun(WORLD, [str(SCRIPT), *arguments], LAUNCH_TIMEOUT)


class Run:
    """The per-rank outputs of one launch."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
        self.weights = [
            torch.load(out / f"weights_rank{r}.pt", weights_only=True) for r in range(WORLD)
        ]

    def indices(self, rank: int, epoch: int) -> list[int]:
        """The dataset indices ``rank`` trained on in ``epoch``, in order."""
        return list(self.records[rank]["epochs"][str(epoch)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Launch the uninterrupted and the checkpointed runs side by side, then the resumed one."""
    base = tmp_path_factory.mktemp("ddp")
    epoch, step = CHECKPOINT
    partial_args = ("--checkpoint-at", f"{epoch}:{step}", "--stop-after-checkpoint")
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-torchrun") as pool:
        jobs = [
            pool.submit(launch, base / "full"),
            pool.submit(launch, base / "partial", *partial_args),
        ]
        for job in jobs:
            job.result()
    launch(base / "resumed", "--resume", str(base / "partial"))
    return {name: Run(base / name) for name in ("full", "partial", "resumed")}


def weights_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two state dicts hold bit-identical tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class TestShards:
    """DistributedSampler through CudaPrefetcher(BackgroundLoader(...)): shards and epochs."""

    @pytest.mark.timeout(LAUNCH_TIMEOUT * 3)
    def test_disjoint_shards_cover_the_dataset(self, runs: dict[str, Run]) -> None:
        """Every epoch the ranks see disjoint halves that together are the whole dataset."""
        full = runs["full"]
        for epoch in range(EPOCHS):
            shards = [full.indices(rank, epoch) for rank in range(WORLD)]
            assert all(len(shard) == SIZE // WORLD for shard in shards)
            assert not set(shards[0]) & set(shards[1])
            assert sorted(shards[0] + shards[1]) == list(range(SIZE))

    @pytest.mark.timeout(LAUNCH_TIMEOUT * 3)
    def test_set_epoch_reshuffles(self, runs: dict[str, Run]) -> None:
        """set_epoch on the wrapper reaches the sampler: each epoch has the sampler's own order."""
        full = runs["full"]
        for rank in range(WORLD):
            orders = [full.indices(rank, epoch) for epoch in range(EPOCHS)]
            assert len({tuple(order) for order in orders}) == EPOCHS
            sampler = DistributedSampler(
                range(SIZE), num_replicas=WORLD, rank=rank, shuffle=True, seed=0
            )
            for epoch, order in enumerate(orders):
                sampler.set_epoch(epoch)
                assert order == list(sampler)


class TestTraining:
    """DDP keeps the replicas identical, and a mid-epoch checkpoint resumes exactly."""

    @pytest.mark.timeout(LAUNCH_TIMEOUT * 3)
    def test_final_weights_identical_on_both_ranks(self, runs: dict[str, Run]) -> None:
        """After training, rank 0 and rank 1 hold bit-identical weights."""
        for name in ("full", "resumed"):
            assert weights_equal(runs[name].weights[0], runs[name].weights[1]), name

    @pytest.mark.timeout(LAUNCH_TIMEOUT * 3)
    def test_checkpoint_is_mid_epoch(self, runs: dict[str, Run]) -> None:
        """The interrupted run stopped exactly after the checkpointed batch."""
        epoch, step = CHECKPOINT
        partial = runs["partial"]
        for rank in range(WORLD):
            assert partial.records[rank]["stopped"] is True
            assert len(partial.indices(rank, epoch)) == step * BATCH
            assert partial.indices(rank, epoch) == runs["full"].indices(rank, epoch)[: step * BATCH]

    @pytest.mark.timeout(LAUNCH_TIMEOUT * 3)
    def test_resumed_run_matches_uninterrupted(self, runs: dict[str, Run]) -> None:
        """Stop mid-epoch and resume: same batches in the same order and bit-identical weights."""
        full, resumed = runs["full"], runs["resumed"]
        for rank in range(WORLD):
            for epoch in range(EPOCHS):
                assert resumed.indices(rank, epoch) == full.indices(rank, epoch), (rank, epoch)
            assert weights_equal(resumed.weights[rank], full.weights[rank]), rank

    @pytest.mark.timeout(LAUNCH_TIMEOUT * 3)
    def test_resume_with_dataloader_workers(
        self, runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        """With 2 DataLoader workers per rank, stop-and-resume still ends bit-identical."""
        base = tmp_path_factory.mktemp("ddp-workers")
        epoch, step = CHECKPOINT
        workers = ("--num-workers", "2")
        launch(
            base / "partial",
            *workers,
            "--checkpoint-at",
            f"{epoch}:{step}",
            "--stop-after-checkpoint",
        )
        launch(base / "resumed", *workers, "--resume", str(base / "partial"))
        resumed, full = Run(base / "resumed"), runs["full"]
        for rank in range(WORLD):
            for epoch_index in range(EPOCHS):
                assert resumed.indices(rank, epoch_index) == full.indices(rank, epoch_index)
            assert weights_equal(resumed.weights[rank], full.weights[rank]), rank


class TestDeviceChoice:
    """examples/ddp_train.py gives a rank a GPU only when every rank on its node has its own."""

    @pytest.fixture
    def choose(self, monkeypatch: pytest.MonkeyPatch) -> Any:
        """The example's choose_device, with a machine of ``gpus`` GPUs pretended."""
        import importlib.util

        spec = importlib.util.spec_from_file_location("ddp_train", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        def choose(local_rank: int, local_world: int, gpus: int) -> torch.device:
            monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
            monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
            return module.choose_device(local_rank, local_world)  # type: ignore[no-any-return]

        return choose

    @pytest.mark.parametrize(
        ("local_world", "gpus", "expected"),
        [
            (2, 0, ["cpu", "cpu"]),
            (2, 1, ["cpu", "cpu"]),  # two ranks, one GPU: both on gloo, never a shared GPU
            (2, 2, ["cuda:0", "cuda:1"]),
            (2, 8, ["cuda:0", "cuda:1"]),
        ],
    )
    def test_every_rank_of_a_node_agrees(
        self, choose: Any, local_world: int, gpus: int, expected: list[str]
    ) -> None:
        """Ranks of one node all get their own GPU or all the CPU, so they agree on the backend."""
        got = [str(choose(rank, local_world, gpus)) for rank in range(local_world)]
        assert got == expected
