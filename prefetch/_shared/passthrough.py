"""What a wrapper passes through to the loader it wraps, and what it says about it.

A training loop written for a bare ``DataLoader`` calls ``len(loader)`` and
``loader.set_epoch(e)``; :class:`~prefetch._shared.wrapper.LoaderWrapper`
answers them through any stack of wrappers with the helpers here, which
know nothing of wrappers: they are given the loader a stack wraps.
"""

from __future__ import annotations

import warnings
from typing import Any

from prefetch._shared.user_frame import user_stacklevel


def warn_consumed(wrapper: str, loader: Any) -> None:
    """Warn that a later epoch over the one-shot ``loader`` is empty, at the caller's line."""
    warnings.warn(
        f"{wrapper}: this epoch is empty: the one-shot {type(loader).__name__} it "
        "wraps was consumed by an earlier epoch; wrap a re-iterable loader (a list, "
        "a DataLoader) to run several epochs",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def set_epoch_on(loader: Any, epoch: int) -> None:
    """Forward ``set_epoch(epoch)`` to whatever in ``loader`` understands it.

    If ``loader`` has ``set_epoch`` (another wrapper, or a loader that
    forwards it itself), only that is called. Otherwise it is called on each
    of ``loader.sampler``, ``loader.batch_sampler.sampler`` and
    ``loader.dataset`` that has it, once per object. If none has it, nothing
    happens: a loop that calls ``set_epoch`` for a ``DistributedSampler`` also
    runs unchanged on one process with a plain sampler.

    Example:
        >>> class Sampler:
        ...     def set_epoch(self, epoch): self.epoch = epoch
        >>> class Loader:
        ...     sampler = Sampler()
        >>> loader = Loader()
        >>> set_epoch_on(loader, 3)
        >>> loader.sampler.epoch
        3
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        msg = f"set_epoch(epoch) expects an int, got {epoch!r} of type {type(epoch).__name__}"
        raise TypeError(msg)
    own = getattr(loader, "set_epoch", None)
    if callable(own):
        own(epoch)
        return
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = (
        getattr(loader, "sampler", None),
        getattr(batch_sampler, "sampler", None),
        getattr(loader, "dataset", None),
    )
    seen: set[int] = set()
    for candidate in candidates:
        method = getattr(candidate, "set_epoch", None)
        if candidate is None or id(candidate) in seen or not callable(method):
            continue
        seen.add(id(candidate))
        method(epoch)


def why_unsized(loader: Any) -> str:
    """Say which object in ``loader`` (no wrapper) lacks a length (a DataLoader's dataset)."""
    dataset = getattr(loader, "dataset", None)
    if dataset is not None and not hasattr(type(dataset), "__len__"):
        return (
            f"the dataset {type(dataset).__name__!r} of the wrapped "
            f"{type(loader).__name__!r} defines no __len__"
        )
    return f"the wrapped loader {type(loader).__name__!r} defines no __len__"


def sized_length(loader: Any) -> int | None:
    """``len(loader)``, or ``None`` if it has no length (or its ``len`` raises).

    A wrapper reads ahead to this many items and makes the call that finds
    the end only when the loop asks past them, as a plain loop does.

    Example:
        >>> sized_length([1, 2, 3]), sized_length(iter([1, 2, 3]))
        (3, None)
    """
    try:
        length = len(loader)
    except Exception:  # no __len__ (TypeError), or one that cannot say (an IterableDataset's)
        return None
    return length if isinstance(length, int) and length >= 0 else None
