"""Where an epoch leaves a seeded shuffle's generators: where the plain loop would.

A ``DataLoader`` shuffled with a ``generator`` draws from it as it goes:
``RandomSampler`` draws a permutation when its epoch starts and the next one
when it is asked past its last index (which drawing a short last batch does),
and with ``replacement=True`` it draws every 32 indices. A wrapper draws ahead
of the training loop, so a loop that stops early (a ``break``, Lightning's
``limit_train_batches``) would leave the generator further on than the plain
loader leaves it, and every later epoch would be shuffled differently.

So each item the wrapper hands over carries a :class:`Position`: the wrapped
loader's checkpoint state and its generators' states right after the item's
draw. When an epoch is over (ended, closed or dropped), the generators are
set to the position of the last item the loop received
(:meth:`SamplingGenerators.over`).

Invariants:

* **Only the wrapper's own draws are undone.** The generators are set back
  only if they are where the wrapper's latest draw left them: a draw by
  anything else since (another loader sharing the generator, your own
  ``manual_seed``) is kept, and the read-ahead's draws then stay too.
* **Never under a running draw.** An epoch whose thread is still inside the
  source when it stops (past the grace a ``close()`` gives it) is not set
  back: what the thread draws when the source returns would come after the
  setting.
* **The outermost epoch's position wins.** Nothing is set while another epoch
  over the same generators runs: in a stack the inner epoch stops first,
  while the outer one runs, and the outer one's position is set last. Two
  iterators of one loader at once draw in an order no wrapper can repeat;
  their generators are left where the threads left them.

A loop that draws from the loader's own generator as well sees its draws
interleaved with the thread's in another order than plain anyway; those it
made after the thread read the last received item's position are set back
with the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, Protocol

import torch
from torch.utils.data import DataLoader

_SEARCHED = ("sampler", "batch_sampler")
"""Attributes that may hold a sampler with a ``generator``, looked into from a DataLoader."""


Sampling = tuple[torch.Tensor, ...] | None
"""The sampling generators' states, in order (``None``: none)."""


class Position(NamedTuple):
    """Where the wrapped loader is after an item's draw.

    Example:
        >>> Position(None, None).checkpoint is None
        True
    """

    checkpoint: Any
    """Its ``state_dict()`` (``None``: it cannot checkpoint)."""
    sampling: Sampling
    """Its sampling generators' states (``None``: it has none)."""


class Joinable(Protocol):
    """A stopped epoch whose threads may still be inside the source."""

    def join(self, *, timeout: float, stuck_grace: float) -> bool:
        """Wait for the threads to leave the source; return whether they all did."""


def generators_of(loader: Any) -> tuple[torch.Generator, ...]:
    """The generators a ``DataLoader``'s sampling draws from, each once.

    Example:
        >>> generator = torch.Generator()
        >>> loader = DataLoader(range(4), shuffle=True, generator=generator)
        >>> generators_of(loader) == (generator,)
        True
        >>> generators_of([1, 2])
        ()
    """
    if not isinstance(loader, DataLoader):
        return ()
    found: dict[int, torch.Generator] = {}
    searched = [loader]
    for _ in range(3):  # a DataLoader, its batch sampler, the sampler inside that
        inside: list[Any] = []
        for part in searched:
            generator = getattr(part, "generator", None)
            if isinstance(generator, torch.Generator):
                found.setdefault(id(generator), generator)
            inside.extend(getattr(part, name, None) for name in _SEARCHED)
        searched = [part for part in inside if part is not None]
    return tuple(found.values())


def position_reader(
    read_checkpoint: Callable[[], Any] | None, read_sampling: Callable[[], Sampling] | None
) -> Callable[[], Position] | None:
    """What reads a :class:`Position` with these readers (``None``: there is nothing to read).

    Example:
        >>> position_reader(None, None) is None
        True
        >>> position_reader(lambda: {"seen": 3}, None)()
        Position(checkpoint={'seen': 3}, sampling=None)
    """
    if read_checkpoint is None and read_sampling is None:
        return None
    return partial(_read_position, read_checkpoint, read_sampling)


def _read_position(
    read_checkpoint: Callable[[], Any] | None, read_sampling: Callable[[], Sampling] | None
) -> Position:
    return Position(
        read_checkpoint() if read_checkpoint is not None else None,
        read_sampling() if read_sampling is not None else None,
    )


class SamplingGenerators:
    """A loader's sampling generators and the epochs that draw from them.

    Example:
        >>> generator = torch.Generator().manual_seed(0)
        >>> sampling = SamplingGenerators((generator,))
        >>> sampling.opened()
        >>> received = sampling.mark()  # the loop's last item was drawn here
        >>> first = torch.randperm(4, generator=generator)  # the read-ahead's draw
        >>> _ = sampling.mark()
        >>> sampling.over(received, inside=None)
        >>> torch.equal(torch.randperm(4, generator=generator), first)
        True
    """

    def __init__(self, generators: tuple[torch.Generator, ...]) -> None:
        self._generators = generators
        self._lock = threading.Lock()  # an epoch may be over on a thread that collects it
        self._running = 0  # epochs opened and not over
        self._inside: list[Joinable] = []  # stopped epochs whose threads may still draw
        self._last: tuple[torch.Tensor, ...] | None = None  # the states the latest mark read

    @classmethod
    def of(cls, loader: Any) -> SamplingGenerators | None:
        """Those of ``loader`` (a ``DataLoader``), or ``None`` if it has none."""
        generators = generators_of(loader)
        return cls(generators) if generators else None

    def mark(self) -> tuple[torch.Tensor, ...]:
        """The generators' states now (right after a draw of the wrapper's)."""
        states = self._last = tuple(generator.get_state() for generator in self._generators)
        return states

    def opened(self) -> None:
        """An epoch that draws from the generators has started."""
        with self._lock:
            self._running += 1

    def over(self, sampling: Sampling, inside: Joinable | None) -> None:
        """An epoch is over; the last item its loop received was drawn at ``sampling``.

        ``inside`` is the epoch if its threads may still be in the source.
        The generators are set to ``sampling`` only if nothing can draw
        after the setting and nothing else drew since the wrapper's last draw.
        """
        with self._lock:
            self._running -= 1
            if inside is not None:
                self._inside.append(inside)
            self._inside = [
                epoch for epoch in self._inside if not epoch.join(timeout=0.0, stuck_grace=0.0)
            ]
            if self._running or self._inside or sampling is None or not self._untouched():
                return  # an outer epoch sets its own position when it is over
            self._set(sampling)

    def _untouched(self) -> bool:
        """Whether the generators are where the latest mark read them (no other draw since)."""
        last = self._last
        return last is not None and all(
            torch.equal(generator.get_state(), state)
            for generator, state in zip(self._generators, last, strict=True)
        )

    def _set(self, sampling: tuple[torch.Tensor, ...]) -> None:
        for generator, state in zip(self._generators, sampling, strict=True):
            generator.set_state(state)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SamplingGenerators, (self._generators,))  # a copied wrapper runs no epoch
