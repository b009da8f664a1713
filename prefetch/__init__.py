"""Keep the GPU fed: background-thread and device-stream prefetching for PyTorch loaders.

Wrap an existing loader in one line::

    loader = CudaPrefetcher(BackgroundLoader(DataLoader(...)))

and the training loop, ``len(loader)`` and ``loader.set_epoch(e)`` keep working.
"""

from prefetch._background import BackgroundLoader
from prefetch._background_iterator import BackgroundIterator
from prefetch._cuda_prefetcher import CudaPrefetcher
from prefetch._device_iterator import DeviceIterator
from prefetch._normalize import Normalize
from prefetch._stateful import NotStatefulError, Stateful
from prefetch._stats import DepthEvent, LoaderStats, ThreadEvent

__version__ = "0.3.0"

__all__ = [
    "BackgroundIterator",
    "BackgroundLoader",
    "CudaPrefetcher",
    "DepthEvent",
    "DeviceIterator",
    "LoaderStats",
    "Normalize",
    "NotStatefulError",
    "Stateful",
    "ThreadEvent",
]
