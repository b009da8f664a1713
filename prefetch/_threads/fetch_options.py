"""``BackgroundLoader``'s thread options: the ``fetch_threads`` ceilings, ``thread_init_fn``.

* A count no machine can use is refused (above
  :data:`~prefetch._shared.arguments.MAX_FETCH_THREADS`, in
  :func:`~prefetch._shared.arguments.check_fetch_threads`); one above
  :data:`THREADS_PER_CORE` per core warns (:func:`warn_many_threads`), saying
  why it cannot help.
* ``fetch_threads="auto"`` never grows past its ceiling: the policy's
  maximum, and the DataLoader's batches per epoch (:func:`epoch_batches`): a
  thread reads a whole batch, so more threads than batches have nothing to read.
* :func:`check_thread_init_fn`: ``thread_init_fn`` is a function, and only
  for fetch threads.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch

from prefetch._shared.pinning import select_device
from prefetch._shared.user_frame import user_stacklevel
from prefetch._threads.fetch_info import call_thread_init
from prefetch._threads.parallel_fetch import check_parallel_loader
from prefetch._threads.policy import THREADS, Control, Fixed
from prefetch._threads.thread_policy import ThreadPolicy
from prefetch._threads.thread_windows import available_cores
from prefetch._torch.intra_op import set_thread_intra_op_threads

THREADS_PER_CORE = 32
"""Fetch threads per core past which a fixed count warns: even threads that wait on
storage 97% of the time keep every core busy at this many."""


class BackgroundSettings(NamedTuple):
    """A :class:`~prefetch.BackgroundLoader`'s options, as it resolved them (its ``settings``)."""

    depth: int | Literal["auto"]
    """``"auto"``, or the fixed depth."""
    max_depth: int
    """An adaptive depth's ceiling (the fixed depth otherwise)."""
    max_bytes: int | None
    """Most tensor bytes buffered, or ``None`` for no limit."""
    pin_memory: bool
    """Whether batches are pinned in the thread (false without an accelerator)."""
    num_threads: int | None
    """Intra-op threads of each loading thread's torch ops (1 with ``fetch_threads`` unless
    set), or ``None``: torch's default."""
    fetch_threads: int | Literal["auto"] | None
    """Threads reading a DataLoader in parallel, ``"auto"``, or ``None`` (one thread)."""
    fetch_grain: str
    """``"sample"`` or ``"batch"`` (with ``fetch_threads``)."""
    in_order: bool
    """Whether batches are handed over in sampler order."""
    timeout: float | None
    """Most seconds the loop waits for an item, or ``None``."""


def thread_control(
    loader: Any,
    fetch_threads: int | Literal["auto"] | None,
    max_bytes: int | None,
    grain: str = "sample",
) -> Control:
    """The thread count of a ``BackgroundLoader`` (checked ``fetch_threads``): fixed or adaptive.

    A fixed count above :data:`THREADS_PER_CORE` per core warns; ``"auto"``
    is bounded by the loader's batches per epoch and ``max_bytes``.
    """
    if fetch_threads == "auto":
        if grain == "sample":  # threads share each batch: neither bound applies
            return ThreadPolicy(sample_grain=True)
        return ThreadPolicy(max_bytes=max_bytes, batches=epoch_batches(loader))
    if fetch_threads is None:
        return Fixed(THREADS, 1)
    warn_many_threads(fetch_threads, available_cores(), "BackgroundLoader")
    return Fixed(THREADS, fetch_threads)


def fetchable(loader: object) -> bool:
    """Whether ``fetch_threads`` could read ``loader`` (a map-style single-process DataLoader)."""
    try:
        check_parallel_loader(loader, "BackgroundLoader")
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: torch changed, or switched off
        return False
    return True


def warn_many_threads(count: int, cores: int, owner: str) -> None:
    """Warn once if ``count`` fetch threads exceed :data:`THREADS_PER_CORE` per core.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_many_threads(64, 2, "BackgroundLoader")
        ...     warn_many_threads(65, 2, "BackgroundLoader")
        >>> [str(w.message)[:70] for w in caught]
        ['BackgroundLoader(fetch_threads=65): more than 32 threads per core (2 c']
    """
    most = THREADS_PER_CORE * cores
    if count <= most:
        return
    plural = "core" if cores == 1 else "cores"
    message = (
        f"{owner}(fetch_threads={count}): more than {THREADS_PER_CORE} threads per core "
        f"({cores} {plural} here, so {most} at most) cannot help: even threads that wait on "
        f"storage 97% of the time keep every core busy at {most}, the rest wait for a core "
        f"and the GIL, and each holds a batch in flight ({count} batches read ahead). "
        "fetch_threads='auto' finds the count that pays"
    )
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def epoch_batches(loader: Any) -> int | None:
    """The loader's batches per epoch (``len``), or ``None`` if it has no length.

    Example:
        >>> epoch_batches(range(3)), epoch_batches(iter(range(3)))
        (3, None)
    """
    try:
        return max(1, len(loader))
    except TypeError:  # a sampler without a length
        return None


