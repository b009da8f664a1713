"""The ``purepy`` benchmark: its records, how its targets are judged, and a quick run.

Like the other benchmark tests they never assert on speed: only on what the
runs delivered and how the targets are judged.
"""

from __future__ import annotations

import math
import sys
import threading
from pathlib import Path

import pytest
import torch

from benchmarks import purepy
from benchmarks.common import Config
from benchmarks.purepy import Interpreter, free_threaded
from benchmarks.records import BINS, WORDS, Records, features, make_record, tokenize

GIL = Interpreter("3.11", "python3.11", "3.11.7", "2.13.0")
FT = Interpreter("3.13t", "python3.13t", "3.13.5", "2.12.0", {"PYTHON_GIL": "0"})


class TestRecords:
    """The dataset: deterministic, pure Python, safe to read from several threads."""

    def test_records_are_the_same_in_every_process(self) -> None:
        """A record depends only on its index (a seeded generator per record)."""
        assert make_record(5) == make_record(5) != make_record(6)
        assert make_record(5, words=4).endswith('"') and make_record(5).count(" ") >= WORDS - 1

    def test_features_count_tokens_and_trigrams(self) -> None:
        """One count per token and per trigram of ``<token>``; the label is the record's."""
        counts, label = features('id=1;label=7;score=0.5;tags=[ka];text="ka lo."')
        assert tokenize("ka lo.") == ["ka", "lo", "."]
        assert label == 7 and len(counts) == BINS
        assert sum(counts) == 3 + (2 + 2 + 1)  # tokens + trigrams of <ka>, <lo>, <.>

    def test_threads_read_the_same_items(self) -> None:
        """Items read by four threads at once equal the items read one by one."""
        records = Records(16, words=20)
        serial = [records[index] for index in range(16)]
        seen: dict[int, tuple[torch.Tensor, int]] = {}

        def read(start: int) -> None:
            for index in range(start, 16, 4):
                seen[index] = records[index]

        threads = [threading.Thread(target=read, args=(start,)) for start in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for index, (counts, label) in enumerate(serial):
            assert torch.equal(seen[index][0], counts) and seen[index][1] == label


def _samples(
    threads_ft: list[float], workers_ft: list[float], threads_gil: list[float]
) -> dict[str, list[dict[str, float]]]:
    def runs(speeds: list[float], pss: float) -> list[dict[str, float]]:
        return [{"items_per_second": speed, "peak_pss_mib": pss} for speed in speeds]

    return {
        "3.11 fetch_threads=2": runs(threads_gil, 300.0),
        "3.13t fetch_threads=2": runs(threads_ft, 400.0),
        "3.13t DataLoader num_workers=2": runs(workers_ft, 1000.0),
    }


class TestTargets:
    """The issue's three targets: medians of per-repeat ratios, or MISS with the reason."""

    def test_targets_use_medians_of_per_repeat_ratios(self) -> None:
        """Throughput and PSS against the free-threaded workers, speed against 3.11's threads."""
        samples = _samples([90.0, 200.0, 80.0], [100.0, 100.0, 100.0], [50.0, 50.0, 100.0])
        first, memory, speedup = purepy._targets(samples, [GIL, FT], "")
        assert first.passed and first.detail == "0.90x throughput on 3.13t"
        assert memory.passed and memory.detail == "0.40x summed PSS on 3.13t"
        assert speedup.passed and speedup.detail == "1.80x throughput, 3.13t over 3.11"
        slower = _samples([80.0, 85.0, 200.0], [100.0, 100.0, 100.0], [80.0, 85.0, 200.0])
        first, _, speedup = purepy._targets(slower, [GIL, FT], "")
        assert not first.passed and first.detail.startswith("0.85x")
        assert not speedup.passed and speedup.detail.startswith("1.00x")

    def test_the_memory_target_also_gives_the_growth_over_the_start(self) -> None:
        """Growth, where runs report it, joins the PSS detail; the verdict stays on PSS."""
        samples = _samples([100.0], [100.0], [100.0])
        for name, growth in (
            ("3.13t fetch_threads=2", 5.0),
            ("3.13t DataLoader num_workers=2", 100.0),
        ):
            samples[name][0]["growth_mib"] = growth
        samples["3.13t fetch_threads=2"][0]["peak_pss_mib"] = 900.0
        _, memory, _ = purepy._targets(samples, [GIL, FT], "")
        assert not memory.passed
        assert memory.detail == "0.90x summed PSS on 3.13t (growth over the process's start: 0.05x)"

    def test_without_a_free_threaded_python_every_target_is_a_miss_that_says_why(self) -> None:
        """One interpreter: three MISSes, 'not measured' and the reason."""
        for interpreters in ([GIL], [FT]):
            judged = purepy._targets({}, interpreters, "no free-threaded Python")
            assert len(judged) == 3
            for target in judged:
                assert target.passed is False
                assert target.detail == "not measured: no free-threaded Python"

    def test_no_free_threaded_python_is_found_where_there_is_none(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without PYTHON_FT or .venv-ft the reason names make test-ft; a GIL build is refused."""
        monkeypatch.delenv("PYTHON_FT", raising=False)
        found, why = free_threaded(tmp_path)
        assert found is None and "make test-ft" in why
        if sys.version_info < (3, 13) or not purepy._probe(sys.executable).env:
            monkeypatch.setenv("PYTHON_FT", sys.executable)
            found, why = free_threaded(tmp_path)
            assert found is None and "is not a free-threaded Python" in why


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_quick_run_delivers_the_same_samples_everywhere() -> None:
    """Every variant on every interpreter delivers every record, in order; GIL off on 3.13t."""
    result = purepy.run(Config(repeats=1, quick=True))
    assert result.status == "ok"
    labels = list(result.params["interpreters"])
    assert labels[0].rstrip("t") == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert [row.variant for row in result.rows] == [
        f"{label} {loader}"
        for label in labels
        for loader in ("DataLoader num_workers=0", "DataLoader num_workers=2", "fetch_threads=2")
    ]
    assert len({row.values["checksum"] for row in result.rows}) == 1
    for row in result.rows:
        assert row.values["items"] == result.params["records"] == 64, row.variant
        assert float(row.values["peak_pss_mib"]) > 1.0, row.variant
        assert not math.isnan(float(row.values["vs_w2"])), row.variant
        if str(row.values["interpreter"]).endswith("t"):
            assert row.values["gil_enabled"] == 0, row.variant
    assert len(result.targets) == 3
    assert all(isinstance(target.passed, bool) for target in result.targets)
    if len(labels) == 1:
        assert all(t.detail.startswith("not measured") for t in result.targets)
