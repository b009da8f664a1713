"""Real JPEG files and the map-style datasets the ``jpeg`` and ``cow`` workloads load.

:func:`write_jpegs` writes seeded 500x375 photographs-like JPEGs (smooth
colour fields, edges and sensor noise, quality 90) into a folder at bench
time; :class:`JpegFolder` reads one (after an optional sleep, the latency of
object storage), decodes it with PIL, resizes it to a square (224x224 unless
told otherwise) and returns a uint8 CHW tensor and a label, as an
image-classification dataset does.
:class:`NameList` is the copy-on-write demonstration: a million file names in
a Python list, each ``__getitem__`` touching one of them.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

__all__ = ["HEIGHT", "SIDE", "WIDTH", "JpegFolder", "NameList", "decode", "write_jpegs"]

WIDTH, HEIGHT = 500, 375
"""Size of the written JPEGs (the median ImageNet photograph is about this)."""
SIDE = 224
"""Side of the decoded, resized images unless a workload asks for another (``side``)."""
QUALITY = 90
CLASSES = 10


def _picture(rng: np.random.Generator) -> np.ndarray:
    """Return a HEIGHT x WIDTH x 3 uint8 picture: smooth fields, a few edges, noise."""
    ys = np.linspace(0.0, 1.0, HEIGHT)[:, None, None]
    xs = np.linspace(0.0, 1.0, WIDTH)[None, :, None]
    phase = rng.uniform(0, 2 * np.pi, size=(1, 1, 3))
    freq = rng.uniform(1.0, 6.0, size=(2, 1, 1, 3))
    field = 0.5 + 0.25 * np.sin(2 * np.pi * freq[0] * xs + phase) * np.cos(
        2 * np.pi * freq[1] * ys - phase
    )
    for _ in range(4):  # rectangles: sharp edges, as objects have
        top, left = rng.integers(0, HEIGHT - 40), rng.integers(0, WIDTH - 40)
        bottom, right = top + rng.integers(20, 160), left + rng.integers(20, 200)
        field[top:bottom, left:right] = rng.uniform(0.0, 1.0, size=3)
    noisy = field * 255.0 + rng.normal(0.0, 12.0, size=field.shape)
    picture: np.ndarray = np.clip(noisy, 0, 255).astype(np.uint8)
    return picture


def write_jpegs(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` seeded 500x375 JPEGs (quality 90) into ``folder``; return their paths.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     paths = write_jpegs(Path(folder), 2)
        ...     [Image.open(path).size for path in paths]
        [(500, 375), (500, 375)]
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(count):
        path = folder / f"img_{index:05d}.jpg"
        Image.fromarray(_picture(rng)).save(path, format="JPEG", quality=QUALITY)
        paths.append(path)
    return paths


def decode(data: bytes, side: int = SIDE) -> torch.Tensor:
    """Decode JPEG bytes with PIL, resize to ``side`` x ``side`` (bilinear), return uint8 CHW.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     data = write_jpegs(Path(folder), 1)[0].read_bytes()
        >>> decode(data).shape, decode(data, side=128).shape
        (torch.Size([3, 224, 224]), torch.Size([3, 128, 128]))
    """
    with Image.open(io.BytesIO(data)) as image:
        resized = image.convert("RGB").resize((side, side), Image.Resampling.BILINEAR)
    pixels = torch.frombuffer(bytearray(resized.tobytes()), dtype=torch.uint8)
    return pixels.view(side, side, 3).permute(2, 0, 1).contiguous()


class JpegFolder(Dataset[tuple[torch.Tensor, int]]):
    """JPEG files read, decoded and resized on each ``__getitem__``.

    Args:
        paths: The files, in index order.
        latency: Seconds each read first sleeps (storage latency; the sleep
            releases the GIL as a network read does).
        side: Side of the square each image is resized to.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     image, label = JpegFolder(write_jpegs(Path(folder), 1))[0]
        >>> image.shape, image.dtype, label
        (torch.Size([3, 224, 224]), torch.uint8, 0)
    """

    def __init__(self, paths: list[Path], latency: float = 0.0, side: int = SIDE) -> None:
        self.paths = [str(path) for path in paths]
        self.latency = latency
        self.side = side

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.latency > 0:
            time.sleep(self.latency)
        data = Path(self.paths[index]).read_bytes()
        return decode(data, self.side), index % CLASSES


class NameList(Dataset[int]):
    """A dataset holding ``count`` file names in a Python list; an item is a name's length.

    The names are a million small ``str`` objects in the process's heap.
    Reading one changes its reference count, which writes to the page it
    lives on: a forked DataLoader worker that reads names copies those pages
    (copy-on-write, pytorch/pytorch#13246); threads share them.

    Example:
        >>> names = NameList(3)
        >>> len(names), names.names[2], names[2]
        (3, 'train/n00000000/img_000000002.JPEG', 34)
    """

    def __init__(self, count: int) -> None:
        self.names = [f"train/n{index // 1300:08d}/img_{index:09d}.JPEG" for index in range(count)]

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> int:
        return len(self.names[index])
