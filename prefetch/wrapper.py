"""What every wrapper passes through to the loader it wraps.

A training loop written for a bare ``DataLoader`` calls ``len(loader)``,
``loader.set_epoch(e)`` and reads ``loader.dataset`` or ``loader.sampler``.
:class:`LoaderWrapper` keeps all of that working through any stack of
wrappers, so wrapping a loader is a one-line change.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LoaderWrapper", "set_epoch_on"]


def set_epoch_on(loader: Any, epoch: int) -> None:
    """Forward ``set_epoch(epoch)`` to whatever in ``loader`` understands it.

    If ``loader`` has ``set_epoch`` (another wrapper, or a loader that
    forwards it itself), only that is called. Otherwise it is called on each
    of ``loader.sampler``, ``loader.batch_sampler.sampler`` and
    ``loader.dataset`` that has it, once per object. If none has it, nothing
    happens: a loop that calls ``set_epoch`` for a ``DistributedSampler`` also
    runs unchanged on one process with a plain sampler.

    Example:
        >>> class Sampler:
        ...     def set_epoch(self, epoch): self.epoch = epoch
        >>> class Loader:
        ...     sampler = Sampler()
        >>> loader = Loader()
        >>> set_epoch_on(loader, 3)
        >>> loader.sampler.epoch
        3
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        msg = f"set_epoch(epoch) expects an int, got {epoch!r} of type {type(epoch).__name__}"
        raise TypeError(msg)
    own = getattr(loader, "set_epoch", None)
    if callable(own):
        own(epoch)
        return
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = (
        getattr(loader, "sampler", None),
        getattr(batch_sampler, "sampler", None),
        getattr(loader, "dataset", None),
    )
    seen: set[int] = set()
    for candidate in candidates:
        method = getattr(candidate, "set_epoch", None)
        if candidate is None or id(candidate) in seen or not callable(method):
            continue
        seen.add(id(candidate))
        method(epoch)


class LoaderWrapper:
    """Base for wrappers: ``len``, ``set_epoch`` and attribute read-through.

    Subclasses store the wrapped loader in ``self._loader``. Public attributes
    the wrapper lacks (``dataset``, ``sampler``, ``batch_size``, ...) are read
    from the wrapped loader.
    """

    _loader: Any

    def __len__(self) -> int:
        """Return the wrapped loader's length (batches per epoch)."""
        try:
            return len(self._loader)
        except TypeError:
            msg = (
                f"{type(self).__name__} has no len(): the wrapped loader "
                f"{type(self._loader).__name__!r} defines no __len__"
            )
            raise TypeError(msg) from None

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch number to the wrapped loader's sampler or dataset.

        If the wrapped loader has ``set_epoch`` (another wrapper), only that is
        called. Otherwise it is called on each of ``loader.sampler``,
        ``loader.batch_sampler.sampler`` and ``loader.dataset`` that has it
        (a ``DistributedSampler`` then reshuffles). If none has it, nothing
        happens, so the same loop runs on one process with a plain sampler.

        Raises:
            TypeError: If ``epoch`` is not an int.
        """
        set_epoch_on(self._loader, epoch)

    @property
    def loader(self) -> Any:
        """The wrapped loader or iterable."""
        return self._loader

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails; never recurse before _loader is set.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            loader = object.__getattribute__(self, "_loader")
        except AttributeError:
            raise AttributeError(name) from None
        try:
            return getattr(loader, name)
        except AttributeError:
            msg = (
                f"{type(self).__name__!r} object has no attribute {name!r}, "
                f"and neither has the wrapped {type(loader).__name__!r}"
            )
            raise AttributeError(msg) from None
