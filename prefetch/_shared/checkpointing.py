"""Whether a wrapper checkpoints is said by its class: one mechanism, here.

A framework checks for ``state_dict``/``load_state_dict`` to decide whether
to save a loader's state (Lightning does, at every checkpoint, and calls
them), so a wrapper over a plain ``DataLoader`` must not have them: not as
methods that raise, which ``hasattr`` (and, from Python 3.12,
``inspect.getattr_static``) would still find.

Invariants:

* **Twins.** Each wrapper class gets, once each, two twins: subclasses with
  the same name, one adding :class:`Checkpointing` (the two methods), the
  other :class:`NotCheckpointing` (neither: asked for, they raise
  :class:`~prefetch.NotStatefulError` saying why, which ``hasattr`` reads as
  absent, and they are never forwarded to the wrapped loader).
  :func:`adopt_state`, called at the end of every wrapper's ``__init__``,
  makes the wrapper an instance of one of them, by
  :func:`~prefetch._shared.stateful.state_problem`, and sets
  ``wrapper._stateful`` accordingly.
* **Demotion is final.** If the wrapped loader's ``state_dict()`` raises when
  an epoch starts (:meth:`Checkpointing._start_state`), the wrapper becomes
  its non-checkpointing twin, with the reason kept for the error.
* **Pickling** rebuilds the twin (it is not importable by its name).

This module is the declared partner of :mod:`prefetch._shared.wrapper`: it
reads and sets a wrapper's ``_stateful`` and ``_state_problem``, of the
wrapper it adopts and of the wrapper that one wraps, and reads ``_newest``.
"""

from __future__ import annotations

from typing import Any, SupportsIndex

from prefetch._shared.stateful import NotStatefulError, StateUnavailable, read_state, state_problem
from prefetch._shared.wrapper import LoaderWrapper

STATE_METHODS = ("state_dict", "load_state_dict")
"""What a checkpointing wrapper has and any other wrapper refuses."""


def adopt_state(wrapper: LoaderWrapper, own_problem: str | None = None) -> None:
    """Decide, when ``wrapper`` is built, whether it checkpoints (see the module).

    ``own_problem`` is the wrapper's own reason not to, whatever it wraps.
    """
    inner = wrapper.loader
    if own_problem is not None:
        wrapper._state_problem = own_problem
    elif isinstance(inner, LoaderWrapper):  # a wrapper below knows why already
        wrapper._state_problem = inner._state_problem
    else:
        wrapper._state_problem = state_problem(inner)
    wrapper._stateful = wrapper._state_problem is None
    wrapper.__class__ = _twin(_plain(type(wrapper)), wrapper._stateful)


class _Twin(LoaderWrapper):
    """What both twins share: the class they twin, and pickling through it."""

    _twin_of: type[LoaderWrapper]

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # A twin is not importable by name: pickle the class it twins, rebuild the twin.
        reduced = super().__reduce_ex__(protocol)
        assert isinstance(reduced, tuple)  # objects without __reduce__ of their own
        return (_new_twin, (self._twin_of, self._stateful), *reduced[2:])


class NotCheckpointing(_Twin):
    """A wrapper over a loader that cannot checkpoint: no ``state_dict``, said why."""

    def __getattr__(self, name: str) -> Any:
        if name in STATE_METHODS:  # never forwarded: the wrapped loader's would be wrong
            msg = (
                f"{type(self).__name__}.{name}() needs a loader with state_dict() and "
                f"load_state_dict() (such as torchdata's StatefulDataLoader); "
                f"{self._state_problem or 'it was not built over one'}"
            )
            raise NotStatefulError(msg)
        return super().__getattr__(name)


class Checkpointing(_Twin):
    """The methods a wrapper has only over a loader that can checkpoint.

    A wrapper built over a stateful loader is an instance of its class's
    checkpointing twin, which adds these; over any other loader it is a
    :class:`NotCheckpointing`, where both names raise
    :class:`~prefetch.NotStatefulError` (an ``AttributeError``, so ``hasattr``
    is false) that says why.
    """

    def _start_state(self) -> Any:
        """Read the wrapped loader's state as an epoch starts.

        If the read raises, this wrapper turns non-stateful for good (it loses
        ``state_dict``/``load_state_dict``) and remembers why; iteration goes on.
        """
        inner = self.loader
        state = read_state(inner)
        if isinstance(state, StateUnavailable):
            below = inner._state_problem if isinstance(inner, LoaderWrapper) else None
            self._state_problem = below or state.describe()
            self._stateful = False
            self.__class__ = _twin(self._twin_of, stateful=False)  # type: ignore[assignment]
            return None
        return state

    def state_dict(self) -> Any:
        """Return the wrapped loader's state as of the last item you received.

        Items read ahead (by a thread, or in flight on the device) are not
        counted, so :meth:`load_state_dict` resumes right after the last item
        your loop saw, through any stack of wrappers. Once the epoch has
        ended (``StopIteration``), it is the loader's state after its end,
        which resumes into the next full epoch, as the unwrapped loader's
        does. With several iterators open at once, it is the state of the
        one the most recent ``iter()`` returned.

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
        # The latest iter(), if still held and not started, is at its epoch's start, as a
        # plain loader's would be; one only looked at and dropped (Lightning's probe) is gone.
        newest = self._newest() if self._newest is not None else None
        if newest is not None:
            newest.start()
        del newest
        state = read_state(self._loader) if self._epoch is None else self._epoch.state.checkpoint
        if isinstance(state, StateUnavailable):
            msg = f"{type(self).__name__}.state_dict() has no state to give: {state.describe()}"
            raise NotStatefulError(msg) from state.error
        return state

    def load_state_dict(self, state_dict: Any) -> None:
        """Stop every running epoch and load ``state_dict`` into the wrapped loader.

        The next ``iter()`` resumes from that state. An iterator still open
        raises ``RuntimeError`` saying so on its next ``next()``.
        """
        why = f"{type(self).__name__}.load_state_dict() stopped this epoch: iter() again to resume"
        self._epochs.stop_all(reason=why, wait=True)
        self._epoch = None
        self._loader.load_state_dict(state_dict)


_TWINS: dict[tuple[type[LoaderWrapper], bool], type[LoaderWrapper]] = {}


def _plain(cls: type[LoaderWrapper]) -> type[LoaderWrapper]:
    """The wrapper class ``cls`` twins (``cls`` itself if it is no twin)."""
    return cls._twin_of if issubclass(cls, _Twin) else cls


def _new_twin(cls: type[LoaderWrapper], stateful: bool) -> LoaderWrapper:
    """Unpickle a wrapper: an empty instance of ``cls``'s twin."""
    twin = _twin(cls, stateful)
    wrapper: LoaderWrapper = object.__new__(twin)  # no loader yet: nothing to go inside
    return wrapper


def _twin(cls: type[LoaderWrapper], stateful: bool) -> type[LoaderWrapper]:
    """Return the subclass of ``cls`` that is also (Not)Checkpointing (each made once)."""
    twin = _TWINS.get((cls, stateful))
    if twin is None:
        namespace: dict[str, Any] = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "_twin_of": cls,
        }
        kind = Checkpointing if stateful else NotCheckpointing
        twin = type(cls.__name__, (cls, kind), namespace)
        _TWINS[(cls, stateful)] = twin
    return twin
