"""Loaders that iterate a base loader of their own: a wrapper goes inside them.

accelerate's prepared loaders (``DataLoaderShard``, ``DataLoaderDispatcher``)
iterate their ``base_dataloader`` one batch ahead and, in that iteration, do
what the training loop and accelerate read at each step: they enter and
leave accelerate's ``GradientState``, set ``end_of_dataloader`` and
``remainder`` (gradient accumulation's last sync, what ``gather_for_metrics``
drops of a padded last batch), synchronise random states across processes,
and place batches on the device. A wrapper that ran that iteration ahead of
the loop, in its thread or with copies in flight, would move all of it to
the wrong step.

So a wrapper built over such a loader goes inside it: it wraps the loader's
``base_dataloader`` in place, and the loader itself is returned. accelerate's
own iteration then runs on the loop's thread at the plain loader's steps,
reading the wrapper (which reads ahead), and ``accelerator.save_state()``,
``skip_first_batches`` and ``prepare`` keep seeing the loader they know.
Attributes the loader lacks (``stats``, ``settings``, ``close``) read
through to the wrapper inside it, as accelerate forwards them.

Invariant: only a loader of accelerate's own classes with a
``base_dataloader`` of its own is entered; its class is read with
``type()``, since accelerate reports its base's class as ``__class__``.
"""

from __future__ import annotations

from typing import Any


def iterates_a_base(loader: Any) -> bool:
    """Whether ``loader`` is an accelerate loader that iterates a ``base_dataloader`` of its own.

    Example:
        >>> iterates_a_base([1, 2])
        False
    """
    kind = type(loader)  # the real class: accelerate's loaders report their base's
    if kind.__module__.split(".")[0] != "accelerate":
        return False
    return "base_dataloader" in getattr(loader, "__dict__", {})
