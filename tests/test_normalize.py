"""Normalize: numerics against a float64 reference, dtypes, memory format, errors."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prefetch import CudaPrefetcher, Normalize
from prefetch._device import normalize as normalize_module

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
Batch = namedtuple("Batch", "image label")


def reference(
    images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """(x / 255 - mean) / std in float64, the way torchvision's ToTensor + Normalize does it."""
    x = images.to(torch.float64)
    if images.dtype == torch.uint8:
        x = x / 255.0
    m = torch.tensor(mean, dtype=torch.float64).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(-1, 1, 1)
    return (x - m) / s


def images(seed: int = 0, shape: tuple[int, ...] = (4, 3, 8, 8)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)


class TestNumerics:
    """Results match the reference to the precision of the output dtype."""

    @pytest.mark.parametrize(
        ("dtype", "tolerance"),
        [
            (torch.float32, 1e-6),
            (torch.float16, 2e-3),
            (torch.bfloat16, 1.6e-2),
            (torch.float64, 1e-12),
        ],
    )
    def test_uint8_images(self, dtype: torch.dtype, tolerance: float) -> None:
        """uint8 images are scaled, normalised and rounded once to the dtype."""
        x = images()
        out = Normalize(MEAN, STD, key=None, dtype=dtype)(x)
        expected = reference(x, MEAN, STD)
        assert out.dtype == dtype and out.shape == x.shape
        error = (out.to(torch.float64) - expected).abs() / expected.abs().clamp(min=1.0)
        assert error.max().item() <= tolerance
        # rounding once: identical to the float64 reference cast to the dtype
        assert torch.equal(out, expected.to(dtype)) or dtype in (torch.float32, torch.float64)

    def test_float_input_is_not_scaled(self) -> None:
        """Float input in [0, 1] is normalised without the /255 scaling."""
        x = torch.rand(2, 3, 4, 4)
        out = Normalize(MEAN, STD, key=None)(x)
        assert torch.allclose(out.double(), reference(x, MEAN, STD), atol=1e-6)

    def test_single_value_broadcasts(self) -> None:
        """A single mean/std applies to every channel."""
        x = images(shape=(2, 5, 3, 3))
        out = Normalize(0.5, 0.25, key=None)(x)
        assert torch.allclose(out.double(), reference(x, (0.5,), (0.25,)), atol=1e-5)

    @pytest.mark.parametrize("dims", [4, 5])
    def test_channels_last(self, dims: int) -> None:
        """channels_last gives the same values in channels_last memory format."""
        x = images(shape=(2, 3, 4, 4) if dims == 4 else (2, 2, 3, 4, 4))
        out = Normalize(MEAN, STD, key=None, channels_last=True)(x)
        fmt = torch.channels_last if dims == 4 else torch.channels_last_3d
        assert out.is_contiguous(memory_format=fmt)
        assert torch.allclose(out.double(), reference(x, MEAN, STD), atol=1e-5)


def old_formula(normalize: Normalize, x: torch.Tensor) -> torch.Tensor:
    """The three-pass computation Normalize made before (convert, compute, round, reformat)."""
    compute = torch.float64 if normalize.dtype == torch.float64 else torch.float32
    scaled = x.dtype == torch.uint8
    scale = [1.0 / (s * 255.0) if scaled else 1.0 / s for s in normalize.std]
    shift = [-m / s for m, s in zip(normalize.mean, normalize.std, strict=True)]
    coefficients = [torch.tensor(v, dtype=compute).view(-1, 1, 1) for v in (scale, shift)]
    result = torch.addcmul(coefficients[1], x.to(compute), coefficients[0]).to(normalize.dtype)
    if normalize.channels_last:
        result = result.contiguous(memory_format=torch.channels_last)
    return result


