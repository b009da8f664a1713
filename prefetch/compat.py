"""Drop-in replacements for ``prefetch_generator``, built on the same engine.

Change only the import::

    # from prefetch_generator import BackgroundGenerator, background
    from prefetch.compat import BackgroundGenerator, background

and existing code keeps working, with the guarantees of
:class:`~prefetch.BackgroundLoader`: an early ``break`` or garbage collection
stops the thread (and DataLoader workers), ``KeyboardInterrupt`` and
``SystemExit`` raised by the generator reach you instead of silently ending
the data, a dead thread never hangs you, and ``max_prefetch=N`` holds exactly
``N`` items (the original holds ``N + 1``). As in the original, the thread
starts at construction and the object is single-use; ``max_prefetch <= 0``
means no bound.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from prefetch._adaptive_depth import FixedDepth
from prefetch._arguments import check_iterable
from prefetch._background_iterator import BackgroundIterator
from prefetch._stats import EpochRecord
from prefetch._thread_worker import ProducerSpec

__all__ = ["BackgroundGenerator", "background", "prefetch"]

T = TypeVar("T")


def _check_max_prefetch(max_prefetch: object) -> int:
    if isinstance(max_prefetch, bool) or not isinstance(max_prefetch, int):
        msg = (
            f"BackgroundGenerator(max_prefetch=...) expects an int, got {max_prefetch!r} "
            f"of type {type(max_prefetch).__name__}"
        )
        raise TypeError(msg)
    return max_prefetch if max_prefetch >= 1 else sys.maxsize


class BackgroundGenerator(BackgroundIterator[T]):
    """Iterate ``generator`` in a background thread, ``max_prefetch`` items ahead.

    Same signature as ``prefetch_generator.BackgroundGenerator``; the thread
    starts now.

    Args:
        generator: Any iterable or iterator; it is drained by the thread.
        max_prefetch: Items held ahead, at most; ``<= 0`` for no bound.
        preprocess_func: Applied to each item in the thread (deprecated in
            the original too; kept so old calls keep working).

    Example:
        >>> def squares():
        ...     for i in range(4):
        ...         yield i * i
        >>> list(BackgroundGenerator(squares(), max_prefetch=2))
        [0, 1, 4, 9]
    """

    def __init__(
        self,
        generator: Iterable[T],
        max_prefetch: int = 1,
        preprocess_func: Callable[[Any], T] | None = None,
    ) -> None:
        self._init(generator, max_prefetch, owned=False, preprocess_func=preprocess_func)

    def _init(
        self,
        generator: Iterable[T],
        max_prefetch: int,
        *,
        owned: bool,
        preprocess_func: Callable[[Any], T] | None = None,
    ) -> None:
        check_iterable(generator, "BackgroundGenerator")
        depth = _check_max_prefetch(max_prefetch)
        if preprocess_func is not None and not callable(preprocess_func):
            msg = (
                f"BackgroundGenerator(preprocess_func=...) expects a callable, "
                f"got {preprocess_func!r}"
            )
            raise TypeError(msg)
        super().__init__(
            iter(generator),
            EpochRecord(None),
            control=FixedDepth(depth),
            max_bytes=None,
            producer=ProducerSpec(owned=owned, prepare=preprocess_func),
        )

    def next(self) -> T:
        """Return the next item (Python 2 style alias kept for drop-in use)."""
        return self.__next__()


def background(
    max_prefetch: int = 1,
) -> Callable[[Callable[..., Iterable[T]]], Callable[..., BackgroundGenerator[T]]]:
    """Decorate a generator function so each call iterates in a background thread.

    Same signature as ``prefetch_generator.background``. The generator the
    call creates belongs to the wrapper, so stopping early also closes it
    (its ``finally`` blocks run).

    Example:
        >>> @background(max_prefetch=3)
        ... def count(n):
        ...     yield from range(n)
        >>> sum(count(10))
        45
    """
    _check_max_prefetch(max_prefetch)

    def decorator(function: Callable[..., Iterable[T]]) -> Callable[..., BackgroundGenerator[T]]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> BackgroundGenerator[T]:
            generator: BackgroundGenerator[T] = BackgroundGenerator.__new__(BackgroundGenerator)
            generator._init(function(*args, **kwargs), max_prefetch, owned=True)
            return generator

        return wrapper

    return decorator


prefetch = background
"""Alias of :func:`background`, as in ``prefetch_generator``."""
