"""Keywords BackgroundLoader does not take get an error that says what to do (issue 24).

A DataLoader keyword (``num_workers``, ``batch_size``, ...) is pointed to the
DataLoader, and ``num_workers`` also to ``fetch_threads``; a misspelt keyword
still fails, naming the close matches; the signature is unchanged.
"""

from __future__ import annotations

import inspect

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetch import BackgroundLoader, CudaPrefetcher


def refusal(**keywords: object) -> str:
    """The message of the TypeError that BackgroundLoader(range(4), **keywords) raises."""
    with pytest.raises(TypeError) as error:
        BackgroundLoader(range(4), **keywords)  # type: ignore[call-arg]
    return str(error.value)


class TestDataLoaderKeywords:
    """A DataLoader argument given to the wrapper says to pass it to the DataLoader."""

    def test_num_workers_names_the_dataloader_and_fetch_threads(self) -> None:
        """num_workers=2: pass it to the DataLoader, or fetch_threads=2 for threads."""
        message = refusal(num_workers=2)
        assert message.startswith(
            "BackgroundLoader() got an unexpected keyword argument 'num_workers': "
        )
        assert "BackgroundLoader(DataLoader(..., num_workers=2))" in message
        assert "fetch_threads=2" in message and "num_threads is something else" in message

    def test_prefetch_factor_points_to_depth(self) -> None:
        """prefetch_factor belongs to the DataLoader's workers; the wrapper's is depth."""
        message = refusal(prefetch_factor=4)
        assert "pass it to the DataLoader" in message and "depth=" in message

    @pytest.mark.parametrize(
        ("name", "value", "shown"),
        [
            ("batch_size", 64, "batch_size=64"),
            ("shuffle", True, "shuffle=True"),
            ("drop_last", True, "drop_last=True"),
            ("collate_fn", lambda batch: batch, "collate_fn=..."),
            ("persistent_workers", True, "pass it to the DataLoader"),
        ],
    )
    def test_every_dataloader_argument_is_pointed_to_the_dataloader(
        self, name: str, value: object, shown: str
    ) -> None:
        """Each DataLoader argument is named, with an example that does not print big objects."""
        message = refusal(**{name: value})
        assert f"unexpected keyword argument {name!r}" in message
        assert "DataLoader" in message and shown in message

    def test_a_stateful_loader_wrapper_explains_too(self) -> None:
        """The checkpointing twin (over a StatefulDataLoader) checks its keywords the same way."""
        with pytest.raises(TypeError, match="num_workers starts a DataLoader's worker processes"):
            BackgroundLoader(StatefulDataLoader(list(range(4))), num_workers=2)  # type: ignore[call-arg]

    def test_several_unknown_keywords_are_all_named(self) -> None:
        """Two wrong keywords: the error speaks of both."""
        message = refusal(num_workers=2, shuffle=True)
        assert "'num_workers'" in message and "'shuffle'" in message


class TestOtherKeywords:
    """Typos still fail, with the close matches; prefetch_generator's name is translated."""

    def test_typo_names_the_close_matches(self) -> None:
        """fetch_thread is not accepted; the error suggests fetch_threads."""
        message = refusal(fetch_thread=2)
        assert message.startswith(
            "BackgroundLoader() got an unexpected keyword argument 'fetch_thread'; did you mean "
        )
        assert "'fetch_threads'" in message

    def test_unknown_keyword_without_a_match_lists_the_accepted_ones(self) -> None:
        """A keyword like no other: the error lists what BackgroundLoader takes."""
        message = refusal(colour="blue")
        assert message.endswith("it takes loader, depth, max_depth, max_bytes, pin_memory, "
                                "num_threads, fetch_threads, thread_init_fn, timeout, "
                                "fetch_grain, in_order")  # fmt: skip

    def test_max_prefetch_points_to_depth(self) -> None:
        """prefetch_generator's max_prefetch: BackgroundLoader's bound is depth."""
        assert "BackgroundLoader's is depth=N" in refusal(max_prefetch=3)

    def test_declared_keywords_and_signature_are_unchanged(self) -> None:
        """Every declared keyword still works, and the signature shows no **kwargs."""
        loader = BackgroundLoader(
            DataLoader(list(range(4)), batch_size=2),
            depth=3,
            max_bytes=1 << 20,
            pin_memory=False,
            num_threads=1,
            fetch_threads=2,
        )
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
        parameters = inspect.signature(BackgroundLoader).parameters
        assert "fetch_threads" in parameters
        assert all(p.kind is not p.VAR_KEYWORD for p in parameters.values())


class TestCudaPrefetcherKeywords:
    """CudaPrefetcher explains the same way, and points BackgroundLoader's keywords to it."""

    @staticmethod
    def refusal(**keywords: object) -> str:
        """The message of the TypeError that CudaPrefetcher(range(4), **keywords) raises."""
        with pytest.raises(TypeError) as error:
            CudaPrefetcher(range(4), device="cpu", **keywords)  # type: ignore[call-arg]
        return str(error.value)

    @pytest.mark.parametrize("name", ["fetch_threads", "max_bytes", "num_threads", "timeout"])
    def test_a_background_loader_keyword_says_to_stack_one(self, name: str) -> None:
        """fetch_threads=4 and the like: BackgroundLoader's, stacked under it."""
        assert self.refusal(**{name: 4}) == (
            f"CudaPrefetcher() got an unexpected keyword argument {name!r}: {name} is "
            f"BackgroundLoader's: stack them, CudaPrefetcher(BackgroundLoader(loader, {name}=4))"
        )

    def test_num_workers_names_the_dataloader_and_threads_through_a_stack(self) -> None:
        """num_workers=2: pass it to the DataLoader, or read in threads under a BackgroundLoader."""
        message = self.refusal(num_workers=2)
        assert "pass it to the DataLoader you wrap, CudaPrefetcher(DataLoader(..., " in message
        assert "CudaPrefetcher(BackgroundLoader(DataLoader(...), fetch_threads=2))" in message

    def test_typo_and_dataloader_keyword(self) -> None:
        """A typo names CudaPrefetcher's own close match; batch_size goes to the DataLoader."""
        assert self.refusal(detph=2).endswith("did you mean 'depth'?")
        assert "CudaPrefetcher(DataLoader(..., batch_size=8))" in self.refusal(batch_size=8)

    def test_declared_keywords_and_signature_are_unchanged(self) -> None:
        """Every declared keyword still works, and the signature shows no **kwargs."""
        loader = CudaPrefetcher(range(4), "cpu", depth=2, transform=None, lifetime="fence")
        assert list(loader) == [0, 1, 2, 3]
        parameters = inspect.signature(CudaPrefetcher).parameters
        assert list(parameters) == ["loader", "device", "depth", "transform", "lifetime"]
