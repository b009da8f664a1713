"""``BackgroundLoader(timeout=...)``: the loop's longest wait for the next item (issue 24).

Past it, ``next()`` raises :class:`~prefetch.LoaderTimeoutError` (a
``TimeoutError`` and a ``RuntimeError``, as ``DataLoader(timeout=...)``
raises) naming the timeout and the loader; the epoch is over and its threads
leave once the slow read returns. The limit is per wait, not per epoch.
A ``DataLoader(timeout=...)`` torch would refuse is pointed here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, LoaderTimeoutError

from .processes import prefetch_threads, wait_until

SLOW = 1.0
"""Seconds the slow item takes: well past the timeouts below, short for the leak check."""


def slow_at(position: int, count: int = 5, seconds: float = SLOW) -> Iterator[int]:
    """``0 .. count-1``, sleeping ``seconds`` before the item at ``position``."""
    for item in range(count):
        if item == position:
            time.sleep(seconds)
        yield item


class SlowReads(Dataset[int]):
    """Eight samples; reading ``slow`` sleeps :data:`SLOW`, every other read ``each`` seconds."""

    def __init__(self, slow: int | None = None, each: float = 0.0) -> None:
        self.slow, self.each = slow, each

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        time.sleep(SLOW if index == self.slow else self.each)
        return index


class TestTimesOut:
    """A wait past the timeout raises, ends the epoch and leaves no thread behind."""

    def test_one_thread(self) -> None:
        """Items before the slow one arrive; then the error, well before the slow item."""
        loader = BackgroundLoader(slow_at(2), timeout=0.1)
        iterator = iter(loader)
        assert [next(iterator), next(iterator)] == [0, 1]
        started = time.perf_counter()
        with pytest.raises(LoaderTimeoutError) as raised:
            next(iterator)
        waited = time.perf_counter() - started
        assert 0.1 <= waited < SLOW
        assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, RuntimeError)
        message = str(raised.value)
        assert message.startswith("BackgroundLoader(<generator object slow_at")
        assert "timeout=0.1) timed out after 0.1 seconds waiting for the next item" in message
        assert next(iterator, "over") == "over"  # the epoch is over
        assert loader.stats.end_wait_seconds >= 0.1  # the wait after the last item
        assert wait_until(lambda: not prefetch_threads(), 5.0)

    @pytest.mark.parametrize("threads", [3, "auto"])
    def test_parallel_fetch(self, threads: int | str) -> None:
        """With fetch threads, a slow batch times out the same way; every thread leaves."""
        loader = BackgroundLoader(
            DataLoader(SlowReads(slow=4), batch_size=2), fetch_threads=threads, timeout=0.2
        )
        got = []
        with pytest.raises(TimeoutError, match=r"fetch_threads=.*timed out after 0.2 seconds"):
            for batch in loader:
                got.append(batch.tolist())
        assert got == [[0, 1], [2, 3]]
        assert wait_until(lambda: not prefetch_threads(), 5.0)

    def test_the_next_epoch_starts_afresh(self) -> None:
        """After a timeout a new iter() reads the loader again, from its first batch."""
        dataset = SlowReads(slow=0)
        loader = BackgroundLoader(DataLoader(dataset, batch_size=4), timeout=0.1)
        with pytest.raises(LoaderTimeoutError):
            list(loader)
        dataset.slow = None
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


class TestDoesNotTimeOut:
    """The limit is on each wait: slow epochs of quick-enough items run to the end."""

    def test_per_wait_not_per_epoch(self) -> None:
        """Eight reads of 50 ms take 0.4 s in all, each wait under 0.3 s: no error."""
        loader = BackgroundLoader(DataLoader(SlowReads(each=0.05)), timeout=0.3)
        started = time.perf_counter()
        assert [batch.item() for batch in loader] == list(range(8))
        assert time.perf_counter() - started >= 0.3

    @pytest.mark.parametrize("value", [None, 0, 0.0, math.inf])
    def test_no_timeout(self, value: float | None) -> None:
        """None, 0 (as in DataLoader) and infinity mean no limit: a slow item is waited for."""
        loader = BackgroundLoader(slow_at(1, count=2, seconds=0.3), timeout=value)
        assert loader.settings.timeout is None and list(loader) == [0, 1]


class TestArgument:
    """timeout is checked when the loader is built; a DataLoader's is pointed here."""

    def test_accepted_and_shown(self) -> None:
        """An int is taken as seconds; the repr shows it; it is BackgroundLoader's own keyword."""
        loader = BackgroundLoader(range(3), timeout=2)
        assert loader.settings.timeout == 2.0 and isinstance(loader.settings.timeout, float)
        assert repr(loader) == "BackgroundLoader(range(0, 3), depth='auto', timeout=2)"

    @pytest.mark.parametrize(
        ("value", "error", "shown"),
        [
            (-1, ValueError, "got -1"),
            (math.nan, ValueError, "got nan"),
            ("5", TypeError, "got '5' of type str"),
            (True, TypeError, "got True of type bool"),
        ],
    )
    def test_bad_values(self, value: object, error: type[Exception], shown: str) -> None:
        """The error names the argument, what it expects and what it got."""
        with pytest.raises(error) as raised:
            BackgroundLoader(range(3), timeout=value)  # type: ignore[arg-type]
        message = str(raised.value)
        assert message.startswith("BackgroundLoader(timeout=...) expects None or seconds >= 0")
        assert message.endswith(shown)

    def test_dataloader_timeout_without_workers_is_pointed_here(self) -> None:
        """torch refuses DataLoader(timeout=5) at iter() without workers: say where it goes."""
        plain = DataLoader(list(range(4)), timeout=5)
        with pytest.raises(AssertionError):
            iter(plain)  # torch's own refusal, at iter()
        with pytest.raises(ValueError, match=r"pass BackgroundLoader\(\.\.\., timeout=5\)$"):
            BackgroundLoader(plain)

    def test_dataloader_timeout_with_workers_is_kept(self) -> None:
        """With worker processes the DataLoader's own timeout is valid: the wrapper takes it."""
        loader = BackgroundLoader(DataLoader(list(range(4)), num_workers=2, timeout=5))
        assert loader.settings.timeout is None and len(loader) == 4
