"""What every wrapper shares: pass-through, epochs, checkpoints and closing.

A training loop written for a bare ``DataLoader`` calls ``len(loader)``,
``loader.set_epoch(e)`` and reads ``loader.dataset`` or ``loader.sampler``.
:class:`LoaderWrapper` keeps all of that working through any stack of
wrappers, so wrapping a loader is a one-line change.

It also holds what the wrappers do alike with their epochs. A wrapper runs
ahead of the training loop, so the wrapped loader's own ``state_dict()``
counts items the loop has not seen; each wrapper therefore records the
state right after taking each item and reports the state of the last item
it handed over (:class:`~prefetch._stats.EpochRecord`).
"""

from __future__ import annotations

from typing import Any, SupportsIndex, TypeVar, cast

from prefetch._distributed import distributed_world, warn_if_unsharded
from prefetch._stateful import (
    NotStatefulError,
    StateUnavailable,
    read_state,
    state_problem,
)
from prefetch._stats import EpochRecord, LoaderStats

W = TypeVar("W", bound="LoaderWrapper")


def is_stateful(loader: Any) -> bool:
    """Return whether ``loader`` can checkpoint (see :func:`~prefetch._stateful.state_problem`).

    A wrapper of this package is resumable when the loader it wraps is.

    Example:
        >>> import torch
        >>> is_stateful([1, 2]), is_stateful(torch.nn.Linear(1, 1))
        (False, True)
    """
    return state_problem(loader) is None


def set_epoch_on(loader: Any, epoch: int) -> None:
    """Forward ``set_epoch(epoch)`` to whatever in ``loader`` understands it.

    If ``loader`` has ``set_epoch`` (another wrapper, or a loader that
    forwards it itself), only that is called. Otherwise it is called on each
    of ``loader.sampler``, ``loader.batch_sampler.sampler`` and
    ``loader.dataset`` that has it, once per object. If none has it, nothing
    happens: a loop that calls ``set_epoch`` for a ``DistributedSampler`` also
    runs unchanged on one process with a plain sampler.

    Example:
        >>> class Sampler:
        ...     def set_epoch(self, epoch): self.epoch = epoch
        >>> class Loader:
        ...     sampler = Sampler()
        >>> loader = Loader()
        >>> set_epoch_on(loader, 3)
        >>> loader.sampler.epoch
        3
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        msg = f"set_epoch(epoch) expects an int, got {epoch!r} of type {type(epoch).__name__}"
        raise TypeError(msg)
    own = getattr(loader, "set_epoch", None)
    if callable(own):
        own(epoch)
        return
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = (
        getattr(loader, "sampler", None),
        getattr(batch_sampler, "sampler", None),
        getattr(loader, "dataset", None),
    )
    seen: set[int] = set()
    for candidate in candidates:
        method = getattr(candidate, "set_epoch", None)
        if candidate is None or id(candidate) in seen or not callable(method):
            continue
        seen.add(id(candidate))
        method(epoch)


class LoaderWrapper:
    """Base for wrappers: pass-through, stats, checkpoints, ``close`` and ``with``.

    Subclasses store the wrapped loader in ``self._loader`` and their latest
    epoch in ``self._epoch``, and implement :meth:`_stop_epoch`. Public
    attributes the wrapper lacks (``dataset``, ``sampler``, ``batch_size``,
    ...) are read from the wrapped loader.
    """

    _loader: Any
    _epoch: EpochRecord | None = None
    _state_problem: str | None = None  # why the wrapped loader cannot checkpoint
    _sharding_checked = False  # looked for a DataLoader that every rank reads whole

    def _check_sharding(self) -> None:
        """At the first epoch under ``torch.distributed``, warn if this rank reads everything."""
        if self._sharding_checked or distributed_world() <= 1:
            return
        self._sharding_checked = True
        warn_if_unsharded(self._loader, type(self).__name__)

    def _adopt_state(self) -> None:
        """Decide, when the wrapper is built, whether it checkpoints.

        A wrapper over a stateful loader becomes its class's :class:`Checkpointing`
        twin, the only kind with ``state_dict``/``load_state_dict``.
        """
        self._state_problem = state_problem(self._loader)
        if self._state_problem is None and not isinstance(self, Checkpointing):
            self.__class__ = _stateful_twin(type(self))

    def _read_start_state(self) -> Any:
        """Read the wrapped loader's state at an epoch start, or ``None`` if not stateful.

        If the read raises, this wrapper turns non-stateful for good (it loses
        ``state_dict``/``load_state_dict``) and remembers why; iteration goes on.
        """
        if not isinstance(self, Checkpointing):
            return None
        state = read_state(self._loader)
        if isinstance(state, StateUnavailable):
            inner = getattr(self._loader, "_state_problem", None)
            self._state_problem = inner if isinstance(inner, str) else state.describe()
            self.__class__ = cast("type[Checkpointing]", self._twin_of)  # the plain class
            return None
        return state

    @property
    def _stateful(self) -> bool:
        return isinstance(self, Checkpointing)

    def _stop_epoch(self, wait: bool) -> None:
        """Stop the current epoch; with ``wait``, until nothing touches the loader."""
        raise NotImplementedError

    @property
    def stats(self) -> LoaderStats:
        """The latest epoch's :class:`~prefetch.LoaderStats` (zeros before the first)."""
        return self._epoch.stats if self._epoch is not None else LoaderStats()

    def close(self) -> None:
        """Stop the current epoch and release its source; a wrapped wrapper is closed too.

        Returns promptly even if a thread is stuck inside the source; the
        wrapper stays usable, and the next ``iter()`` starts a fresh epoch.
        """
        self._stop_epoch(wait=False)
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
            msg = (
                f"{type(self).__name__} has no len(): the wrapped loader "
                f"{type(self._loader).__name__!r} defines no __len__"
            )
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
        if name in ("state_dict", "load_state_dict"):
            # Not forwarded: the wrapped loader cannot checkpoint, so neither can we.
            msg = (
                f"{type(self).__name__}.{name}() needs a loader with state_dict() and "
                f"load_state_dict() (such as torchdata's StatefulDataLoader); "
                f"{self._state_problem}"
            )
            raise NotStatefulError(msg)
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


