"""The variants of the ``jpeg`` workload: settings, loaders, concurrency, availability.

A :class:`Variant` is one loader at one concurrency in one setting;
:func:`plan` lists a run's variants and :func:`available` says why a method
cannot run here (``fetch_threads`` not in this ``BackgroundLoader``, an
optional package of the ``bench`` extra not installed), so that the table
reports it as not available instead of failing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect

from benchmarks.common import Config
from benchmarks.parallel_child import LEARNED
from prefetch import BackgroundLoader

__all__ = [
    "BATCH",
    "FULL",
    "LABELS",
    "LATENCY",
    "NOISE",
    "QUICK",
    "QUICK_BATCH",
    "SETTINGS",
    "Variant",
    "available",
    "plan",
]

LATENCY = 0.020
"""Seconds each read sleeps in the ``latency`` setting."""
SETTINGS = {"local": 0.0, "latency": LATENCY}
BATCH = 64
"""Images per batch: what people train with (a quick run uses :data:`QUICK_BATCH`)."""
QUICK_BATCH = 8
NOISE = 0.05
"""'Within noise' for the equal-concurrency comparisons: a ratio >= 1 - NOISE passes."""
LABELS = {
    "dataloader": "DataLoader num_workers={}",
    "threads": "BackgroundLoader fetch_threads={}",
    "parallel_mapper": "ParallelMapper(thread) x{}",
    "spdl": "SPDL pipeline x{}",
}
AUTOS = ("auto", LEARNED)
"""The levels of ``fetch_threads="auto"``: its first epoch, and its second."""
Levels = tuple[int | str, ...]
"""Concurrency levels of one method: worker or thread counts, or one of :data:`AUTOS`."""
FULL: dict[str, Levels] = {
    "dataloader": (0, 2, 16),
    "threads": (2, 16, "auto", LEARNED),
    "parallel_mapper": (2, 16),
    "spdl": (2, 16),
}
QUICK: dict[str, Levels] = {
    "dataloader": (0, 2),
    "threads": (2, "auto"),
    "parallel_mapper": (2,),
    "spdl": (2,),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One loader at one concurrency in one setting."""

    setting: str
    method: str
    concurrency: int | str

    @property
    def label(self) -> str:
        """The loader, as the table names it."""
        return LABELS[self.method].format(self.concurrency)

    @property
    def name(self) -> str:
        """The row's name: setting and label."""
        return f"{self.setting}: {self.label}"


def available(method: str) -> str:
    """Return why ``method`` cannot run here, or ``""`` when it can."""
    if method == "threads":
        if "fetch_threads" not in inspect.signature(BackgroundLoader).parameters:
            return "not available: this BackgroundLoader has no fetch_threads argument"
    elif method in ("parallel_mapper", "sample_mapper"):
        if importlib.util.find_spec("torchdata") is None:
            return "not available: torchdata is not installed"
    elif method == "spdl" and importlib.util.find_spec("spdl") is None:
        return 'not available: spdl-core is not installed (pip install -e ".[bench]")'
    return ""


def plan(config: Config) -> list[Variant]:
    """Return every variant of this run (fewer in quick mode), setting by setting."""
    table = QUICK if config.quick else FULL
    return [
        Variant(setting, method, concurrency)
        for setting in SETTINGS
        for method, levels in table.items()
        for concurrency in levels
    ]
