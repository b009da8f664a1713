"""Property: for any data, depth, break point and error position, exactly the right items."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefetch import BackgroundLoader

from .processes import prefetch_threads


class SourceError(Exception):
    """Raised by the source at a chosen position."""


def source(
    items: list[int | None], error_at: int | None, error: SourceError
) -> Iterator[int | None]:
    """Yield ``items``, raising ``error`` before position ``error_at`` if given."""
    for position, item in enumerate(items):
        if position == error_at:
            raise error
        yield item
    if error_at is not None and error_at >= len(items):
        raise error


class TestBackgroundLoaderProperty:
    """Random data, depth, break point and error position."""

    @pytest.mark.timeout(120)
    @settings(max_examples=150, deadline=None)
    @given(
        items=st.lists(st.one_of(st.none(), st.integers()), max_size=40),
        depth=st.integers(min_value=1, max_value=10),
        break_at=st.one_of(st.none(), st.integers(min_value=0, max_value=45)),
        error_at=st.one_of(st.none(), st.integers(min_value=0, max_value=45)),
    )
    def test_exact_prefix_and_error(
        self,
        items: list[int | None],
        depth: int,
        break_at: int | None,
        error_at: int | None,
    ) -> None:
        """The loop sees exactly the expected prefix, then the error if reached; no thread stays."""
        error = SourceError()
        if error_at is not None and error_at > len(items):
            error_at = len(items)
        available = items if error_at is None else items[:error_at]
        got: list[int | None] = []
        raised: BaseException | None = None
        loader = BackgroundLoader(source(items, error_at, error), depth=depth)
        try:
            for item in loader:
                if break_at is not None and len(got) == break_at:
                    break
                got.append(item)
        except SourceError as caught:
            raised = caught
        loader.close()
        stops_early = break_at is not None and break_at < len(available)
        expected = available[:break_at] if stops_early else available
        assert got == expected
        if error_at is not None and not stops_early:
            assert raised is error
        else:
            assert raised is None
        assert prefetch_threads() == []
