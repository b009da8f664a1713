"""The ``readbound`` and ``autostart`` benchmarks (issue 34) and the hand-off's targets.

Like the other benchmark tests they never assert on speed: only on the
limits' arithmetic, how targets are judged from given figures, and what one
epoch delivers.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import autostart, handoff, readbound
from benchmarks.common import Row
from benchmarks.jpeg_files import JpegFolder, write_jpegs
from benchmarks.latency_runs import Limit, decode_runner, jpeg_spec, limits, median_limit
from benchmarks.parallel_child import run_epoch

HAVE_TORCHDATA = importlib.util.find_spec("torchdata") is not None


class TestLimit:
    """The physical limit: the later of the reads and the decoding."""

    def test_reads_are_the_limit_of_the_issues_batch_64_setting(self) -> None:
        """512 reads of 20 ms at 16 threads take 0.64 s, as issue 34 computes it."""
        limit = Limit(images=512, threads=16, decode_seconds=0.002, cores=2)
        assert limit.reads == pytest.approx(0.64)
        assert limit.cpu == pytest.approx(0.512)
        assert limit.seconds == limit.reads and limit.bound == "reads"
        text = limit.describe()
        assert "512 x 20 ms / 16 threads = 0.64 s" in text and "reads the limit" in text

    def test_the_cpu_is_the_limit_when_decoding_takes_longer(self) -> None:
        """256 decodes of 4.5 ms on 2 cores outlast 256 reads of 20 ms at 16 threads."""
        limit = Limit(images=256, threads=16, decode_seconds=0.0045, cores=2)
        assert limit.seconds == pytest.approx(0.576) and limit.bound == "CPU"

    def test_each_repeat_has_its_own_limit(self) -> None:
        """limits() pairs every repeat's decode timing; median_limit takes the median."""
        samples = {"decode": [{"decode_seconds": cost} for cost in (0.001, 0.004, 0.002)]}
        repeats = limits(samples, "decode", images=64, threads=8)
        assert [limit.decode_seconds for limit in repeats] == [0.001, 0.004, 0.002]
        assert all(limit.threads == 8 and limit.images == 64 for limit in repeats)
        assert median_limit(repeats).decode_seconds == 0.002

    def test_decode_runner_times_the_cpu_of_one_decode(self, tmp_path: Path) -> None:
        """The estimate is a positive CPU time per image, at the side asked for."""
        write_jpegs(tmp_path, 2)
        measure = decode_runner(tmp_path, side=128, files=2)()
        assert set(measure) == {"decode_seconds"} and 0.0 < measure["decode_seconds"] < 1.0


def readbound_rows(case: readbound.Case, **ours: float | str) -> dict[str, Row]:
    """Rows of ``case`` with the given figures for ours (the rival's are 1.0)."""
    base: dict[str, float | str] = {"speed_ratio": 1.0, "first_ratio": 1.0, "of_limit": 1.0}
    mine = {**base, "note": "", **ours}
    return {
        case.variant("threads"): Row(case.variant("threads"), mine),
        case.variant(case.rival): Row(case.variant(case.rival), {**base, "note": ""}),
    }


