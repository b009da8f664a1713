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

import itertools
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
    in its place, as without this.
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
        source._sampler_iter = _raise_first(error)
        return
    source._sampler_iter = itertools.chain((first,), indices)


def _raise_first(error: Exception) -> Iterator[Any]:
    raise error
    yield  # pragma: no cover  (makes this a generator: the error waits for next())
