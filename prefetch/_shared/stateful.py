"""Whether a loader can checkpoint, decided without ever breaking iteration.

Frameworks decide whether a loader can checkpoint by looking for
``state_dict`` and ``load_state_dict``: Lightning's runtime-checkable
protocol uses ``hasattr`` (``inspect.getattr_static`` from Python 3.12).
So a wrapper must have these two methods exactly when what it wraps can
checkpoint (see :class:`prefetch._shared.checkpointing.Checkpointing`), and this module
says when that is.

Invariants:

* **Decided by looking.** When a wrapper is built, :func:`state_problem`
  checks that both methods exist, without calling them (a
  ``StatefulDataLoader`` starts its workers on a ``state_dict()`` call
  before any epoch). accelerate's prepared ``DataLoaderShard`` has both
  methods, but its ``state_dict()`` raises ``AttributeError`` unless
  ``use_stateful_dataloader=True``: its flag says so, and it is non-stateful.
* **Reads never raise.** Every read goes through :func:`read_state`, which
  turns an exception into a :class:`StateUnavailable` record. A read that
  fails at an epoch start makes the wrapper non-stateful from then on; one
  that fails after an item leaves that item's state unavailable. Either way
  the epoch goes on, and only asking for the state raises
  :class:`NotStatefulError`, naming the cause.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """What can checkpoint: ``state_dict()`` and ``load_state_dict(state)``.

    A wrapper of this package matches this protocol exactly when the loader
    it wraps can checkpoint (as torchdata's ``StatefulDataLoader`` can), so
    ``isinstance(loader, Stateful)`` answers what a framework asks.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from torchdata.stateful_dataloader import StatefulDataLoader
        >>> from prefetch import BackgroundLoader, Stateful
        >>> isinstance(BackgroundLoader(DataLoader(range(4))), Stateful)
        False
        >>> isinstance(BackgroundLoader(StatefulDataLoader(range(4))), Stateful)
        True
    """

    def state_dict(self) -> Any:
        """Return the state to resume from."""

    def load_state_dict(self, state_dict: Any) -> None:
        """Resume from ``state_dict``."""


class NotStatefulError(AttributeError, TypeError):
    """Asked for the state of a wrapper over a loader that cannot checkpoint.

    An ``AttributeError`` so that ``hasattr`` is false, and a ``TypeError``
    like any call on an object of the wrong kind.
    """


class StateUnavailable:
    """Stands for a state whose read raised: the error, kept without its traceback."""

    __slots__ = ("error", "loader_type")

    def __init__(self, loader: Any, error: Exception) -> None:
        self.loader_type = type(loader).__name__
        self.error = error.with_traceback(None)  # frames would keep the loader's locals alive

    def describe(self) -> str:
        """Say which loader's ``state_dict()`` raised what."""
        error = self.error
        return f"got {self.loader_type}, whose state_dict() raised {type(error).__name__}: {error}"


def _accelerate_hint(loader: Any) -> str:
    if type(loader).__module__.split(".")[0] != "accelerate":
        return ""
    return (
        " (with accelerate, build the Accelerator with "
        "dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))"
    )


def state_problem(loader: Any) -> str | None:
    """Return why ``loader`` cannot checkpoint, or ``None`` if it looks like it can.

    Only looks: calling ``state_dict()`` here could start a
    ``StatefulDataLoader``'s worker processes when a wrapper is built.

    Example:
        >>> import torch
        >>> state_problem(torch.nn.Linear(1, 1)) is None
        True
        >>> state_problem([1, 2])
        'got list, which has no state_dict() or load_state_dict()'
    """
    missing = [
        name
        for name in ("state_dict", "load_state_dict")
        if not callable(getattr(loader, name, None))
    ]
    if missing:
        what = " or ".join(f"{name}()" for name in missing)
        return f"got {type(loader).__name__}, which has no {what}"
    if getattr(loader, "use_stateful_dataloader", None) is False:
        # accelerate's prepared loaders: state_dict() raises AttributeError unless this is on.
        return (
            f"got {type(loader).__name__} with use_stateful_dataloader=False, whose "
            "state_dict() cannot work" + _accelerate_hint(loader)
        )
    return None


def read_state(loader: Any) -> Any:
    """Return ``loader.state_dict()``, or a :class:`StateUnavailable` if it raises."""
    try:
        return loader.state_dict()
    except Exception as error:
        return StateUnavailable(loader, error)
