"""Drop-in replacements for ``prefetch_generator``, built on the same engine.

Change only the import::

    # from prefetch_generator import BackgroundGenerator, background
    from prefetch.compat import BackgroundGenerator, background

and existing code keeps working: the same signatures, the thread starts at
construction, the object is single-use, ``max_prefetch=N`` buffers what the
original buffers (``N`` items queued plus the one the thread holds, ``N + 1``
ahead of you; ``max_prefetch <= 0`` means no bound), and the thread-like
``join()``, ``is_alive()``, ``daemon`` and ``name`` answer as the original's.
What changes is what goes wrong, with the guarantees of
:class:`~prefetch.BackgroundLoader`: an early ``break`` or garbage collection
stops the thread (and DataLoader workers), ``KeyboardInterrupt`` and
``SystemExit`` raised by the generator reach you instead of silently ending
the data, and a dead thread never hangs you.

It is not a :class:`threading.Thread` (the thread must not hold the object,
or garbage collection could not stop it): ``isinstance(g, threading.Thread)``
is false; ``start()`` raises as it does on a started thread; ``daemon`` and
``name`` are read-only; the original's internals (``queue``, ``generator``,
``Continue``, ``run``) do not exist.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

from prefetch._shared.arguments import check_iterable
from prefetch._shared.stats import LoaderStats
from prefetch._threads.iterator import BackgroundIterator, started_threads
from prefetch._threads.loader import BackgroundLoader

__all__ = ["BackgroundGenerator", "background", "prefetch"]

T = TypeVar("T")


def _check_max_prefetch(max_prefetch: object, caller: str = "BackgroundGenerator") -> int:
    if isinstance(max_prefetch, bool) or not isinstance(max_prefetch, int):
        msg = (
            f"{caller}(max_prefetch=...) expects an int, got {max_prefetch!r} "
            f"of type {type(max_prefetch).__name__}"
        )
        raise TypeError(msg)
    return max_prefetch if max_prefetch >= 1 else sys.maxsize


def _depth(max_prefetch: int) -> int:
    """The depth that buffers what ``prefetch_generator`` buffers at ``max_prefetch``.

    Its thread fills a ``Queue(max_prefetch)`` and then holds one more item
    while it waits to put it: ``max_prefetch + 1`` items taken from the
    generator and not yet handed over.
    """
    depth = _check_max_prefetch(max_prefetch)
    return depth if depth == sys.maxsize else depth + 1


class _Preprocessed(Iterator[T]):
    """``preprocess_func`` over the generator's items, in the thread that draws them."""

    def __init__(self, source: Iterator[Any], function: Callable[[Any], T]) -> None:
        self._source, self._function = source, function

    def __next__(self) -> T:
        item = next(self._source)
        try:
            return self._function(item)
        except StopIteration as error:  # not the end of the data: an error of the function
            msg = "BackgroundGenerator(preprocess_func=...) raised StopIteration"
            raise RuntimeError(msg) from error


class _Owned(Iterable[T]):
    """A generator the wrapper created (``@background``): released, and closed, with the epoch."""

    def __init__(self, generator: Iterator[T]) -> None:
        self._generator = generator

    def __iter__(self) -> Iterator[T]:
        return self._generator


class BackgroundGenerator(Iterator[T], Generic[T]):
    """Iterate ``generator`` in a background thread, as ``prefetch_generator`` does.

    Same signature as ``prefetch_generator.BackgroundGenerator``; the thread
    starts now. ``join()``, ``is_alive()``, ``daemon`` and ``name`` answer
    for that thread. It is one epoch of a
    :class:`~prefetch.BackgroundLoader` with a fixed depth, started at once:
    ``stats``, ``close()`` and ``with`` work as on that loader's iterator.

    Args:
        generator: Any iterable or iterator; it is drained by the thread.
        max_prefetch: Queued items, at most, as in the original: the thread
            takes one more from ``generator`` while the queue is full
            (``max_prefetch + 1`` ahead); ``<= 0`` for no bound.
        preprocess_func: Applied to each item in the thread (deprecated in
            the original too; kept so old calls keep working).

    Example:
        >>> def squares():
        ...     for i in range(4):
        ...         yield i * i
        >>> generator = BackgroundGenerator(squares(), max_prefetch=2)
        >>> generator.daemon, generator.name.startswith("prefetch-")
        (True, True)
        >>> list(generator)
        [0, 1, 4, 9]
        >>> generator.join(timeout=5)
        >>> generator.is_alive()
        False
    """

    def __init__(
        self,
        generator: Iterable[T],
        max_prefetch: int = 1,
        preprocess_func: Callable[[Any], T] | None = None,
    ) -> None:
        check_iterable(generator, "BackgroundGenerator", "generator")
        if preprocess_func is not None and not callable(preprocess_func):
            msg = (
                f"BackgroundGenerator(preprocess_func=...) expects a callable, "
                f"got {preprocess_func!r}"
            )
            raise TypeError(msg)
        depth = _depth(max_prefetch)
        source: Iterable[Any] = generator
        if preprocess_func is not None:
            source = _Preprocessed(iter(generator), preprocess_func)
        iterator = cast("BackgroundIterator[T]", iter(BackgroundLoader(source, depth=depth)))
        iterator.start()  # at once: prefetch_generator starts its thread here
        self._iterator = iterator
        (self._thread,) = started_threads(iterator)

    def __next__(self) -> T:
        return self._iterator.__next__()

    def next(self) -> T:
        """Return the next item (Python 2 style alias kept for drop-in use)."""
        return self._iterator.__next__()

    @property
    def stats(self) -> LoaderStats:
        """The iteration's :class:`~prefetch.LoaderStats`."""
        return self._iterator.stats

    def close(self) -> None:
        """Stop the thread: items read ahead are dropped, a generator we made is closed."""
        self._iterator.close()

    def __enter__(self) -> BackgroundGenerator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the thread ends, as :meth:`threading.Thread.join`.

        The thread ends once the generator is exhausted (or raised) and what
        it produced fits in the buffer, or once the iteration stops early.
        """
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        """Return whether the thread is still running, as :meth:`threading.Thread.is_alive`."""
        return self._thread.is_alive()

    def start(self) -> None:
        """Raise :class:`RuntimeError`, as a started :class:`threading.Thread` does.

        The thread starts at construction, as in the original.
        """
        msg = "threads can only be started once (BackgroundGenerator starts at construction)"
        raise RuntimeError(msg)

    @property
    def daemon(self) -> bool:
        """Whether the thread is a daemon: always ``True``, as in the original (read-only)."""
        return self._thread.daemon

    @property
    def name(self) -> str:
        """The thread's name, ``prefetch-N`` (read-only)."""
        return self._thread.name

    @property
    def ident(self) -> int | None:
        """The thread's identifier, as :attr:`threading.Thread.ident`."""
        return self._thread.ident


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
    _check_max_prefetch(max_prefetch, "background")

    def decorator(function: Callable[..., Iterable[T]]) -> Callable[..., BackgroundGenerator[T]]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> BackgroundGenerator[T]:
            return BackgroundGenerator(_Owned(iter(function(*args, **kwargs))), max_prefetch)

        return wrapper

    return decorator


prefetch = background
"""Alias of :func:`background`, as in ``prefetch_generator``."""
