"""The stack's order: which wrappers must not run in another wrapper's background thread.

A wrapper whose epochs must run on the thread that called ``iter()``
declares ``_runs_on_consumer_thread`` (see
:class:`~prefetch._shared.wrapper.LoaderWrapper`); a wrapper that iterates
its loader in a thread of its own looks for one inside what it wraps, at
construction, and refuses the stack.
"""

from __future__ import annotations

from typing import Any

from prefetch._shared.wrapper import LoaderWrapper


def consumer_thread_wrapper(loader: Any, limit: int = 32) -> LoaderWrapper | None:
    """Return the first wrapper in ``loader`` that must run on the consumer's thread, if any.

    It follows ``.loader`` from ``loader`` inwards (through this package's
    wrappers and any other object that names what it wraps ``loader``), at
    most ``limit`` levels. A wrapper that iterates its loader in a thread of
    its own calls it to refuse a wrong stack at construction.

    Example:
        >>> consumer_thread_wrapper([1, 2]) is None
        True
    """
    seen: set[int] = set()
    while loader is not None and id(loader) not in seen and len(seen) < limit:
        seen.add(id(loader))
        if isinstance(loader, LoaderWrapper):
            if loader._runs_on_consumer_thread:
                return loader
            loader = loader.loader
            continue
        try:
            loader = getattr(loader, "loader", None)
        except Exception:  # a property of someone else's object: stop looking
            return None
    return None


def check_stack_order(loader: Any, caller: str) -> None:
    """Refuse ``caller(loader)`` when ``loader`` holds a wrapper that must run on the loop's thread.

    Raises:
        TypeError: naming that wrapper and the order to stack them in.
    """
    inner = consumer_thread_wrapper(loader)
    if inner is not None:
        name = type(inner).__name__
        msg = (
            f"{caller}({name}(...)) is the wrong order: a {name} must run on "
            f"the training loop's thread (its stream waits target that thread's current "
            f"stream), not in a background thread; stack them the other way: "
            f"{name}({caller}(...))"
        )
        raise TypeError(msg)
