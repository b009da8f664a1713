"""Lightning DDP on two CPU processes with a wrapped loader, each rank on its own shard."""

import tempfile

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from prefetch import BackgroundLoader


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, index):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def on_train_start(self):
        print(f"rank {self.global_rank}: {self.trainer.num_training_batches} batches per epoch")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = TensorDataset(torch.randn(64, 1))
        # Lightning cannot add its DistributedSampler to a wrapped DataLoader: add it here.
        sampler = DistributedSampler(data, shuffle=True) if dist.is_initialized() else None
        return BackgroundLoader(DataLoader(data, batch_size=8, sampler=sampler))


if __name__ == "__main__":
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp_spawn",
        devices=2,
        max_epochs=2,
        default_root_dir=tempfile.mkdtemp(),
        logger=False,
        enable_progress_bar=False,
    )
    trainer.fit(Model())  # prints 4 batches per epoch on each rank: half of the 8 without DDP