class TestReadboundTargets:
    """Issue 34's targets for the two settings, judged from given figures."""

    LIMIT = Limit(images=512, threads=16, decode_seconds=0.002, cores=2)

    def test_the_settings_are_the_issues(self) -> None:
        """256 JPEGs to 224 in batches of 8 vs ParallelMapper; 512 to 128 in 64s vs samples."""
        first, second = readbound.CASES
        assert (first.images, first.side, first.batch, first.rival) == (
            256,
            224,
            8,
            "parallel_mapper",
        )
        assert (second.images, second.side, second.batch, second.rival) == (
            512,
            128,
            64,
            "sample_mapper",
        )
        assert readbound.THREADS == 16 and second.first_batch_target
        assert not first.first_batch_target

    @pytest.mark.parametrize(
        ("speed", "share", "first", "verdicts"),
        [
            (1.05, 0.9, 1.0, [True, True, True]),
            (1.04, 0.9, 1.0, [False, True, True]),
            (1.2, 0.89, 1.0, [True, False, True]),
            (1.2, 0.95, 1.01, [True, True, False]),
        ],
    )
    def test_thresholds(
        self, speed: float, share: float, first: float, verdicts: list[bool]
    ) -> None:
        """>= 1.05x the other's images/s, >= 0.9 of the limit, first batch <= 1.0x."""
        case = readbound.CASES[1]
        rows = readbound_rows(case, speed_ratio=speed, of_limit=share, first_ratio=first)
        targets = readbound._targets(case, rows, self.LIMIT)
        assert [target.passed for target in targets] == verdicts
        assert "1.05x ParallelMapper(thread) over samples + Batcher x16" in targets[0].name
        assert "0.9 of the physical limit" in targets[1].name
        assert "0.64 s" in targets[1].detail  # the limit beside the figure
        assert "first batch no later than" in targets[2].name

    def test_batch_8_has_no_first_batch_target(self) -> None:
        """The issue asks a first batch no later than the other's only at batch 64."""
        case = readbound.CASES[0]
        targets = readbound._targets(case, readbound_rows(case, speed_ratio=1.1), self.LIMIT)
        assert len(targets) == 2 and targets[0].passed
        assert "ParallelMapper(thread) x16" in targets[0].name

    def test_a_pipeline_that_could_not_run_is_a_miss(self) -> None:
        """Without torchdata every target of the setting is MISS and says why."""
        case = readbound.CASES[0]
        rows = readbound_rows(case)
        rows[case.variant(case.rival)].values.update(
            note="not available: torchdata is not installed", speed_ratio=math.nan
        )
        targets = readbound._targets(case, rows, self.LIMIT)
        assert not any(target.passed for target in targets)
        assert all("not measured: not available" in target.detail for target in targets)


def autostart_samples(
    auto: list[tuple[float, float]], fixed: dict[int, list[tuple[float, float]]]
) -> dict[str, list[dict[str, float]]]:
    """Samples of 512 images: (images/s, first batch s) per repeat for 'auto' and each count."""

    def runs(pairs: list[tuple[float, float]]) -> list[dict[str, float]]:
        return [
            {"items_per_second": speed, "first_batch_seconds": first, "seconds": 512 / speed}
            for speed, first in pairs
        ]

    samples = {autostart._name(512, autostart.AUTO): runs(auto)}
    samples.update({autostart._name(512, count): runs(pairs) for count, pairs in fixed.items()})
    return samples


def ramp(seconds: float = 0.05) -> list[dict[str, Any]]:
    """The thread_events of one run: a start at ``seconds``."""
    return [{"item": 0, "seconds": seconds, "old": 2, "new": 32, "reason": "start: reads"}]


class TestAutostartTargets:
    """'auto' against the best fixed count of the same repeat, its first batch and its ramp."""

    FIXED = (16, 32)

    def samples(self) -> dict[str, list[dict[str, float]]]:
        """32 threads win repeat 0, 16 threads repeat 1."""
        return autostart_samples(
            auto=[(900.0, 0.12), (700.0, 0.2)],
            fixed={16: [(500.0, 0.1), (800.0, 0.1)], 32: [(1000.0, 0.1), (600.0, 0.3)]},
        )

    def test_the_settings_are_the_issues(self) -> None:
        """512 and 2048 images at 128x128 in batches of 64, against 4, 8, 16 and 32 threads."""
        assert autostart.SIZES == (512, 2048) and autostart.FIXED == (4, 8, 16, 32)
        assert (autostart.SIDE, autostart.BATCH) == (128, 64)

    def test_the_best_fixed_count_is_chosen_per_repeat(self) -> None:
        """Each repeat compares with its own fastest count, on images/s and first batch."""
        samples = self.samples()
        best = autostart._best(samples, 512, self.FIXED)
        assert best == [autostart._name(512, 32), autostart._name(512, 16)]
        auto = autostart._name(512, autostart.AUTO)
        assert autostart._vs_best(samples, auto, best, "items_per_second") == [0.9, 0.875]
        firsts = autostart._vs_best(samples, auto, best, "first_batch_seconds")
        assert firsts == pytest.approx([1.2, 2.0])

    def test_targets(self) -> None:
        """0.9x the best count (median 0.89: MISS), first batch 1.2x (median 1.6: MISS), ramp."""
        targets = autostart._size_targets(self.samples(), 512, self.FIXED, 64, [ramp(), ramp()])
        assert [target.passed for target in targets] == [False, False, True]
        assert "(8 batches of 64)" in targets[0].name and "0.9x the best fixed" in targets[0].name
        assert "1.2x the best fixed count's" in targets[1].name
        assert targets[0].detail == "0.89x" and targets[1].detail == "1.60x"
        samples = autostart_samples(
            auto=[(1000.0, 0.1)] * 2, fixed={16: [(1000.0, 0.1)] * 2, 32: [(1100.0, 0.12)] * 2}
        )
        passing = autostart._size_targets(samples, 512, self.FIXED, 64, [ramp(), ramp()])
        assert [target.passed for target in passing] == [True, True, True]

    def test_a_ramp_missing_or_outside_the_epoch_is_a_miss(self) -> None:
        """The ramp target wants a change in every run, every event within the epoch."""
        samples = self.samples()
        for traces in ([ramp(), []], [ramp(), ramp(-9000.0)], [ramp(), ramp(99.0)]):
            targets = autostart._size_targets(samples, 512, self.FIXED, 64, traces)
            assert not targets[2].passed, traces

    def test_ramp_text_and_median_run(self) -> None:
        """The note gives each change with its time and reason; the median run is chosen."""
        assert autostart.ramp_text(ramp()) == "0.050 s (item 0): 2 -> 32 (start: reads)"
        assert autostart._median_run([3.0, 1.0, 2.0]) == 2
        assert autostart._median_run([4.0, 1.0]) == 1


