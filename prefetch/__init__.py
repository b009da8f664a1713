"""Keep the GPU fed: background-thread and device-stream prefetching for PyTorch loaders.

Wrap an existing loader in one line::

    loader = CudaPrefetcher(BackgroundLoader(DataLoader(...)))

and the training loop, ``len(loader)`` and ``loader.set_epoch(e)`` keep working.
"""

from prefetch._device.iterator import DeviceIterator
from prefetch._device.normalize import Normalize
from prefetch._device.prefetcher import CudaPrefetcher
from prefetch._shared.facts import LoaderFacts
from prefetch._shared.stateful import NotStatefulError, Stateful
from prefetch._shared.stats import DepthEvent, LoaderStats, ThreadEvent
from prefetch._shared.totals import TotalStats
from prefetch._threads.allocator import return_freed_memory
from prefetch._threads.fetch_info import FetchInfo, fetch_info, sample_seed
from prefetch._threads.fetch_options import BackgroundSettings
from prefetch._threads.iterator import BackgroundIterator
from prefetch._threads.loader import BackgroundLoader
from prefetch._threads.timeout import LoaderTimeoutError
from prefetch._torch.workaround import TorchWorkaroundWarning

__version__ = "0.5.0"

__all__ = [
    "BackgroundIterator",
    "BackgroundLoader",
    "BackgroundSettings",
    "CudaPrefetcher",
    "DepthEvent",
    "DeviceIterator",
    "FetchInfo",
    "LoaderFacts",
    "LoaderStats",
    "LoaderTimeoutError",
    "Normalize",
    "NotStatefulError",
    "Stateful",
    "ThreadEvent",
    "TorchWorkaroundWarning",
    "TotalStats",
    "fetch_info",
    "return_freed_memory",
    "sample_seed",
]
