"""Checkpoint support shared by the wrappers: is the wrapped loader resumable?

A wrapper runs ahead of the training loop, so the wrapped loader's own
``state_dict()`` counts items the loop has not seen. Each wrapper therefore
captures the state right after producing each item and reports the state of
the last item it handed over; these helpers decide whether that is possible.
"""

from __future__ import annotations

from typing import Any

from prefetch.wrapper import LoaderWrapper

__all__ = ["is_stateful", "require_stateful"]


def is_stateful(loader: Any) -> bool:
    """Return whether ``loader`` has both ``state_dict()`` and ``load_state_dict()``.

    A wrapper of this package is resumable when the loader it wraps is.

    Example:
        >>> import torch
        >>> is_stateful([1, 2]), is_stateful(torch.nn.Linear(1, 1))
        (False, True)
    """
    if isinstance(loader, LoaderWrapper):
        return is_stateful(loader.loader)
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def require_stateful(loader: Any, caller: str) -> None:
    """Raise ``TypeError`` naming ``caller`` unless ``loader`` is stateful."""
    if not is_stateful(loader):
        msg = (
            f"{caller} needs a loader with state_dict() and load_state_dict() "
            f"(such as torchdata's StatefulDataLoader); got {type(loader).__name__}"
        )
        raise TypeError(msg)
