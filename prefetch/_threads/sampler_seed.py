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
the guide says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data.dataloader import _SingleProcessDataLoaderIter


def start_sampler_here(source: Iterator[Any]) -> None:
    """Start ``source``'s sampler now if it is a plain single-process DataLoader iterator.

    An error the sampler raises is kept and raised at the first ``next()``,
    in its place, as without this.
    """
    if type(source) is not _SingleProcessDataLoaderIter:  # subclasses keep their own state
        return
    indices = source._sampler_iter
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
