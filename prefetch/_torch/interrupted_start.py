"""A DataLoader iterator interrupted while it started: forget the pids torch recorded for it.

torch records every multi-worker iterator's worker pids in one process-wide
map keyed by the iterator's ``id()`` (``_set_worker_pids``, called from its
``__init__`` once the workers have started) and sets ``_worker_pids_set``
on the next line; only when that flag is set does its shutdown remove the
record. A ``KeyboardInterrupt`` (Ctrl-C) or another ``BaseException``
raised between the two (in ``_set_SIGCHLD_handler``, or on the way out of
the lock :mod:`prefetch._torch.worker_pids` puts around the call) leaves
the record behind for good. A later iterator that Python places at the same
address, which happens soon, then fails in ``iter()`` with ``ValueError:
_set_worker_pids should be called only once for each _BaseDataLoaderIter``:
a loop restarted after Ctrl-C (a notebook cell run again) cannot start. The
same happens without prefetch, with the GIL or without it.

Invariant: :func:`forget_interrupted_start`, given an exception that came
out of ``iter(loader)`` on the thread that called it, removes the record of
each half-built DataLoader iterator in its traceback whose ``__init__``
raised with ``_worker_pids_set`` false, and nothing else. The iterator is
still alive there (its frame holds it), so the record under its ``id()`` is
its own; one that was never recorded is left as it is.

Off (:mod:`prefetch._torch`), the record stays behind, as without prefetch.
"""

from __future__ import annotations

import traceback
from typing import Any

from prefetch._torch.workaround import Workaround, callable_at, resolve, set_by_init

_PIDS = "torch.utils.data._utils.signal_handling"
INTERRUPTED_START = Workaround(
    "interrupted start",
    "an interrupt between a multi-worker DataLoader iterator's _set_worker_pids and its "
    "_worker_pids_set flag leaves its pid record behind, and a later iterator at the same "
    "address cannot start",
    ("2.6.0", "2.12.0", "2.13.0", "2.15.0"),
    "a loop interrupted (Ctrl-C) while a DataLoader's workers start may fail to start again "
    "with 'ValueError: _set_worker_pids should be called only once'",
    [
        callable_at(_PIDS, "_remove_worker_pids"),
        set_by_init(
            "torch.utils.data.dataloader",
            "_MultiProcessingDataLoaderIter",
            ["_worker_pids_set", "_workers"],
        ),
    ],
)


def _half_built(error: BaseException) -> list[Any]:
    """The DataLoader iterators whose ``__init__`` raised ``error`` before flagging their pids."""
    found = []
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_name != "__init__":
            continue
        candidate = frame.f_locals.get("self")
        if getattr(candidate, "_worker_pids_set", True) is False and hasattr(candidate, "_workers"):
            found.append(candidate)
    return found


def forget_interrupted_start(error: BaseException) -> int:
    """Remove torch's pid records of iterators that ``error`` interrupted (see the module).

    Returns:
        How many records were removed (0 when ``error`` did not come from
        between the record and its flag: the usual case).

    Example:
        >>> forget_interrupted_start(ValueError("not from a DataLoader"))
        0
    """
    half_built = _half_built(error)
    if not half_built or not INTERRUPTED_START.active():
        return 0
    remove = resolve(_PIDS, "_remove_worker_pids")
    removed = 0
    for iterator in half_built:
        try:
            remove(id(iterator))
        except ValueError:  # interrupted before the record: nothing to forget
            continue
        removed += 1
    return removed