class Checkpointing(LoaderWrapper):
    """The methods a wrapper has only over a loader that can checkpoint.

    A framework checks for ``state_dict``/``load_state_dict`` to decide
    whether to save a loader's state (Lightning does, at every checkpoint), so
    a wrapper over a plain ``DataLoader`` must not have them. Each wrapper
    class gets a twin that adds these methods, with the same name; a wrapper
    built over a stateful loader is an instance of that twin. Over any other
    loader, both names raise :class:`~prefetch._stateful.NotStatefulError`
    (an ``AttributeError``, so ``hasattr`` is false) that says why.
    """

    _twin_of: type[LoaderWrapper]

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # The twin is not importable by name: pickle the class it twins, rebuild the twin.
        reduced = super().__reduce_ex__(protocol)
        assert isinstance(reduced, tuple)  # objects without __reduce__ of their own
        return (_new_twin, (self._twin_of,), *reduced[2:])

    def state_dict(self) -> Any:
        """Return the wrapped loader's state as of the last item you received.

        Items read ahead (by a thread, or in flight on the device) are not
        counted, so :meth:`load_state_dict` resumes right after the last item
        your loop saw, through any stack of wrappers.

        Raises:
            NotStatefulError: If the wrapped loader's ``state_dict()`` raised
                (the error names it and is chained).

        Example:
            >>> from torchdata.stateful_dataloader import StatefulDataLoader
            >>> from prefetch import BackgroundLoader
            >>> loader = BackgroundLoader(StatefulDataLoader(list(range(6))), depth=4)
            >>> iterator = iter(loader)
            >>> [next(iterator).item() for _ in range(2)]
            [0, 1]
            >>> state = loader.state_dict()  # the thread may be further ahead: not counted
            >>> loader.load_state_dict(state)
            >>> [batch.item() for batch in loader]
            [2, 3, 4, 5]
        """
        state = read_state(self._loader) if self._epoch is None else self._epoch.state
        if isinstance(state, StateUnavailable):
            msg = f"{type(self).__name__}.state_dict() has no state to give: {state.describe()}"
            raise NotStatefulError(msg) from state.error
        return state

    def load_state_dict(self, state_dict: Any) -> None:
        """Stop any running epoch and load ``state_dict`` into the wrapped loader.

        The next ``iter()`` resumes from that state.
        """
        self._stop_epoch(wait=True)
        self._epoch = None
        self._loader.load_state_dict(state_dict)


_TWINS: dict[type[LoaderWrapper], type[LoaderWrapper]] = {}


def _new_twin(cls: type[LoaderWrapper]) -> LoaderWrapper:
    """Unpickle a stateful wrapper: an empty instance of ``cls``'s twin."""
    twin = _stateful_twin(cls)
    return twin.__new__(twin)


def _stateful_twin(cls: type[LoaderWrapper]) -> type[LoaderWrapper]:
    """Return the subclass of ``cls`` that also is :class:`Checkpointing` (made once)."""
    twin = _TWINS.get(cls)
    if twin is None:
        namespace: dict[str, Any] = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "_twin_of": cls,
        }
        twin = type(cls.__name__, (cls, Checkpointing), namespace)
        _TWINS[cls] = twin
    return twin