def test_handoff_targets_are_issue_34s() -> None:
    """At most 1.0x prefetch_generator at depths 1, 2 and 8; at most 0.5x at 64 and default."""
    rows = []
    for family in (handoff.REFERENCE, "BackgroundLoader", "prefetch.compat.BackgroundGenerator"):
        for depth in handoff.DEPTHS:
            ratio = 0.9 if family != handoff.REFERENCE else 1.0
            values: dict[str, float | str] = {
                "ratio": ratio,
                "us_per_item": 1.0,
                "x_plain": 2.0,
                "depth": float(depth),
            }
            rows.append(Row(f"{family} d={depth}", values))
    rows.append(Row(handoff.AUTO, {"x_plain": 2.0}))
    targets = handoff._targets(rows, lambda name: [0.4] if name == handoff.AUTO else [1.0])
    verdicts = {target.name.split(":")[0]: target.passed for target in targets}
    assert verdicts["hand-off d=2"] and verdicts["hand-off d=8"]  # 0.9x: within 1.0x
    assert not verdicts["hand-off d=64"]  # 0.9x: above 0.5x
    assert verdicts["hand-off default depth ('auto')"]  # 0.4x
    names = [target.name for target in targets]
    assert "hand-off d=8: BackgroundLoader <= 1x prefetch_generator" in names


class TestEpochs:
    """One epoch of the new pipelines, in this process: what they deliver."""

    @pytest.mark.skipif(not HAVE_TORCHDATA, reason="torchdata is not installed")
    def test_sample_level_pipeline_delivers_what_the_threads_do(self, tmp_path: Path) -> None:
        """ParallelMapper over samples + Batcher: the same batches, in order, at the side asked."""
        write_jpegs(tmp_path, 10)
        reports = {
            method: run_epoch(jpeg_spec(str(tmp_path), 10, 64, 4, method, count) | {"latency": 0.0})
            for method, count in (("sample_mapper", 3), ("threads", 3), ("dataloader", 0))
        }
        assert {report["items"] for report in reports.values()} == {10}
        assert {report["batches"] for report in reports.values()} == {3}
        assert len({report["checksum"] for report in reports.values()}) == 1
        assert "thread_events" in reports["threads"]  # jpeg_spec asks fetch_threads for them
        image, _ = JpegFolder(sorted(tmp_path.glob("*.jpg")), side=64)[0]
        assert tuple(image.shape) == (3, 64, 64)

    def test_auto_reports_its_thread_events(self, tmp_path: Path) -> None:
        """A traced fetch_threads='auto' epoch returns its thread_events as dicts."""
        write_jpegs(tmp_path, 4)
        spec = jpeg_spec(str(tmp_path), 4, 32, 2, "threads", "auto") | {"latency": 0.001}
        report = run_epoch(spec)
        assert report["items"] == 4
        for event in report["thread_events"]:
            assert {"item", "seconds", "old", "new", "reason"} == set(event)
        untraced = run_epoch(spec | {"trace": False})
        assert "thread_events" not in untraced
