"""What parallel fetch needs of torch's single-process DataLoader iterator.

``BackgroundLoader(fetch_threads=...)`` splits a ``DataLoader``'s ``next()``
(:mod:`prefetch._threads.parallel_fetch`): the iterator's own ``next()``
draws the indices, with its ``_dataset_fetcher`` swapped for one that
returns them, and threads read the samples. It numbers each batch as the
iterator does (``_num_yielded``), seeds the samples from the iterator's
``_base_seed``, pins as the iterator would (``_pin_memory``,
``_pin_memory_device``, torch's ``pin_memory``), and refuses a DataLoader
subclass that overrides ``__iter__`` or ``_get_iterator``.

This is not a workaround that can be left off: without these names parallel
fetch cannot work. While they are missing (torch changed them), or
``PREFETCH_TORCH_WORKAROUNDS=0``, :func:`refusal` says why and
``BackgroundLoader(fetch_threads=...)`` raises it; nothing is warned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from prefetch._torch.workaround import (
    SWITCHED_OFF,
    Workaround,
    callable_at,
    resolve,
    set_by_init,
    torch_version,
)

_ITER = "torch.utils.data.dataloader"
_PIN = "torch.utils.data._utils.pin_memory"
PARALLEL_FETCH = Workaround(
    "parallel fetch",
    "torch's DataLoader has no public way to draw a batch's indices without reading them",
    ("2.6.0", "2.12.0", "2.13.0", "2.15.0"),
    "BackgroundLoader(fetch_threads=...) refuses to start",
    [
        set_by_init(_ITER, "_SingleProcessDataLoaderIter", ["_dataset_fetcher"]),
        set_by_init(
            _ITER,
            "_BaseDataLoaderIter",
            ["_num_yielded", "_base_seed", "_pin_memory", "_pin_memory_device"],
        ),
        callable_at(_ITER, "DataLoader._get_iterator"),
        callable_at(_PIN, "pin_memory"),
    ],
    required=True,
)


def refusal(what: str) -> str | None:
    """Why ``what`` (``"BackgroundLoader(fetch_threads=...)"``) cannot run now, else ``None``."""
    problem = PARALLEL_FETCH.problem()
    if problem is None:
        return None
    why = problem
    if not SWITCHED_OFF:
        checked = ", ".join(PARALLEL_FETCH.checked_on)
        why = f"torch {torch_version()} changed them ({problem}; checked on torch {checked})"
    return (
        f"{what} needs the internals of torch's DataLoader iterator (it swaps the iterator's "
        f"dataset fetcher to read batches in threads), and {why}. Leave fetch_threads "
        "unset: one thread then overlaps the DataLoader's loading with your loop"
    )


def own_iteration(kind: type) -> str | None:
    """Name the iteration method DataLoader class ``kind`` overrides, else ``None``.

    Torch's ``DataLoader`` and torchdata's ``StatefulDataLoader`` iterate as
    parallel fetch expects; a subclass that overrides ``__iter__`` or
    ``_get_iterator`` (accelerate's prepared loaders) does not.
    """
    bases: list[type] = [resolve(_ITER, "DataLoader")]
    with contextlib.suppress(ImportError):
        from torchdata.stateful_dataloader import StatefulDataLoader

        bases.append(StatefulDataLoader)
    for name in ("__iter__", "_get_iterator"):
        if not any(getattr(kind, name, None) is getattr(base, name) for base in bases):
            return f"{name}()"
    return None


def swap_fetcher(iterator: Any, replace: Callable[[Any], Any]) -> bool:
    """Give ``iterator`` the fetcher ``replace(fetcher)``; false if it has no dataset fetcher."""
    fetcher = getattr(iterator, "_dataset_fetcher", None)
    if fetcher is None or not callable(getattr(fetcher, "fetch", None)):
        return False
    iterator._dataset_fetcher = replace(fetcher)
    return True


def yielded(iterator: Any, default: int) -> int:
    """How many batches ``iterator`` handed out (it resumes with its loader), else ``default``."""
    return int(getattr(iterator, "_num_yielded", default))


def base_seed(iterator: Any) -> int | None:
    """The seed ``iterator`` drew at ``iter()`` (its workers' base seed), else ``None``."""
    seed = getattr(iterator, "_base_seed", None)
    return None if seed is None else int(seed)


def pin_settings(iterator: Any) -> tuple[bool, Any]:
    """``(pin, device)``: whether ``iterator`` pins its batches, and for which device type."""
    return bool(getattr(iterator, "_pin_memory", False)), getattr(
        iterator, "_pin_memory_device", None
    )


def pin(batch: Any, device: Any) -> Any:
    """Pin ``batch`` as the DataLoader's own iterator pins it (torch's ``pin_memory``)."""
    return resolve(_PIN, "pin_memory")(batch, device)
