"""``BackgroundLoader(timeout=...)``: how long the loop waits for the next item, at most.

The engine (:meth:`~prefetch._threads.consumer_side.ConsumerSide.exchange`) times the
consumer's wait; when it passes the :class:`Timeout`, the engine stops and
the loop gets a :class:`LoaderTimeoutError` in the place of the item it
waited for, as a final error: the epoch is over, its threads are asked to
leave (one inside a slow read leaves when the read returns) and nothing
fetched is kept.
"""

from __future__ import annotations

from typing import NamedTuple

from torch.utils.data import DataLoader


class LoaderTimeoutError(TimeoutError, RuntimeError):
    """The loop waited longer than ``BackgroundLoader(timeout=...)`` for the next item.

    A ``TimeoutError`` and a ``RuntimeError`` (what ``DataLoader(timeout=...)``
    raises), so ``except TimeoutError`` and code written for the DataLoader's
    timeout both catch it. The epoch it ends is over: the next ``next()``
    raises ``StopIteration``; a new ``iter()`` starts a new epoch.

    Example:
        >>> from prefetch import LoaderTimeoutError
        >>> [issubclass(LoaderTimeoutError, kind) for kind in (TimeoutError, RuntimeError)]
        [True, True]
    """


class Timeout(NamedTuple):
    """A consumer's longest wait, and the loader to name when it passes."""

    seconds: float
    owner: str
    """``repr()`` of the loader, for the message."""

    def error(self) -> LoaderTimeoutError:
        """The error the loop gets when a wait passed ``seconds``.

        Example:
            >>> print(Timeout(0.5, "BackgroundLoader([...])").error())  # doctest: +NORMALIZE_WHITESPACE
            BackgroundLoader([...]) timed out after 0.5 seconds waiting for the next item
            (timeout=0.5); the epoch is stopped
        """  # noqa: E501
        seconds = f"{self.seconds:g}"
        msg = (
            f"{self.owner} timed out after {seconds} seconds waiting for the next item "
            f"(timeout={seconds}); the epoch is stopped"
        )
        return LoaderTimeoutError(msg)


def check_dataloader_timeout(loader: object, owner: str) -> None:
    """Refuse a ``DataLoader(timeout=...)`` without worker processes, saying where it goes.

    torch only times worker processes: with ``num_workers=0`` its ``iter()``
    fails on an ``AssertionError`` ("requires timeout == 0"). The wrapper's
    own ``timeout`` bounds the loop's wait whatever the loader.

    Raises:
        ValueError: ``loader`` is a ``DataLoader`` with ``timeout > 0`` and ``num_workers=0``.
    """
    if not isinstance(loader, DataLoader) or loader.num_workers > 0 or not loader.timeout:
        return
    seconds = f"{loader.timeout:g}"
    msg = (
        f"{owner}(loader=...) got DataLoader(timeout={seconds}) with num_workers=0, which "
        "torch refuses at iter() (its timeout only times worker processes). For how long "
        f"your loop waits for a batch, build the DataLoader without it and pass "
        f"{owner}(..., timeout={seconds})"
    )
    raise ValueError(msg)
