"""prefetch._shared.structure: nested batches keep their types through map_leaves."""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict, defaultdict, namedtuple
from typing import Any, NamedTuple

import pytest
import torch

from prefetch._shared.structure import (
    get_item,
    iter_tensors,
    map_leaves,
    replace_item,
    tensor_nbytes,
)

Pair = namedtuple("Pair", "x y")


class Typed(NamedTuple):
    image: Any
    label: Any


@dataclasses.dataclass
class Sample:
    image: Any
    meta: Any
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.derived += 1


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: Any
    b: Any


class MyList(list[Any]):
    pass


def plus_one(value: Any) -> Any:
    return value + 1 if isinstance(value, torch.Tensor) else value


class TestMapLeaves:
    """Every container type is rebuilt as itself, leaves are mapped."""

    def test_dicts_keep_their_type(self) -> None:
        """dict, OrderedDict and defaultdict (with its factory) survive."""
        default: defaultdict[str, Any] = defaultdict(list, {"t": torch.zeros(1)})
        batch = {"o": OrderedDict(a=torch.zeros(1)), "d": default}
        out = map_leaves(plus_one, batch)
        assert type(out["o"]) is OrderedDict and out["o"]["a"].item() == 1
        assert type(out["d"]) is defaultdict and out["d"].default_factory is list
        assert out["d"]["t"].item() == 1

    def test_sequences_keep_their_type(self) -> None:
        """list, tuple, named tuples and list subclasses survive."""
        batch = [Pair(torch.zeros(1), "s"), Typed(torch.ones(1), 3), (torch.zeros(1),), MyList([1])]
        out = map_leaves(plus_one, batch)
        assert type(out[0]) is Pair and out[0].x.item() == 1 and out[0].y == "s"
        assert type(out[1]) is Typed and out[1].image.item() == 2 and out[1].label == 3
        assert type(out[2]) is tuple and out[2][0].item() == 1
        assert type(out[3]) is MyList and out[3] == [1]

    def test_dataclasses(self) -> None:
        """Dataclasses, frozen ones too, are rebuilt without re-running __post_init__."""
        sample = Sample(torch.zeros(2), {"id": 4})
        out = map_leaves(plus_one, sample)
        assert type(out) is Sample and out is not sample
        assert out.image.tolist() == [1.0, 1.0] and out.meta == {"id": 4}
        assert out.derived == 1
        frozen = map_leaves(plus_one, Frozen(torch.zeros(1), [torch.zeros(1)]))
        assert type(frozen) is Frozen and frozen.a.item() == 1 and frozen.b[0].item() == 1

    def test_other_leaves_untouched(self) -> None:
        """Strings, numbers, None and unknown objects pass through as the same object."""
        marker = object()
        batch = {"s": "text", "n": 3, "none": None, "obj": marker, "b": b"x"}
        out = map_leaves(plus_one, batch)
        assert out == batch and out["obj"] is marker

    def test_input_not_modified(self) -> None:
        """The original batch is left as it was."""
        batch = {"x": [torch.zeros(1)]}
        map_leaves(plus_one, batch)
        assert batch["x"][0].item() == 0

    def test_leaf_order(self) -> None:
        """iter_tensors visits leaves in the order map_leaves does."""
        batch = {
            "a": [torch.tensor(1), Pair(torch.tensor(2), torch.tensor(3))],
            "b": torch.tensor(4),
        }
        order: list[int] = []
        map_leaves(lambda v: order.append(int(v)) if isinstance(v, torch.Tensor) else v, batch)
        assert order == [int(t) for t in iter_tensors(batch)] == [1, 2, 3, 4]

    def test_nbytes(self) -> None:
        """tensor_nbytes sums element sizes over all tensor leaves."""
        batch = {
            "a": torch.zeros(3, dtype=torch.float64),
            "b": [torch.zeros(4, dtype=torch.int16), 7],
        }
        assert tensor_nbytes(batch) == 3 * 8 + 4 * 2


class TestItems:
    """get_item / replace_item select and replace one part of a batch."""

    @pytest.mark.parametrize(
        ("batch", "key", "value", "expected"),
        [
            ((1, 2), 0, 9, (9, 2)),
            ([1, 2], 1, 9, [1, 9]),
            ({"a": 1, "b": 2}, "b", 9, {"a": 1, "b": 9}),
            (Pair(1, 2), 1, 9, Pair(1, 9)),
            (Pair(1, 2), "x", 9, Pair(9, 2)),
            (5, None, 9, 9),
        ],
    )
    def test_replace(self, batch: Any, key: Any, value: Any, expected: Any) -> None:
        """The selected part is replaced, the container type kept, the original unchanged."""
        before = copy.deepcopy(batch)
        out = replace_item(batch, key, value)
        assert out == expected and type(out) is type(expected)
        assert get_item(out, key) == value
        assert batch == before

    def test_replace_dataclass_attribute(self) -> None:
        """A str key replaces a dataclass field on a copy, frozen included."""
        frozen = Frozen(1, 2)
        out = replace_item(frozen, "b", 5)
        assert out == Frozen(1, 5) and frozen == Frozen(1, 2)
