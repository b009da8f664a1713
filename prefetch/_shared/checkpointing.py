"""``Checkpointing``: ``state_dict``/``load_state_dict``, only where there is state.

A framework checks for ``state_dict``/``load_state_dict`` to decide whether
to save a loader's state (Lightning does, at every checkpoint, and calls
them), so a wrapper over a plain ``DataLoader`` must not have them: not as
methods that raise, which ``hasattr`` (and, from Python 3.12,
``inspect.getattr_static``) would still find.

Invariants:

* **Twins.** Each wrapper class gets, once, a twin: a subclass with the same
  name that adds :class:`Checkpointing`. :func:`adopt_state`, called when a
  wrapper is built, turns it into its twin exactly when
  :func:`~prefetch._shared.stateful.state_problem` finds the wrapped loader stateful,
  and sets ``wrapper._stateful`` accordingly.
* **Demotion is final.** If the wrapped loader's ``state_dict()`` raises when
  an epoch starts (:meth:`Checkpointing._start_state`), the wrapper goes back
  to the plain class, with ``_stateful`` false and the reason kept for the
  error.

This module is the declared partner of :mod:`prefetch._shared.wrapper`: it
reads and sets a wrapper's ``_stateful`` and ``_state_problem``, of the
wrapper it adopts and of the wrapper that one wraps.
* **Pickling** rebuilds the twin (it is not importable by its name).
"""

from __future__ import annotations

from typing import Any, SupportsIndex, cast

from prefetch._shared.stateful import NotStatefulError, StateUnavailable, read_state, state_problem
from prefetch._shared.wrapper import LoaderWrapper


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
    if wrapper._stateful and not isinstance(wrapper, Checkpointing):
        wrapper.__class__ = _stateful_twin(type(wrapper))


class Checkpointing(LoaderWrapper):
    """The methods a wrapper has only over a loader that can checkpoint.

    A wrapper built over a stateful loader is an instance of its class's twin,
    which adds these; over any other loader, both names raise
    :class:`~prefetch.NotStatefulError` (an ``AttributeError``, so ``hasattr``
    is false) that says why.
    """

    _twin_of: type[LoaderWrapper]

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
            self.__class__ = cast("type[Checkpointing]", self._twin_of)  # the plain class
            return None
        return state

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # The twin is not importable by name: pickle the class it twins, rebuild the twin.
        reduced = super().__reduce_ex__(protocol)
        assert isinstance(reduced, tuple)  # objects without __reduce__ of their own
        return (_new_twin, (self._twin_of,), *reduced[2:])

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
        self._settle()  # an epoch iter() gave and no next() started is at its start
        state = read_state(self._loader) if self._epoch is None else self._epoch.state
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
