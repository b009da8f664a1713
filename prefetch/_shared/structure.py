"""Walking nested batches: the one place that knows how containers are rebuilt.

A batch is whatever a loader yields: a tensor, or containers of tensors nested
to any depth. Pinning, device copies, ``record_stream`` and byte counting all
need to visit every tensor leaf and rebuild the batch with the same types.
They share :func:`map_leaves` and :func:`iter_leaves` from this module.

Containers that are rebuilt with their own type: :class:`dict` and its
subclasses (:class:`~collections.OrderedDict`, :class:`~collections.defaultdict`
with its ``default_factory``), :class:`list`, :class:`tuple`, named tuples and
dataclass instances (frozen ones too, without re-running ``__post_init__``).
Everything else is a leaf and is handed to the callback, which decides what to
do with it; strings and bytes are always leaves.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch


def map_leaves(fn: Callable[[Any], Any], batch: Any) -> Any:
    """Return ``batch`` rebuilt with ``fn`` applied to every leaf.

    Args:
        fn: Called once per leaf (anything that is not a known container).
        batch: A leaf or a nest of dicts, lists, tuples, named tuples and
            dataclasses.

    Returns:
        A structure of the same types with each leaf replaced by ``fn(leaf)``.

    Example:
        >>> from collections import OrderedDict
        >>> out = map_leaves(lambda x: x * 10, OrderedDict(a=[1, (2, 3)], b="s"))
        >>> type(out).__name__, dict(out)
        ('OrderedDict', {'a': [10, (20, 30)], 'b': 'ssssssssss'})
    """
    if isinstance(batch, torch.Tensor | str | bytes):
        return fn(batch)
    if isinstance(batch, dict):
        items = [(key, map_leaves(fn, value)) for key, value in batch.items()]
        return _rebuild_mapping(batch, items)
    if isinstance(batch, tuple):
        values = [map_leaves(fn, value) for value in batch]
        if hasattr(batch, "_fields"):  # named tuple
            return type(batch)(*values)
        return values_as(batch, values)
    if isinstance(batch, list):
        return values_as(batch, [map_leaves(fn, value) for value in batch])
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        rebuilt = copy.copy(batch)
        for field in dataclasses.fields(batch):
            value = map_leaves(fn, getattr(batch, field.name))
            object.__setattr__(rebuilt, field.name, value)
        return rebuilt
    return fn(batch)


def iter_leaves(batch: Any) -> Iterator[Any]:
    """Yield every leaf of ``batch`` in the order :func:`map_leaves` visits them.

    Example:
        >>> list(iter_leaves({"a": [1, 2], "b": (3,)}))
        [1, 2, 3]
    """
    if isinstance(batch, torch.Tensor | str | bytes):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from iter_leaves(value)
    elif isinstance(batch, list | tuple):
        for value in batch:
            yield from iter_leaves(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from iter_leaves(getattr(batch, field.name))
    else:
        yield batch


def iter_tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Yield every tensor leaf of ``batch``.

    Example:
        >>> [t.tolist() for t in iter_tensors([torch.ones(1), "x", {"y": torch.zeros(2)}])]
        [[1.0], [0.0, 0.0]]
    """
    for leaf in iter_leaves(batch):
        if isinstance(leaf, torch.Tensor):
            yield leaf


def tensor_nbytes(batch: Any) -> int:
    """Return the bytes of tensor storage the leaves of ``batch`` hold.

    Example:
        >>> batch = {"x": torch.zeros(4), "y": [torch.zeros(2, dtype=torch.uint8)]}
        >>> tensor_nbytes(batch)
        18
        >>> tensor_nbytes(3), tensor_nbytes("text")
        (0, 0)
    """
    kind = type(batch)
    if kind is torch.Tensor:  # the common cases first: this runs once per item
        return batch.numel() * batch.element_size()  # type: ignore[no-any-return]
    if kind in _NO_TENSORS:
        return 0
    return sum(t.numel() * t.element_size() for t in iter_tensors(batch))


_NO_TENSORS = frozenset({int, float, bool, complex, str, bytes, type(None)})
"""Leaf types that hold no tensor storage (checked by exact type)."""


def get_item(batch: Any, key: int | str | None) -> Any:
    """Return the part of ``batch`` that ``key`` selects.

    ``None`` selects the batch itself; an int indexes a list or tuple; a str
    is a mapping key, or an attribute of a named tuple or dataclass.

    Example:
        >>> get_item({"image": 1, "label": 2}, "label"), get_item((5, 6), 0)
        (2, 5)
    """
    if key is None:
        return batch
    if isinstance(key, str) and not isinstance(batch, dict):
        return getattr(batch, key)
    return batch[key]


def replace_item(batch: Any, key: int | str | None, value: Any) -> Any:
    """Return a copy of ``batch`` with the part ``key`` selects replaced by ``value``.

    The container keeps its type; the original is not modified.

    Example:
        >>> replace_item((1, 2, 3), 1, "x")
        (1, 'x', 3)
        >>> replace_item({"a": 1}, "a", 0)
        {'a': 0}
    """
    if key is None:
        return value
    if isinstance(batch, dict):
        items = [(k, value if k == key else v) for k, v in batch.items()]
        return _rebuild_mapping(batch, items)
    if isinstance(batch, list | tuple) and isinstance(key, int):
        values = list(batch)
        values[key] = value
        if hasattr(batch, "_fields"):
            return type(batch)(*values)
        return values_as(batch, values)
    if isinstance(key, str):
        if hasattr(batch, "_replace"):
            return batch._replace(**{key: value})
        rebuilt = copy.copy(batch)
        object.__setattr__(rebuilt, key, value)
        return rebuilt
    msg = f"cannot replace key {key!r} in a batch of type {type(batch).__name__}"
    raise TypeError(msg)


def values_as(original: list[Any] | tuple[Any, ...], values: list[Any]) -> Any:
    """Rebuild a list or tuple (or a subclass of either) holding ``values``."""
    if type(original) in (list, tuple):
        return type(original)(values)
    try:
        return type(original)(values)
    except TypeError:
        return tuple(values) if isinstance(original, tuple) else values


def _rebuild_mapping(original: dict[Any, Any], items: list[tuple[Any, Any]]) -> Any:
    if type(original) is dict:
        return dict(items)
    if isinstance(original, defaultdict):
        return type(original)(original.default_factory, items)
    try:
        return type(original)(items)
    except TypeError:
        return dict(items)
