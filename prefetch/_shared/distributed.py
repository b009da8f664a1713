"""Warnings for a loader that a distributed job reads whole, or that accelerate never prepared.

Frameworks shard a ``DataLoader`` by giving it a ``DistributedSampler``;
Lightning does that only for a real ``DataLoader``, so a wrapped one keeps
its own sampler and, under DDP, every rank trains on every item. Nothing
fails: it is just wrong. The wrappers therefore look once, at their first
epoch with ``torch.distributed`` initialised.

Invariants:

* **Only when sure.** A warning needs a world size above 1 and a
  ``DataLoader`` over a map-style dataset none of whose samplers shards (a
  ``DistributedSampler``, or anything with ``num_replicas`` or
  ``num_processes`` as accelerate's ``BatchSamplerShard`` has). Iterable
  datasets shard themselves or not; that cannot be seen from outside.
* **Once per wrapper, innermost only.** A stack warns once, from the wrapper
  that holds the ``DataLoader``.
* **accelerate: wrap after ``prepare()``.** ``accelerator.prepare()`` returns
  anything that is not a ``DataLoader`` untouched, so a wrapper prepared
  instead of its ``DataLoader`` silently gets no device placement, sharding
  or end-of-data signal, even on one process. At its first epoch a wrapper
  warns when an ``Accelerator`` exists (accelerate's state is initialised;
  accelerate is only looked for in ``sys.modules``, never imported) and it
  holds a plain ``DataLoader`` that no sampler shards. Parallel fetch, which
  cannot read a prepared loader, does not look.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from prefetch._shared.user_frame import user_stacklevel


def _shards(sampler: Any) -> bool:
    if isinstance(sampler, DistributedSampler):
        return True
    return any(getattr(sampler, name, 1) != 1 for name in ("num_replicas", "num_processes"))


def _sharded(loader: DataLoader[Any]) -> bool:
    batch_sampler = loader.batch_sampler
    samplers = (loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None))
    return any(_shards(sampler) for sampler in samplers if sampler is not None)


def distributed_world() -> int:
    """Return the number of processes of the initialised default group, or 1."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


def unsharded_message(loader: Any, wrapper: str) -> str | None:
    """Return the warning for ``loader`` if it is a ``DataLoader`` that this rank reads whole.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> unsharded_message(DataLoader(range(4)), "BackgroundLoader") is None  # one process
        True
    """
    world = distributed_world()
    if world <= 1 or not isinstance(loader, DataLoader):
        return None
    if isinstance(loader.dataset, IterableDataset) or _sharded(loader):
        return None
    return (
        f"{wrapper}: torch.distributed runs {world} processes, but the wrapped DataLoader's "
        f"sampler ({type(loader.sampler).__name__}) does not shard, so every rank reads every "
        "item. Give the DataLoader a torch.utils.data.DistributedSampler (with Lightning, in "
        "train_dataloader(); see the Integrations page of the prefetch docs), or wrap the "
        "loader your framework prepared."
    )


def warn_if_unsharded(loader: Any, wrapper: str) -> None:
    """Warn (``UserWarning``) if every rank reads all of ``loader``; see the module invariants."""
    message = unsharded_message(loader, wrapper)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def accelerator_initialised() -> bool:
    """Return whether an ``accelerate.Accelerator`` was created (without importing accelerate).

    Example:
        >>> import sys
        >>> imported = "accelerate" in sys.modules
        >>> isinstance(accelerator_initialised(), bool), ("accelerate" in sys.modules) == imported
        (True, True)
    """
    state = sys.modules.get("accelerate.state")
    if state is None:
        return False
    initialised = getattr(state, "is_initialized", None)
    if callable(initialised):
        return bool(initialised())
    return bool(getattr(getattr(state, "AcceleratorState", None), "_shared_state", None))


def unprepared_message(loader: Any, wrapper: str) -> str | None:
    """Return the warning for ``loader`` if it is a ``DataLoader`` accelerate has not prepared.

    Only while an ``Accelerator`` exists, and not for a ``DataLoader`` whose
    sampler shards it (the user prepared it by hand).
    """
    if not isinstance(loader, DataLoader) or not accelerator_initialised():
        return None
    if type(loader).__module__.split(".")[0] == "accelerate" or _sharded(loader):
        return None
    return (
        f"{wrapper} wraps a {type(loader).__name__} that accelerate has not prepared, while an "
        f"Accelerator is set up: accelerator.prepare() returns the {wrapper} untouched (it is "
        "not a DataLoader), so these batches get no device placement, no sharding across "
        "processes and no end-of-data signal for gradient accumulation. Prepare first, then "
        f"wrap: {wrapper}(accelerator.prepare(dataloader)). If this DataLoader is meant to "
        f"stay unprepared, silence this with warnings.filterwarnings('ignore', "
        f"message='{wrapper} wraps a')"
    )


def warn_if_unprepared(loader: Any, wrapper: str) -> None:
    """Warn (``UserWarning``) if ``loader`` is a DataLoader accelerate should have prepared."""
    message = unprepared_message(loader, wrapper)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
