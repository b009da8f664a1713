"""What every wrapper shares: pass-through, the one ``__iter__``, checkpoints, closing.

A training loop written for a bare ``DataLoader`` calls ``len(loader)``,
``loader.set_epoch(e)`` and reads ``loader.dataset`` or ``loader.sampler``.
:class:`LoaderWrapper` keeps all of that working through any stack of
wrappers, so wrapping a loader is a one-line change.

It also opens every epoch, at the first ``next()`` of the idle iterator
``iter()`` returned (:meth:`LoaderWrapper._open_epoch`, step 2 of the three
in :mod:`prefetch._shared.epoch`): it looks once for a distributed rank that
reads everything, stops the older epochs of a source that has only one
position, warns once about a used-up one-shot source, calls ``iter()`` on the
wrapped loader, and only then has the iterator run the epoch
(:meth:`~prefetch._shared.epoch.EpochIterator._launch`). A wrapper runs ahead of
the training loop, so the wrapped loader's own ``state_dict()`` counts items
the loop has not seen; each epoch therefore records the state right after
each item it hands over (:class:`~prefetch._shared.epoch.EpochRecord`).

Hooks the base declares and a subclass overrides (the only methods one
wrapper calls on another): :meth:`LoaderWrapper._idle_epoch`,
:meth:`LoaderWrapper._start_state` (the checkpointing twin's) and
:meth:`LoaderWrapper._copied_to`; and one class attribute a subclass sets,
:attr:`LoaderWrapper._runs_on_consumer_thread`, which a wrapper that runs a
thread of its own reads (:mod:`prefetch._shared.stacking`) to refuse being
stacked on such a wrapper.

Invariant: a wrapper has ``state_dict``/``load_state_dict`` exactly when the
loader it wraps can checkpoint; :mod:`prefetch._shared.checkpointing` (this
module's declared partner) decides it, by the wrapper's class, at the end of
every wrapper's ``__init__``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from prefetch._shared.adapters import iterates_a_base
from prefetch._shared.distributed import distributed_world, warn_if_unprepared, warn_if_unsharded
from prefetch._shared.epoch import EpochIterator, EpochRecord, Opener, released_if_raised
from prefetch._shared.facts import LoaderFacts
from prefetch._shared.open_epochs import OpenEpochs
from prefetch._shared.passthrough import set_epoch_on, sized_length, warn_consumed, why_unsized
from prefetch._shared.read_ahead import ReadAhead, Resumed
from prefetch._shared.sampling import Position, SamplingGenerators, position_reader
from prefetch._shared.stateful import read_state
from prefetch._shared.stats import LoaderStats
from prefetch._shared.totals import EpochTotals, TotalStats
from prefetch._torch.interrupted_start import forget_interrupted_start

if TYPE_CHECKING:
    import torch

W = TypeVar("W", bound="LoaderWrapper")


def one_iterator_reason(loader: Any) -> str | None:
    """Return why ``loader`` cannot run two epochs at once, or ``None`` if it can.

    A one-shot iterator (``iter()`` returns itself) has one position, and a
    ``DataLoader`` with ``persistent_workers=True`` resets its one iterator at
    every ``iter()``; through any stack of wrappers.

    Example:
        >>> one_iterator_reason([1, 2]) is None
        True
        >>> one_iterator_reason(iter([1, 2]))
        'it wraps a one-shot list_iterator, whose iter() returns itself'
    """
    if isinstance(loader, LoaderWrapper):
        return one_iterator_reason(loader.loader)
    if isinstance(loader, Iterator):
        return f"it wraps a one-shot {type(loader).__name__}, whose iter() returns itself"
    workers = getattr(loader, "num_workers", 0)
    persistent = getattr(loader, "persistent_workers", False) is True
    if persistent and isinstance(workers, int) and workers > 0:
        return (
            f"it wraps a {type(loader).__name__} with persistent_workers=True, "
            "which resets its one iterator at every iter()"
        )
    return None


class LoaderWrapper:
    """Base for wrappers: pass-through, the one ``__iter__``, stats, checkpoints and ``close``.

    A subclass calls ``super().__init__(loader)`` and implements
    :meth:`_open_epoch`. Public attributes the wrapper lacks (``dataset``,
    ``sampler``, ``batch_size``, ...) are read from the wrapped loader.
    """

    _runs_on_consumer_thread: ClassVar[bool] = False
    """Declared: epochs must run on the thread that called ``iter()`` (CudaPrefetcher's do)."""
    _stateful = False  # set by prefetch._shared.checkpointing.adopt_state
    _state_problem: str | None = None  # why the wrapped loader cannot checkpoint

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Make the wrapper; over an accelerate loader, put it inside and return that loader.

        See :mod:`~prefetch._shared.adapters`: its ``base_dataloader`` is wrapped in place.
        """
        loader = args[0] if args else kwargs.get("loader")
        if loader is None or not iterates_a_base(loader):
            return super().__new__(cls)
        rest = {key: value for key, value in kwargs.items() if key != "loader"}
        inner = cls(loader.base_dataloader, *args[1:], **rest)
        inner._preparation_due = False  # the loader around it is the prepared one
        loader.base_dataloader = inner
        return loader

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._epoch: EpochRecord | None = None  # the latest iter()'s (None: read the loader)
        self._epochs = OpenEpochs()
        self._newest: weakref.ref[EpochIterator[Any]] | None = None  # the latest iter()'s
        self._created = self._started = 0  # iter() calls; the newest that opened its epoch
        self._sharding_checked = False  # looked for a DataLoader that every rank reads whole
        self._preparation_due = True  # look once for a DataLoader accelerate did not prepare
        self._warned_used_up = False
        self._resumed: Resumed | None = None  # the latest epoch's carried entries, still to draw
        self._totals = EpochTotals()
        # Whether fetch_threads could read what this stack reads (the summary's advice names it).
        self._parallel_fetch_available: bool = (
            isinstance(loader, LoaderWrapper) and loader._parallel_fetch_available
        )
        self._facts: LoaderFacts = (
            loader._facts if isinstance(loader, LoaderWrapper) else LoaderFacts.of(loader)
        )
        # A seeded shuffle's generators, shared through a stack: each epoch sets them back.
        self._sampling: SamplingGenerators | None = (
            loader._sampling if isinstance(loader, LoaderWrapper) else SamplingGenerators.of(loader)
        )

    def __iter__(self) -> EpochIterator[Any]:
        """Return an idle epoch: nothing runs until it starts (:mod:`~prefetch._shared.epoch`)."""
        self._created += 1
        iterator = self._idle_epoch(partial(self._open_epoch, serial=self._created))
        self._newest = weakref.ref(iterator)
        return iterator

    def _open_epoch(self, iterator: EpochIterator[Any], serial: int = 0) -> None:
        """Open ``iterator``'s epoch: the one place that opens epochs (when it starts).

        ``serial`` numbers the ``iter()`` calls: over a source with one position, an
        iterator that starts after a newer one started raises.
        """
        if not self._sharding_checked and distributed_world() > 1:
            self._sharding_checked = True
            warn_if_unsharded(self._loader, type(self).__name__)
        if self._preparation_due:
            self._preparation_due = False
            warn_if_unprepared(self._loader, type(self).__name__)
        loader = self._loader
        reason = one_iterator_reason(loader)
        if reason is not None:
            # Before iter(loader): persistent workers reset the iterator an older
            # epoch's thread may still be reading.
            why = f"a newer iter() of this {type(self).__name__} stopped it: {reason}"
            if serial < self._started:
                msg = (
                    f"a newer iter() of this {type(self).__name__} started before this "
                    f"iterator's first next(): {reason}"
                )
                raise RuntimeError(msg)
            self._epochs.stop_all(reason=why, wait=True)
            carried = self._epochs.take_read_ahead()  # a one-shot source's: nothing is lost
            if self._resumed is not None:  # what it carried in and its threads never drew
                carried.extend(self._resumed.rest())
                self._resumed = None
            last = self._epochs.last
            used_up = last is not None and last.source_ended and not carried
            if used_up and isinstance(loader, Iterator) and not self._warned_used_up:
                self._warned_used_up = True
                warn_consumed(type(self).__name__, loader)
        else:
            carried = ReadAhead()
            self._epochs.forget_dropped()
        self._started = max(self._started, serial)
        sampling = self._sampling
        try:
            source = iter(loader)
        except BaseException as error:  # Ctrl-C while torch started workers: see the module
            forget_interrupted_start(error)
            raise
        owned = source is not loader  # a one-shot iterator the user passed in stays open
        with released_if_raised(source, owned=owned):  # no worker outlives a refused start
            if isinstance(source, EpochIterator):  # a wrapper below starts now too, on this thread
                source.start()
            # After iter(): a StatefulDataLoader's new epoch (its shuffle included) is in
            # this state, not the finished previous one. Nothing runs ahead yet.
            last = self._epochs.last
            read_sampling: Callable[[], Any] | None = None
            if sampling is not None:  # over a wrapper below: where its loop (this one) got to
                below = isinstance(source, EpochIterator)
                read_sampling = source._sampling_position if below else sampling.mark
            start = Position(self._start_state(), read_sampling() if read_sampling else None)
            record = EpochRecord(start, last.largest_item if last is not None else 0)
            record.stats.parallel_fetch_available = self._parallel_fetch_available
            record.stats.facts = self._facts
            if carried:
                source = self._resumed = Resumed(carried, source)
            iterator._launch(
                source,
                record,
                owned=owned,
                keep=isinstance(innermost(loader), Iterator),
                read_state=position_reader(
                    partial(read_state, loader) if self._stateful else None, read_sampling
                ),
                expected=sized_length(loader),
            )
        if sampling is not None:  # its iterator sets the generators back when it is over
            record.sampling = sampling
            sampling.opened()
        self._epoch = record
        self._epochs.add(iterator)
        self._totals.add(iterator)

    def _idle_epoch(self, opener: Opener) -> EpochIterator[Any]:
        """Hook: a new, idle iterator of this wrapper's kind, which ``opener`` opens."""
        raise NotImplementedError

    def _start_state(self) -> Any:
        """Hook: the wrapped loader's state as an epoch starts (``None``: not stateful)."""
        return None

    def _copied_to(self, device: torch.device) -> None:
        """Hook: a wrapper stacked on this one copies its items to ``device``."""

    @property
    def stats(self) -> LoaderStats:
        """The latest epoch's :class:`~prefetch.LoaderStats` (zeros before the first).

        With several iterators open at once, the latest is the one the most
        recent ``iter()`` returned; each iterator's own ``stats`` is its epoch's.
        """
        return self._epoch.stats if self._epoch is not None else LoaderStats()

    @property
    def total_stats(self) -> TotalStats:
        """Every epoch's :attr:`stats` summed: a :class:`~prefetch.TotalStats` snapshot.

        Counts each epoch in which the loop received an item, the open one up to now.
        """
        return self._totals.snapshot()

    def close(self) -> None:
        """Stop every open epoch and release its source; a wrapped wrapper is closed too.

        An epoch is open from its first ``next()``: an iterator made by
        ``iter()`` and not advanced yet is not stopped, and its first
        ``next()`` starts a whole epoch (close that iterator itself to end it).
        Returns promptly even if a thread is stuck inside the source; the
        wrapper stays usable, and the next ``iter()`` starts a fresh epoch.
        """
        self._epochs.stop_all(reason=None, wait=False)
        if isinstance(self._loader, LoaderWrapper):
            self._loader.close()

    def __enter__(self: W) -> W:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Return the wrapped loader's length (batches per epoch)."""
        try:
            return len(self._loader)
        except TypeError:
            msg = f"{type(self).__name__} has no len(): {why_unsized(innermost(self._loader))}"
            raise TypeError(msg) from None

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch number to the wrapped loader's sampler or dataset.

        If the wrapped loader has ``set_epoch`` (another wrapper), only that is
        called. Otherwise it is called on each of ``loader.sampler``,
        ``loader.batch_sampler.sampler`` and ``loader.dataset`` that has it
        (a ``DistributedSampler`` then reshuffles). If none has it, nothing
        happens, so the same loop runs on one process with a plain sampler.

        Raises:
            TypeError: If ``epoch`` is not an int.
        """
        set_epoch_on(self._loader, epoch)

    @property
    def loader(self) -> Any:
        """The wrapped loader or iterable."""
        return self._loader

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails; never recurse before _loader is set.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            loader = object.__getattribute__(self, "_loader")
        except AttributeError:
            raise AttributeError(name) from None
        try:
            return getattr(loader, name)
        except AttributeError:
            msg = (
                f"{type(self).__name__!r} object has no attribute {name!r}, "
                f"and neither has the wrapped {type(loader).__name__!r}"
            )
            raise AttributeError(msg) from None


def innermost(loader: Any) -> Any:
    """The loader a stack of wrappers wraps (``loader`` itself if it is no wrapper)."""
    while isinstance(loader, LoaderWrapper):
        loader = loader.loader
    return loader


def short_repr(loader: Any, limit: int = 60) -> str:
    """Return ``repr(loader)`` if short, else ``<TypeName object>``: never cut mid-token.

    Example:
        >>> short_repr([1, 2]), short_repr(list(range(100)))
        ('[1, 2]', '<list object>')
    """
    if isinstance(loader, LoaderWrapper):
        return repr(loader)
    text = repr(loader)
    return text if len(text) <= limit else f"<{type(loader).__name__} object>"
