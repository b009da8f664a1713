"""The torch profiler, as the hot paths see it: one cheap check and a named span.

``torch.profiler`` shows ``prefetch.fetch`` (the producer inside the source)
and ``prefetch.wait`` (the loop waiting for an item) when it records. Entering
``record_function`` costs microseconds even when nothing records, so the hot
paths ask :func:`profiling` first (:mod:`prefetch._torch.profiler`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from torch.autograd import profiler

from prefetch._torch.profiler import recording


def profiling() -> bool:
    """Return whether a torch profiler is recording now.

    Example:
        >>> profiling()
        False
    """
    return recording()


def span(name: str) -> AbstractContextManager[Any]:
    """Return a profiler span named ``name`` (enter it only while :func:`profiling`)."""
    return profiler.record_function(name)
