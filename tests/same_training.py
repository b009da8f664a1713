"""Helpers of the same-training tests (issue 33): the wrapper stacks and a readable diff.

Each ``tests/test_same_training_*.py`` records, step by step, what a
framework sees with the plain loader and through each stack below, and
asserts the two records are equal. :func:`assert_same_steps` names the first
step that differs, so a failure says where and how.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from prefetch import BackgroundLoader, CudaPrefetcher

Wrap = Callable[[Any], Any]

STACKS: dict[str, Wrap] = {
    "background": BackgroundLoader,
    "background_depth4": lambda loader: BackgroundLoader(loader, depth=4),
    "cuda_over_background": lambda loader: CudaPrefetcher(BackgroundLoader(loader)),
}
"""The wrapper stacks every loader allows (``fetch_threads`` needs a map-style DataLoader)."""

THREAD_STACKS: dict[str, Wrap] = {
    "fetch_threads": lambda loader: BackgroundLoader(loader, fetch_threads=2),
    "cuda_over_fetch_threads": lambda loader: CudaPrefetcher(
        BackgroundLoader(loader, fetch_threads=2)
    ),
}
"""The ``fetch_threads`` stacks, for a map-style ``DataLoader`` with ``num_workers=0``."""

TIMING_KEYS = ("runtime", "per_second")
"""Parts of a logged name that measure time (Trainer's ``*_runtime``, ``*_per_second``)."""


def untimed(logs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``logs`` without the figures that measure time, which differ between any two runs."""
    return [
        {key: value for key, value in entry.items() if not any(t in key for t in TIMING_KEYS)}
        for entry in logs
    ]


def first_difference(
    plain: Sequence[Any], wrapped: Sequence[Any], names: tuple[str, str] = ("plain", "wrapped")
) -> str | None:
    """Describe the first step where two records differ, or ``None`` when they are equal."""
    first, second = names
    for step, (expected, got) in enumerate(zip(plain, wrapped, strict=False)):
        if expected != got:
            return f"step {step}: {first} {expected!r}, {second} {got!r}"
    if len(plain) != len(wrapped):
        return f"{first} has {len(plain)} steps, {second} {len(wrapped)}"
    return None


def assert_same_steps(
    plain: Sequence[Any],
    wrapped: Sequence[Any],
    what: str = "",
    names: tuple[str, str] = ("plain", "wrapped"),
) -> None:
    """Assert the two records are equal, naming the first step that differs if not."""
    difference = first_difference(plain, wrapped, names)
    assert difference is None, f"{what}: differs at {difference}"
