"""Synthetic image data and a small CNN, shared by the pipeline and GPU workloads."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset

__all__ = ["MEAN", "STD", "SyntheticImages", "small_cnn"]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
POOL = 16


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """Seeded uint8 images with a simulated read, decode and augment per item.

    ``__getitem__`` sleeps ``read_seconds`` (storage latency, GIL released),
    then "decodes" and augments with torch ops: crop, optional flip, and
    conversion to normalised float32 (or, with ``as_uint8``, the uint8 crop,
    for a pipeline that normalises on the GPU).

    Args:
        length: Number of items.
        size: Side of the stored square images.
        crop: Side of the returned crops.
        read_seconds: Simulated storage latency per item.
        as_uint8: Return uint8 crops instead of normalised floats.
    """

    def __init__(
        self,
        length: int,
        size: int = 128,
        crop: int = 112,
        read_seconds: float = 0.0005,
        as_uint8: bool = False,
    ) -> None:
        generator = torch.Generator().manual_seed(0)
        self.pool = torch.randint(
            0, 256, (POOL, 3, size, size), dtype=torch.uint8, generator=generator
        )
        self.length = length
        self.size = size
        self.crop = crop
        self.read_seconds = read_seconds
        self.as_uint8 = as_uint8
        self.mean = torch.tensor(MEAN).view(3, 1, 1) * 255
        self.std = torch.tensor(STD).view(3, 1, 1) * 255

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.read_seconds > 0:
            time.sleep(self.read_seconds)
        image = self.pool[index % POOL]
        offset = (index * 7) % (self.size - self.crop + 1)
        patch = image[:, offset : offset + self.crop, offset : offset + self.crop]
        if index % 2:
            patch = patch.flip(-1)
        if self.as_uint8:
            return patch.contiguous(), index % 10
        return (patch.float() - self.mean) / self.std, index % 10


def small_cnn(classes: int = 10) -> nn.Module:
    """Return a two-convolution network, seeded, for a short training step."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )
