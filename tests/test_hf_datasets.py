"""Hugging Face datasets with the real package: dict batches through the whole stack (issue 11).

Datasets are built from Python data (no hub download): map-style with
``with_format("torch")``, and streaming via ``to_iterable_dataset``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from prefetch import BackgroundLoader, CudaPrefetcher, Normalize

datasets = pytest.importorskip("datasets")

SIZE = 8
BATCH = 2
MEAN, STD = 0.5, 0.25


def rows() -> dict[str, Any]:
    images = [[[[float(i)] * 2] * 2] for i in range(SIZE)]  # (1, 2, 2) per row, all i
    return {"image": images, "label": list(range(SIZE))}


def map_style() -> Any:
    return datasets.Dataset.from_dict(rows()).with_format("torch")


def streaming() -> Any:
    stream = datasets.Dataset.from_dict(rows()).to_iterable_dataset(num_shards=2)
    return stream.with_format("torch")


def stack(data: Any, num_workers: int) -> CudaPrefetcher[Any]:
    loader = DataLoader(data, batch_size=BATCH, num_workers=num_workers)
    return CudaPrefetcher(
        BackgroundLoader(loader), device="cpu", transform=Normalize(MEAN, STD, key="image")
    )


def check_epoch(batches: list[Any]) -> None:
    labels = torch.cat([batch["label"] for batch in batches])
    assert sorted(labels.tolist()) == list(range(SIZE))
    for batch in batches:
        assert set(batch) == {"image", "label"}
        expected = (batch["label"].float() - MEAN) / STD
        assert torch.equal(batch["image"], expected.view(-1, 1, 1, 1).expand(-1, 1, 2, 2))


class TestHuggingFaceParallelFetch:
    @pytest.mark.parametrize("threads", [1, 4])
    def test_batches_equal_the_dataloader_s_through_getitems(self, threads: int) -> None:
        """A map-style Dataset read in threads (by __getitems__) gives the DataLoader's batches."""
        data = map_style()
        calls: list[int] = []
        getitems = data.__getitems__

        def spy(keys: list[int]) -> Any:
            calls.append(len(keys))
            return getitems(keys)

        data.__getitems__ = spy  # an instance attribute: DataLoader and prefetch both see it
        torch.manual_seed(7)
        plain = list(DataLoader(data, batch_size=BATCH, shuffle=True))
        plain_calls = len(calls)
        torch.manual_seed(7)
        loader = BackgroundLoader(
            DataLoader(data, batch_size=BATCH, shuffle=True), fetch_threads=threads
        )
        got = list(loader)
        assert len(got) == len(plain) == SIZE // BATCH
        for ours, theirs in zip(got, plain, strict=True):
            assert set(ours) == set(theirs) == {"image", "label"}
            assert all(torch.equal(ours[key], theirs[key]) for key in ours)
        # Every batch read once, by __getitems__: whole for the DataLoader, in one chunk per
        # thread at the grain of samples.
        assert calls[:plain_calls] == [BATCH] * plain_calls
        assert sum(calls[plain_calls:]) == BATCH * plain_calls
        assert max(calls[plain_calls:]) == -(-BATCH // threads)

    def test_streaming_dataset_is_refused(self) -> None:
        """An IterableDataset has no indices to read in parallel: refused, saying what to do."""
        with pytest.raises(
            TypeError, match=r"fetch_threads.*IterableDataset.*num_workers"
        ) as error:
            BackgroundLoader(DataLoader(streaming(), batch_size=BATCH), fetch_threads=2)
        # Its class is named IterableDataset too: said once, with its module (issue 24).
        assert "got an IterableDataset (from datasets." in str(error.value)
        assert "IterableDataset IterableDataset" not in str(error.value)


class TestHuggingFaceDatasets:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_map_style_dict_batches_through_the_stack(self, num_workers: int) -> None:
        """with_format('torch') dict batches come through both wrappers, normalised at key."""
        loader = stack(map_style(), num_workers)
        assert len(loader) == SIZE // BATCH
        check_epoch(list(loader))
        check_epoch(list(loader))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_streaming_dict_batches_through_the_stack(self, num_workers: int) -> None:
        """A streaming IterableDataset, sharded over workers, gives every row once per epoch."""
        loader = stack(streaming(), num_workers)
        for epoch in range(2):
            loader.set_epoch(epoch)
            check_epoch(list(loader))

    def test_normalize_without_key_names_the_batch_keys(self) -> None:
        """Normalize on a dict batch without a matching key lists the keys the batch has."""
        batch = next(iter(DataLoader(map_style(), batch_size=BATCH)))
        with pytest.raises(KeyError, match=r"keys \['image', 'label'\]; pass one as key="):
            Normalize(MEAN, STD)(batch)
        with pytest.raises(KeyError, match=r"Normalize\(key='pixels'\)"):
            Normalize(MEAN, STD, key="pixels")(batch)