class Ops(TorchDispatchMode):
    """Records every aten operation that computes (allocations left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if "empty" not in str(func):
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


class TestOnePass:
    """One fused pass into a preallocated result, with the old formula's values exactly."""

    @pytest.mark.parametrize("source", [torch.uint8, torch.float16, torch.float32, torch.float64])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
    @pytest.mark.parametrize("channels_last", [False, True])
    def test_equals_the_old_formula(
        self, source: torch.dtype, dtype: torch.dtype, channels_last: bool
    ) -> None:
        """Bit for bit, for each input dtype, result dtype and memory format."""
        x = images() if source == torch.uint8 else torch.rand(4, 3, 8, 8).to(source)
        normalize = Normalize(MEAN, STD, key=None, dtype=dtype, channels_last=channels_last)
        out, old = normalize(x), old_formula(normalize, x)
        assert out.dtype == old.dtype and torch.equal(out, old)
        assert out.stride() == old.stride()

    def test_channels_last_input_keeps_its_layout(self) -> None:
        """Without channels_last=True the result has the input's (dense) layout, as before."""
        x = images().contiguous(memory_format=torch.channels_last)
        normalize = Normalize(MEAN, STD, key=None)
        assert normalize(x).stride() == old_formula(normalize, x).stride()

    @pytest.mark.parametrize(
        ("source", "expected"),
        [
            (torch.uint8, ["aten.addcmul.out"]),
            (torch.float64, ["aten._to_copy.default", "aten.addcmul.out"]),
        ],
    )
    def test_one_operation_per_batch(self, source: torch.dtype, expected: list[str]) -> None:
        """uint8 to channels-last float16: one addcmul (a float64 input is converted first)."""
        normalize = Normalize(MEAN, STD, key=None, dtype=torch.float16, channels_last=True)
        x = images().to(source)
        normalize(x)  # the coefficients, once
        with Ops() as ops:
            normalize(x)
        assert ops.names == expected

    def test_control_the_old_formula_makes_four(self) -> None:
        """Control: the same count for the three-pass formula shows each pass."""
        normalize = Normalize(MEAN, STD, key=None, dtype=torch.float16, channels_last=True)
        x = images()
        with Ops() as ops:
            old_formula(normalize, x)
        assert [n for n in ops.names if "lift" not in n and "tensor" not in n][-4:] == [
            "aten._to_copy.default",
            "aten.addcmul.default",
            "aten._to_copy.default",
            "aten.clone.default",
        ]


