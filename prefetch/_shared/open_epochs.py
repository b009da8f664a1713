"""A wrapper's registry of the epochs that may still hold its source.

The wrapper keeps its started epochs here, each with its
:class:`~prefetch._shared.epoch.Stoppable`: what stops the epoch's threads,
or releases its source, even once the iterator itself is gone.

Invariants (those of :mod:`prefetch._shared.epoch` that the registry keeps):

* **The registry never holds an iterator.** It keeps a weak reference and
  the stoppable, which holds no reference to the iterator, so a dropped
  iterator is collected and its finalizer stops the epoch.
* **Waited out.** :meth:`OpenEpochs.stop_all` with ``wait=True`` returns only
  once every registered epoch's threads have left its source (a ``DataLoader``
  with persistent workers may then reset its one iterator).

This module is the declared partner of :mod:`prefetch._shared.epoch`: it
reads an iterator's ``_record`` and ``_stopper`` and calls its
``_invalidate``.
"""

from __future__ import annotations

import weakref
from typing import Any

from prefetch._shared.epoch import (
    CLOSE_TIMEOUT,
    STUCK_GRACE,
    EpochIterator,
    EpochRecord,
    Stoppable,
)
from prefetch._shared.read_ahead import ReadAhead


class OpenEpochs:
    """A wrapper's epochs that may still hold its source, and the latest one's record.

    Example:
        >>> epochs = OpenEpochs()
        >>> epochs.last is None
        True
    """

    def __init__(self) -> None:
        self._open: list[tuple[weakref.ref[EpochIterator[Any]], Stoppable]] = []
        self._stopped: list[Stoppable] = []  # stopped epochs whose read-ahead is not taken yet
        self.last: EpochRecord | None = None

    def add(self, iterator: EpochIterator[Any]) -> None:
        """Register an epoch that was just opened; it becomes the latest."""
        self._open.append((weakref.ref(iterator), iterator._stopper))
        self.last = iterator._record

    def stop_all(self, *, reason: str | None, wait: bool) -> None:
        """Stop every registered epoch; with ``reason``, its next ``next()`` says why.

        With ``wait``, return only once every epoch's threads have left its
        source (however long the source takes to return).
        """
        epochs, self._open = self._open, []
        for ref, stopper in epochs:
            iterator = ref()
            if iterator is None:  # dropped: its threads may still be inside the source
                stopper.stop()
                stopper.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)
            elif reason is not None:
                iterator._invalidate(reason)
            else:
                iterator.close()
            del iterator
            if stopper.keeps:
                self._stopped.append(stopper)
            while wait and not stopper.join(timeout=0.1, stuck_grace=0.1):
                pass  # e.g. before persistent workers are reset: wait them out

    def take_read_ahead(self) -> ReadAhead:
        """Wait out every stopped epoch; return what they read ahead of a one-shot source, in order.

        Call it before the next epoch over the same one-shot source starts.
        """
        carried = ReadAhead()
        stopped, self._stopped = self._stopped, []
        for stopper in stopped:
            while not stopper.join(timeout=0.1, stuck_grace=0.1):
                pass  # its thread is still inside the source: what it draws is carried too
            carried.extend(stopper.read_ahead())
        return carried

    def forget_dropped(self) -> None:
        """Stop and forget the epochs whose iterator was dropped; keep the others."""
        kept = []
        for entry in self._open:
            ref, stopper = entry
            if ref() is not None:
                kept.append(entry)
            else:
                stopper.stop()
                stopper.join(timeout=CLOSE_TIMEOUT, stuck_grace=STUCK_GRACE)
        self._open = kept
