"""Keywords a wrapper does not take: what to do instead, or what was meant.

``BackgroundLoader(dataset, num_workers=2)`` is a natural first try, and
Python's own error ("unexpected keyword argument") says nothing about where
the keyword belongs. :func:`explain_keywords` wraps the constructor: a
keyword of ``DataLoader`` gets an error that says to pass it to the
``DataLoader`` (and, for ``num_workers``, that ``fetch_threads`` reads in
threads); ``prefetch_generator``'s ``max_prefetch`` is pointed to ``depth``;
a keyword of the wrapper the owner stacks on (``CudaPrefetcher``'s
``fetch_threads``, BackgroundLoader's) is pointed to that wrapper; any other
unknown keyword fails as before, naming the close matches.

Invariants:

* **Nothing accepted that was refused before.** The wrapper only reads the
  keywords the constructor does not declare and raises ``TypeError`` for
  them; every declared one reaches the constructor untouched.
* **Signatures unchanged.** ``inspect.signature``, Sphinx and type checkers
  see the constructor's own signature (``functools.wraps`` and a
  ``ParamSpec``), so a static checker still flags the wrong keyword.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple, ParamSpec, TypeVar

from torch.utils.data import DataLoader

P = ParamSpec("P")
R = TypeVar("R")

DATALOADER_ADVICE = {
    "num_workers": (
        "num_workers starts a DataLoader's worker processes: pass it to the DataLoader you "
        "wrap, {owner}(DataLoader(..., num_workers={value})). To read a map-style "
        "DataLoader's batches in threads instead (no processes), use "
        "{threads}; num_threads is something else "
        "(torch's intra-op threads for the torch ops in the loading thread)"
    ),
    "prefetch_factor": (
        "prefetch_factor is how many batches each DataLoader worker prepares ahead: pass it "
        "to the DataLoader (it needs num_workers > 0). {owner}'s own read-ahead is depth=N"
    ),
    "persistent_workers": (
        "persistent_workers keeps a DataLoader's worker processes between epochs: pass it "
        "to the DataLoader (it needs num_workers > 0)"
    ),
}
"""Advice for the DataLoader keywords people pass to the wrapper most often."""

OTHER_ADVICE = {
    "max_prefetch": (
        "max_prefetch is prefetch_generator's bound: BackgroundLoader's is depth=N (or use "
        "prefetch.compat.BackgroundGenerator, which takes max_prefetch)"
    ),
}


def _shown(value: Any) -> str:
    """``repr(value)`` for a short plain value, else ``...`` (a dataset's repr can be huge)."""
    text = repr(value)
    plain = value is None or isinstance(value, bool | int | float | str)
    return text if plain and len(text) <= 40 else "..."


class Below(NamedTuple):
    """The wrapper an owner stacks on for what it does not do itself (its keywords)."""

    name: str
    """Its name: ``"BackgroundLoader"``."""
    keywords: frozenset[str]
    """The keywords it takes."""


def keyword_advice(
    owner: str, name: str, value: Any, accepted: list[str], below: Below | None = None
) -> str:
    """Say what to do about ``owner(name=value)``, a keyword ``owner`` does not take.

    A keyword of ``below`` (the wrapper ``owner`` stacks on) is pointed to it.

    Example:
        >>> keyword_advice("BackgroundLoader", "fetch_thread", 2, ["depth", "fetch_threads"])
        "BackgroundLoader() got an unexpected keyword argument 'fetch_thread'; did you mean 'fetch_threads'?"
        >>> below = Below("BackgroundLoader", frozenset({"fetch_threads"}))
        >>> keyword_advice("CudaPrefetcher", "fetch_threads", 4, ["depth"], below)
        "CudaPrefetcher() got an unexpected keyword argument 'fetch_threads': fetch_threads is BackgroundLoader's: stack them, CudaPrefetcher(BackgroundLoader(loader, fetch_threads=4))"
    """  # noqa: E501
    text = f"{owner}() got an unexpected keyword argument {name!r}"
    shown = _shown(value)
    if name in DATALOADER_ADVICE:
        threads = (
            f"{owner}(DataLoader(...), fetch_threads={shown})"
            if below is None
            else f"{owner}({below.name}(DataLoader(...), fetch_threads={shown}))"
        )
        advice = DATALOADER_ADVICE[name].format(owner=owner, value=shown, threads=threads)
        return f"{text}: {advice}"
    if below is not None and name in below.keywords:
        return (
            f"{text}: {name} is {below.name}'s: stack them, "
            f"{owner}({below.name}(loader, {name}={shown}))"
        )
    if name in OTHER_ADVICE:
        return f"{text}: {OTHER_ADVICE[name]}"
    if name in inspect.signature(DataLoader.__init__).parameters:
        return (
            f"{text}: {name} is a DataLoader argument: pass it to the DataLoader you wrap, "
            f"{owner}(DataLoader(..., {name}={_shown(value)}))"
        )
    close = difflib.get_close_matches(name, accepted, n=3, cutoff=0.6)
    if close:
        return f"{text}; did you mean {' or '.join(repr(match) for match in close)}?"
    return f"{text}; it takes {', '.join(accepted)}"


def keywords_of(owner: Callable[..., Any]) -> frozenset[str]:
    """The keywords ``owner`` (a class, or its constructor) takes by name.

    Example:
        >>> class Loader:
        ...     def __init__(self, loader, *, depth=2): ...
        >>> sorted(keywords_of(Loader))
        ['depth', 'loader']
    """
    return frozenset(_accepted(inspect.signature(owner).parameters))


def _accepted(parameters: Any) -> list[str]:
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name, p in parameters.items() if name != "self" and p.kind in named]


def explain_keywords(
    owner: str, below: Below | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap a constructor so an unknown keyword raises ``TypeError`` saying what to do instead.

    ``below``: the wrapper ``owner`` stacks on, whose keywords are pointed to it.

    Example:
        >>> class Loader:
        ...     @explain_keywords("Loader")
        ...     def __init__(self, loader, *, depth=2): self.depth = depth
        >>> Loader([], deph=3)
        Traceback (most recent call last):
        ...
        TypeError: Loader() got an unexpected keyword argument 'deph'; did you mean 'depth'?
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        accepted = _accepted(inspect.signature(function).parameters)

        @functools.wraps(function)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            unknown = [name for name in kwargs if name not in accepted]
            if unknown:
                msg = "; ".join(
                    keyword_advice(owner, name, kwargs[name], accepted, below) for name in unknown
                )
                raise TypeError(msg)
            return function(*args, **kwargs)

        return checked

    return decorate
