"""Start a single-process DataLoader's sampler on the caller's thread.

A ``DataLoader(num_workers=0)`` starts its sampler at its first ``next()``;
a ``RandomSampler`` without a ``generator`` then draws its seed from torch's
global random generator. Through a ``BackgroundLoader`` that first ``next()``
runs on the producer thread, at a moment that depends on thread timing, so
``torch.manual_seed`` would no longer fix the shuffle order, nor the
caller's own later draws (model initialisation, dropout). With worker
processes the DataLoader starts its sampler in ``iter()`` already.

:func:`start_sampler_here` takes the sampler's first index in ``iter()``, on
the caller's thread (no data is loaded), and puts it back in front. Random
draws inside the dataset (augmentations) still happen on the producer thread:
the guide says so. Off (:mod:`prefetch._torch`), the sampler starts at the
first ``next()`` on the producer thread, as it would without this.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prefetch._torch.workaround import Workaround, resolve, set_by_init

_ITER = "torch.utils.data.dataloader"
SAMPLER_START = Workaround(
    "sampler start",
    "a DataLoader with num_workers=0 starts its sampler (a RandomSampler draws its seed from "
    "torch's global generator) at its first next(), on the prefetch thread",
    ("2.6.0", "2.12.0", "2.13.0", "2.15.0"),
    "a shuffled DataLoader with num_workers=0 draws its seed on the prefetch thread, at a "
    "moment that depends on timing: torch.manual_seed no longer fixes its order",
    [
        set_by_init(_ITER, "_BaseDataLoaderIter", ["_sampler_iter"]),
        set_by_init(_ITER, "_SingleProcessDataLoaderIter", []),
    ],
)
_MISSING = object()


def start_sampler_here(source: Any) -> None:
    """Start ``source``'s sampler now if it is a plain single-process DataLoader iterator.

    An error the sampler raises is kept and raised at the first ``next()``,
    in its place, as without this; later draws ask the sampler's iterator
    again, as the DataLoader would (one whose draws raise and go on goes on).
    """
    if not SAMPLER_START.active():
        return
    if type(source) is not resolve(_ITER, "_SingleProcessDataLoaderIter"):
        return  # subclasses keep their own state
    indices = getattr(source, "_sampler_iter", _MISSING)
    if not isinstance(indices, Iterator):
        SAMPLER_START.turn_off(f"a DataLoader iterator's _sampler_iter is {type(indices).__name__}")
        return
    try:
        first = next(indices)
    except StopIteration:
        return  # an empty sampler: the first next() ends the epoch as before
    except Exception as error:
        source._sampler_iter = _Started(indices, error, raised=True)
        return
    source._sampler_iter = _Started(indices, first, raised=False)


class _Started:
    """A started sampler iterator: its first draw, then the iterator's own ``next()``.

    The first draw is an index, or the error the sampler raised for it.

    Only ``next()`` is called on the iterator, never ``iter()`` again: a sampler
    object whose ``__iter__`` starts over and returns itself would repeat its
    first draw (``itertools.chain`` calls ``iter()`` on what it chains).
    """

    __slots__ = ("_first", "_indices", "_raised")

    def __init__(self, indices: Iterator[Any], first: Any, *, raised: bool) -> None:
        self._indices = indices
        self._first: Any = first
        self._raised = raised

    def __iter__(self) -> _Started:
        return self

    def __next__(self) -> Any:
        first = self._first
        if first is _MISSING:
            return next(self._indices)
        self._first = _MISSING
        if self._raised:
            raise first
        return first
