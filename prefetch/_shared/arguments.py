"""Argument checks shared by the wrappers: errors that name the argument and the value."""

from __future__ import annotations

import math
from typing import Literal


def check_iterable(loader: object, owner: str, argument: str = "loader") -> None:
    """Raise ``TypeError`` naming ``owner`` and ``argument`` if ``loader`` cannot be iterated.

    As ``iter()`` does, it looks on the type: a class (``DataLoader`` instead of
    ``DataLoader(...)``) has ``__iter__`` as an attribute and still cannot be
    iterated, unless its metaclass makes it iterable (an ``Enum``).
    """
    kind = type(loader)
    if not (hasattr(kind, "__iter__") or hasattr(kind, "__getitem__")):
        if isinstance(loader, type):
            msg = (
                f"{owner}({argument}=...) expects an iterable, got the class "
                f"{loader.__name__} itself (an instance, such as {loader.__name__}(...)?)"
            )
        else:
            msg = (
                f"{owner}({argument}=...) expects an iterable, got "
                f"{type(loader).__name__} {loader!r:.80}"
            )
        raise TypeError(msg)


def check_depth(depth: object, owner: str) -> int:
    """Return ``depth`` if it is an int >= 1, else raise naming the argument."""
    if isinstance(depth, bool) or not isinstance(depth, int):
        msg = (
            f"{owner}(depth=...) expects an int >= 1, got {depth!r} of type {type(depth).__name__}"
        )
        if depth == "auto":
            msg += "; depth='auto' is a BackgroundLoader option (stack one underneath)"
        raise TypeError(msg)
    if depth < 1:
        msg = f"{owner}(depth=...) expects an int >= 1, got {depth}"
        raise ValueError(msg)
    return depth


def check_bool(value: object, argument: str, owner: str) -> bool:
    """Return ``value`` if it is a bool, else raise ``TypeError`` naming the argument."""
    if not isinstance(value, bool):
        msg = f"{owner}({argument}=...) expects a bool, got {value!r}"
        raise TypeError(msg)
    return value


def check_count(value: object, argument: str, owner: str, expected: str = "an int >= 1") -> int:
    """Return ``value`` if it is an int >= 1, else raise naming the argument and ``expected``."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{owner}({argument}=...) expects {expected}, got {value!r}"
        raise TypeError(msg)
    if value < 1:
        msg = f"{owner}({argument}=...) expects {expected}, got {value}"
        raise ValueError(msg)
    return value


def check_optional_count(value: object, argument: str, owner: str) -> int | None:
    """Return ``value`` if it is ``None`` or an int >= 1, else raise naming the argument."""
    if value is None:
        return None
    return check_count(value, argument, owner, "None or an int >= 1")


def check_loader_depth(depth: object, max_depth: object, owner: str) -> int | None:
    """Return a fixed depth, or ``None`` for ``"auto"``; check ``max_depth`` goes with it.

    ``max_depth`` (``None`` or an int >= 1) only applies to ``depth="auto"``.
    """
    if isinstance(depth, str):
        if depth != "auto":
            msg = f"{owner}(depth=...) expects 'auto' or an int >= 1, got {depth!r}"
            raise ValueError(msg)
        check_optional_count(max_depth, "max_depth", owner)
        return None
    if isinstance(depth, bool) or not isinstance(depth, int):
        msg = (
            f"{owner}(depth=...) expects 'auto' or an int >= 1, got {depth!r} "
            f"of type {type(depth).__name__}"
        )
        raise TypeError(msg)
    if depth < 1:
        msg = f"{owner}(depth=...) expects 'auto' or an int >= 1, got {depth}"
        raise ValueError(msg)
    if max_depth is not None:
        msg = (
            f"{owner}(max_depth=...) only applies with depth='auto', got max_depth={max_depth!r} "
            f"with depth={depth}; a fixed depth is its own maximum"
        )
        raise ValueError(msg)
    return depth


MAX_FETCH_THREADS = 256
"""Most ``fetch_threads`` a loader takes: each thread holds a batch in flight, so 256
threads read 256 batches ahead; storage that needs more concurrency wants another design."""


def check_fetch_threads(value: object, owner: str) -> int | Literal["auto"] | None:
    """Return ``fetch_threads`` if it is ``None``, ``"auto"`` or an int from 1 to 256, else raise.

    Example:
        >>> check_fetch_threads(1000, "BackgroundLoader")
        Traceback (most recent call last):
        ...
        ValueError: BackgroundLoader(fetch_threads=...) expects None, 'auto' or an int from 1 to 256, got 1000: each thread holds a batch in flight, so 1000 threads would read 1000 batches ahead; fetch_threads='auto' finds the count that pays
    """  # noqa: E501
    if value is None:
        return None
    if value == "auto":
        return "auto"
    expected = f"None, 'auto' or an int from 1 to {MAX_FETCH_THREADS}"
    count = check_count(value, "fetch_threads", owner, expected)
    if count > MAX_FETCH_THREADS:
        msg = (
            f"{owner}(fetch_threads=...) expects {expected}, got {count}: each thread holds "
            f"a batch in flight, so {count} threads would read {count} batches ahead; "
            "fetch_threads='auto' finds the count that pays"
        )
        raise ValueError(msg)
    return count


def check_timeout(value: object, owner: str) -> float | None:
    """Return a timeout in seconds, or ``None`` for none (``None``, ``0`` or infinity).

    ``0`` means no timeout, as ``DataLoader(timeout=0)`` does.

    Example:
        >>> check_timeout(2, "BackgroundLoader"), check_timeout(0, "BackgroundLoader")
        (2.0, None)
        >>> check_timeout(-1, "BackgroundLoader")
        Traceback (most recent call last):
        ...
        ValueError: BackgroundLoader(timeout=...) expects None or seconds >= 0 (0: no timeout, as in DataLoader), got -1
    """  # noqa: E501
    if value is None:
        return None
    expected = "None or seconds >= 0 (0: no timeout, as in DataLoader)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = (
            f"{owner}(timeout=...) expects {expected}, got {value!r} of type {type(value).__name__}"
        )
        raise TypeError(msg)
    if not value >= 0:  # negative, or NaN
        msg = f"{owner}(timeout=...) expects {expected}, got {value!r}"
        raise ValueError(msg)
    if value == 0 or math.isinf(value):
        return None
    return float(value)