def check_thread_init_fn(init: object, fetch_threads: object, owner: str) -> None:
    """Refuse a ``thread_init_fn`` that is not callable, or is given without ``fetch_threads``.

    Example:
        >>> check_thread_init_fn(print, None, "BackgroundLoader")
        Traceback (most recent call last):
        ...
        ValueError: BackgroundLoader(thread_init_fn=...) runs in each parallel-fetch thread, so it needs fetch_threads=N or 'auto', got fetch_threads=None (one thread produces the items; set it up with num_threads=, or in the loader itself)
    """  # noqa: E501
    if init is None:
        return
    if not callable(init):
        msg = (
            f"{owner}(thread_init_fn=...) expects a function of the thread's index, or None, "
            f"got {type(init).__name__} {init!r:.60}"
        )
        raise TypeError(msg)
    if fetch_threads is None:
        msg = (
            f"{owner}(thread_init_fn=...) runs in each parallel-fetch thread, so it needs "
            "fetch_threads=N or 'auto', got fetch_threads=None (one thread produces the "
            "items; set it up with num_threads=, or in the loader itself)"
        )
        raise ValueError(msg)


GRAINS = ("sample", "batch")
"""What a fetch thread reads at a time: one sample (or chunk), or a whole batch."""


def check_fetch_grain(grain: object, fetch_threads: object, owner: str) -> str:
    """Return a valid ``fetch_grain``; refuse another value, or ``"batch"`` without fetch threads.

    Example:
        >>> check_fetch_grain("samples", 4, "BackgroundLoader")
        Traceback (most recent call last):
        ...
        ValueError: BackgroundLoader(fetch_grain=...) expects 'sample' or 'batch', got 'samples'
    """
    if not isinstance(grain, str) or grain not in GRAINS:
        msg = f"{owner}(fetch_grain=...) expects 'sample' or 'batch', got {grain!r:.60}"
        raise ValueError(msg)
    if grain != "sample" and fetch_threads is None:
        msg = (
            f"{owner}(fetch_grain={grain!r}) sets how fetch threads split the reads, so it "
            "needs fetch_threads=N or 'auto', got fetch_threads=None"
        )
        raise ValueError(msg)
    return grain


OUT_OF_ORDER = (
    "it was built with in_order=False: batches arrive as they are ready, so no state "
    "marks a point before which every batch was seen (use in_order=True to checkpoint)"
)
"""Why a loader that delivers out of order cannot checkpoint (the error's reason)."""


def check_in_order(in_order: object, fetch_threads: object, owner: str) -> bool:
    """Return ``in_order``; refuse a non-bool, or ``False`` without fetch threads.

    Example:
        >>> check_in_order("no", 4, "BackgroundLoader")
        Traceback (most recent call last):
        ...
        TypeError: BackgroundLoader(in_order=...) expects True or False, got 'no'
    """
    if not isinstance(in_order, bool):
        msg = f"{owner}(in_order=...) expects True or False, got {in_order!r:.60}"
        raise TypeError(msg)
    if not in_order and fetch_threads is None:
        msg = (
            f"{owner}(in_order=False) lets fetch threads hand over batches as they are "
            "ready, so it needs fetch_threads=N or 'auto', got fetch_threads=None"
        )
        raise ValueError(msg)
    return in_order


FETCH_THREAD_INTRA_OP = 1
"""Intra-op threads of each fetch thread unless ``num_threads`` says otherwise: one, as
each DataLoader worker process sets for itself (``fetch_threads`` is their counterpart)."""


def intra_op_threads(num_threads: int | None, fetch_threads: object) -> int | None:
    """The intra-op thread count of an epoch's threads (``None``: torch's, unchanged).

    ``num_threads`` if given, else one with ``fetch_threads``, else ``None``.

    Example:
        >>> intra_op_threads(None, None), intra_op_threads(None, 4), intra_op_threads(3, 4)
        (None, 1, 3)
    """
    if num_threads is None and fetch_threads is not None:
        return FETCH_THREAD_INTRA_OP
    return num_threads


def thread_setup(
    device: int | None,
    intra_op: int | None,
    init: Callable[[int], object] | None,
    *,
    asked: bool,
) -> Callable[[], None] | None:
    """What each thread of an epoch runs first (``None`` if nothing).

    It selects ``device`` (for pinning), sets the thread's own intra-op
    thread count to ``intra_op`` (:mod:`prefetch._torch.intra_op`; where it
    cannot, a count the user ``asked`` for falls back to the process-wide
    ``torch.set_num_threads``) and calls ``thread_init_fn``.
    """
    if device is None and intra_op is None and init is None:
        return None

    def setup() -> None:
        select_device(device)
        if intra_op is not None and not set_thread_intra_op_threads(intra_op) and asked:
            torch.set_num_threads(intra_op)
        if init is not None:
            call_thread_init(init)

    return setup