class TestCoefficientsPerStream:
    """Coefficients are built, and read, on one stream: one set per stream."""

    @pytest.mark.parametrize(("keys", "built"), [(["a", "b", "a"], 2), (["a", "a", "a"], 1)])
    def test_one_set_per_stream(
        self, monkeypatch: pytest.MonkeyPatch, keys: list[str], built: int
    ) -> None:
        """Stream a, then b, then a again: two sets, a's reused (one stream: one set)."""
        streams = iter(keys)
        monkeypatch.setattr(normalize_module, "_stream_key", lambda device: next(streams))
        made: list[torch.Tensor] = []
        filled = normalize_module._filled

        def spy(values: list[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            made.append(filled(values, dtype, device))
            return made[-1]

        monkeypatch.setattr(normalize_module, "_filled", spy)
        normalize = Normalize(MEAN, STD, key=None)
        x = images()
        outputs = [normalize(x) for _ in keys]
        assert len(made) == 2 * built  # scale and shift per stream
        assert all(torch.equal(o, outputs[0]) for o in outputs)

    def test_cpu_has_no_stream(self) -> None:
        """On the CPU the key is None: one set."""
        assert normalize_module._stream_key(torch.device("cpu")) is None


class TestSelection:
    """key selects the tensor; the rest of the batch is left as it was."""

    def test_tuple_index(self) -> None:
        """key=0 in a (image, label) tuple."""
        x, label = images(), torch.tensor([1, 2, 3, 4])
        out = Normalize(MEAN, STD)((x, label))
        assert type(out) is tuple and out[1] is label and out[0].dtype == torch.float32

    def test_dict_key_and_namedtuple_field(self) -> None:
        """A dict key and a named tuple field name both select."""
        x = images()
        out = Normalize(MEAN, STD, key="pixels")({"pixels": x, "id": 3})
        assert out["id"] == 3 and out["pixels"].dtype == torch.float32
        named = Normalize(MEAN, STD, key="image")(Batch(x, 7))
        assert type(named) is Batch and named.label == 7

    def test_coefficients_made_without_a_copy(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The first call builds its coefficients in place: no Tensor.to to any device."""
        moves: list[tuple[Any, ...]] = []
        original = torch.Tensor.to

        def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if any(isinstance(a, torch.device | str) for a in (*args, *kwargs.values())):
                moves.append(args)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", spy)
        x = images()
        out = Normalize(MEAN, STD, key=None)(x)
        assert moves == []
        assert torch.allclose(out.double(), reference(x, MEAN, STD), atol=1e-5)

    def test_as_prefetcher_transform(self) -> None:
        """Used as CudaPrefetcher's transform, each batch arrives normalised."""
        batches = [(images(seed), torch.tensor([seed])) for seed in range(3)]
        out = list(CudaPrefetcher(batches, device="cpu", transform=Normalize(MEAN, STD)))
        for (x, _), (y, label) in zip(batches, out, strict=True):
            assert torch.allclose(y.double(), reference(x, MEAN, STD), atol=1e-5)
            assert label.dtype == torch.int64


class TestErrors:
    """Bad arguments and inputs are errors naming what was given."""

    def test_length_mismatch(self) -> None:
        """mean and std of different lengths is a ValueError with both counts."""
        with pytest.raises(ValueError, match="3 means and 2 stds"):
            Normalize(MEAN, (1.0, 1.0))

    def test_keyed_normalize_on_a_plain_tensor(self) -> None:
        """key=0 on a batch that is one tensor says so and names key=None (no silent slice)."""
        with pytest.raises(TypeError, match=r"Normalize\(key=0\).*single Tensor.*key=None"):
            Normalize((0.5,), (0.5,))(torch.zeros(2, 1, 3, 3))

    def test_zero_std(self) -> None:
        """A zero std is a ValueError."""
        with pytest.raises(ValueError, match="zero"):
            Normalize((0.0,), (0.0,))

    def test_integer_dtype(self) -> None:
        """A non-floating dtype is a TypeError naming it."""
        with pytest.raises(TypeError, match=r"torch\.int32"):
            Normalize(MEAN, STD, dtype=torch.int32)

    def test_bad_mean(self) -> None:
        """A mean that is not numbers is a TypeError naming it."""
        with pytest.raises(TypeError, match=r"mean=.*'abc'"):
            Normalize("abc", STD)  # type: ignore[arg-type]

    def test_wrong_channels(self) -> None:
        """A tensor with another channel count is a ValueError with its shape."""
        with pytest.raises(ValueError, match=r"got shape \(2, 4, 3, 3\)"):
            Normalize(MEAN, STD, key=None)(torch.zeros(2, 4, 3, 3))

    def test_one_channel_is_singular(self) -> None:
        """A one-channel Normalize on a tensor with too few dims says "1 channel"."""
        with pytest.raises(ValueError, match=r"with 1 channel at dimension -3, got shape \(4,\)"):
            Normalize((0.5,), (0.5,), key=None)(torch.zeros(4))

    def test_missing_key_names_what_the_batch_has(self) -> None:
        """A key the batch lacks is an error of the lookup's kind listing keys or length."""
        batch = {"pixels": torch.zeros(1, 3, 2, 2), "label": 1}
        with pytest.raises(KeyError, match=r"key=0\).*keys \['label', 'pixels'\]"):
            Normalize(MEAN, STD)(batch)
        with pytest.raises(IndexError, match=r"key=2\).*tuple\) has 1 items"):
            Normalize(MEAN, STD, key=2)((torch.zeros(1, 3, 2, 2),))

    def test_not_a_tensor(self) -> None:
        """A non-tensor at the key is a TypeError naming the key."""
        with pytest.raises(TypeError, match="key 0"):
            Normalize(MEAN, STD)(("image", 1))

    def test_channels_last_needs_4d(self) -> None:
        """channels_last on a 3-D tensor is a ValueError."""
        with pytest.raises(ValueError, match="4-D or 5-D"):
            Normalize(MEAN, STD, key=None, channels_last=True)(images(shape=(3, 4, 4)))
