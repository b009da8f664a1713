"""A warning for a loader that every rank of a distributed job reads whole.

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
"""

from __future__ import annotations

import warnings
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from prefetch._shared.user_frame import user_stacklevel


def _shards(sampler: Any) -> bool:
    if isinstance(sampler, DistributedSampler):
        return True
    return any(getattr(sampler, name, 1) != 1 for name in ("num_replicas", "num_processes"))


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
    if isinstance(loader.dataset, IterableDataset):
        return None
    batch_sampler = loader.batch_sampler
    samplers = (loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None))
    if any(_shards(sampler) for sampler in samplers if sampler is not None):
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
