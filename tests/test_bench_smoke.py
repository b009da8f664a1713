"""Smoke tests of ``python -m benchmarks`` (the benchmarks, outside the package).

They check that the commands run and write what the docs include; they never
assert on timings (the machines are shared and noisy).
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import re
import subprocess
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
import torch

from benchmarks import WORKLOADS
from benchmarks.__main__ import (
    BENCH_EXTRA,
    INSTALL_HINT,
    OPTIONAL_EXTRA,
    RESULTS,
    main,
    missing_extras,
    parse_args,
)
from benchmarks.common import (
    Column,
    Config,
    Row,
    Target,
    WorkloadResult,
    ideal_reference,
    ideal_row,
    median_ratio,
    paired_ratios,
    speedup_row,
)
from benchmarks.report import format_value, text_table, write_all

ROOT = Path(__file__).resolve().parents[1]
TRACE = {  # a depth trace as the bursty workload records it
    "items": 30,
    "step_ms": 5.0,
    "seconds": 0.2,
    "vs_ideal": 0.9,
    "start_depth": 2,
    "reference_depths": [2, 8],
    "slow_steps": 8.0,
    "slow_items": [10, 20, 30],
    "events": [
        {"item": 10, "seconds": 0.05, "old": 2, "new": 9, "reason": "grow"},
        {"item": 20, "seconds": 0.1, "old": 9, "new": 9, "reason": "hold"},
    ],
    "waits_ms": [1.0] + [0.0] * 8 + [30.0] + [0.0] * 20,
}
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
META = {
    "date": "2026-01-01 00:00 UTC",
    "python": "3.11",
    "torch": torch.__version__,
    "prefetch_generator": "1.0.3",
    "cpu_count": 2,
    "loadavg_start": "0.00 0.00 0.00",
    "repeats": 1,
    "quick": True,
}


def run_module(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class TestCommandLine:
    """``python -m benchmarks``: its arguments, output folder, missing extra and quick run."""

    @pytest.mark.slow
    @pytest.mark.timeout(240)
    def test_quick_run_writes_json_rst_and_plots(self, tmp_path: Path) -> None:
        """The quick run (CI's only benchmark run) writes every workload to JSON, reST and PNG."""
        if missing_extras():
            pytest.skip(f"the bench extra is not installed ({INSTALL_HINT})")
        out = tmp_path / "bench"
        done = run_module("benchmarks", "--quick", "--out", str(out), timeout=230)
        assert done.returncode == 0, done.stdout + done.stderr
        data = json.loads((out / "results.json").read_text(encoding="utf-8"))
        assert set(data) == {"meta", "workloads"}
        assert data["meta"]["quick"] is True
        assert data["meta"]["repeats"] == 1
        assert list(data["workloads"]) == list(WORKLOADS)
        assert "bursty" in WORKLOADS
        for name, workload in data["workloads"].items():
            assert workload["name"] == name
            assert {"title", "status", "rows", "targets", "columns", "params"} <= set(workload)
            if workload["status"] == "ok":
                assert workload["rows"], name
                if HAVE_MATPLOTLIB:
                    assert (out / f"{name}.png").stat().st_size > 0
                for row in workload["rows"]:
                    assert {"variant", "values", "samples"} <= set(row)
                for target in workload["targets"]:
                    assert isinstance(target["passed"], bool)
        gpu = data["workloads"]["gpu"]
        if not torch.cuda.is_available():
            assert gpu["status"] == "skipped"
            assert gpu["rows"] == [] and "cuda" in gpu["reason"].lower()
            assert "skipped" in done.stdout
        if HAVE_MATPLOTLIB:
            assert (out / "depth_trace.png").stat().st_size > 0
        handoff = {row["variant"] for row in data["workloads"]["handoff"]["rows"]}
        assert "BackgroundLoader depth=auto (default)" in handoff
        jpeg = data["workloads"]["jpeg"]
        assert jpeg["status"] == "ok" and jpeg["params"]["images"] == 24
        settings = {row["values"]["setting"] for row in jpeg["rows"]}
        assert settings == {"local", "latency"}
        assert {row["values"]["method"] for row in jpeg["rows"]} == {
            "dataloader",
            "threads",
            "parallel_mapper",
            "spdl",
        }
        ran = [row for row in jpeg["rows"] if row["values"]["note"] != "not available"]
        assert ran and all(row["values"]["items"] == 24 for row in ran)
        assert any("PSS" in target["name"] for target in jpeg["targets"])
        readbound = data["workloads"]["readbound"]
        assert readbound["status"] == "ok"
        loaders = {row["values"]["loader"] for row in readbound["rows"]}
        assert loaders == {
            "BackgroundLoader fetch_threads=16",
            "ParallelMapper(thread) x16",
            "ParallelMapper(thread) over samples + Batcher x16",
        }
        for row in readbound["rows"]:
            if row["values"]["note"]:  # torchdata not installed
                continue
            assert row["values"]["items"] in (16, 32), row["variant"]
            assert row["values"]["read_limit"] > 0 and row["values"]["cpu_limit"] > 0
            assert row["values"]["of_limit"] > 0 and row["values"]["first_batch_seconds"] > 0
        names = " | ".join(target["name"] for target in readbound["targets"])
        for part in ("1.05x ParallelMapper(thread) x16", "1.05x ParallelMapper(thread) over "):
            assert part in names
        assert "of the physical limit" in names and "first batch no later than" in names
        assert "physical limit" in done.stdout and "read limit s" in done.stdout
        autostart = data["workloads"]["autostart"]
        assert autostart["status"] == "ok"
        assert [row["variant"] for row in autostart["rows"]] == [
            "32 images: fetch_threads='auto'",
            "32 images: fetch_threads=16",
        ]
        assert [run["images"] for run in autostart["trace"]["runs"]] == [32]
        assert isinstance(autostart["trace"]["runs"][0]["events"], list)
        names = " | ".join(target["name"] for target in autostart["targets"])
        assert "0.9x the best fixed count" in names and "1.2x the best fixed count's" in names
        assert "ramp in thread_events" in names and "the median run's ramp" in done.stdout
        cow = {row["variant"]: row["values"] for row in data["workloads"]["cow"]["rows"]}
        assert cow["DataLoader num_workers=2"]["items"] == 100_000
        rst = (out / "results.rst").read_text(encoding="utf-8")
        assert "Hand-off overhead per item\n--------------------------" in rst
        assert ".. list-table::" in rst
        assert "PASS" in done.stdout or "MISS" in done.stdout

    def test_arguments(self) -> None:
        """Workloads run in their fixed order; unknown names and zero repeats are refused."""
        args = parse_args(["--workloads", "control,handoff", "--quick"])
        assert args.workloads == ["handoff", "control"]
        assert parse_args(["--workloads", "control,bursty,jittery"]).workloads == [
            "jittery",
            "bursty",
            "control",
        ]
        assert args.repeats == 1
        assert parse_args([]).repeats == 5
        with pytest.raises(SystemExit):
            parse_args(["--workloads", "nope"])
        with pytest.raises(SystemExit):
            parse_args(["--repeats", "0"])

    def test_default_output_is_the_repository_runs_folder(self) -> None:
        """Results go to this repository's runs/bench/, whatever the working directory."""
        assert RESULTS == ROOT / "runs" / "bench"
        assert parse_args([]).out == RESULTS

    def test_bench_extra_is_the_setup_cfg_extra(self) -> None:
        """The distributions checked before a run, and the optional ones, are the bench extra."""
        parser = configparser.ConfigParser()
        parser.read(ROOT / "setup.cfg", encoding="utf-8")
        lines = parser["options.extras_require"]["bench"].split()
        names = {re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].replace("-", "_") for line in lines}
        assert names == set(BENCH_EXTRA) | set(OPTIONAL_EXTRA)
        assert not set(BENCH_EXTRA) & set(OPTIONAL_EXTRA)

    def test_missing_extra_says_what_to_install(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Without a bench module nothing runs and the message names the extra to install."""
        real = importlib.util.find_spec

        def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
            return None if name == "prefetch_generator" else real(name, package)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        out = tmp_path / "results"
        assert main(["--quick", "--out", str(out)]) == 2
        message = capsys.readouterr().err
        assert "missing: " in message and "prefetch_generator" in message
        assert INSTALL_HINT in message and INSTALL_HINT == 'pip install -e ".[bench]"'
        assert not out.exists()


class TestMeasures:
    """The shared measuring code: per-repeat ratios, medians and rows."""

    def test_median_ratio_pairs_runs_of_the_same_repeat(self) -> None:
        """Ratios pair the runs of one repeat, then take the median."""
        samples = {"a": [{"seconds": 2.0}, {"seconds": 4.0}, {"seconds": 3.0}]}
        samples["b"] = [{"seconds": 1.0}, {"seconds": 2.0}, {"seconds": 3.0}]
        assert median_ratio(samples, "a", "b") == 2.0

    def test_paired_ratios_skip_a_zero_denominator(self) -> None:
        """A zero denominator is skipped; unequal lengths are an error."""
        assert paired_ratios([4.0, 6.0, 5.0], [2.0, 3.0, 0.0]) == [2.0, 2.0]
        with pytest.raises(ValueError):
            paired_ratios([1.0], [1.0, 2.0])

    def test_speedup_row_is_baseline_over_variant(self) -> None:
        """speedup is the median of baseline / variant time per repeat; extras are kept."""
        samples = {
            "plain": [{"seconds": 2.0, "wait": 0.5}, {"seconds": 6.0, "wait": 0.1}] * 2,
            "fast": [{"seconds": 1.0, "wait": 0.1}, {"seconds": 1.0, "wait": 0.3}] * 2,
        }
        samples["plain"].append({"seconds": 3.0, "wait": 0.2})
        samples["fast"].append({"seconds": 1.0, "wait": 0.2})
        row = speedup_row(samples, "fast", "plain", ("wait",), loader="workers=0")
        assert row.values["speedup"] == 3.0  # median of 2, 6, 2, 6, 3
        assert row.values["wait"] == 0.2 and row.values["loader"] == "workers=0"
        assert row.samples["seconds"] == [1.0] * 5 and row.samples["wait"][1] == 0.3
        assert speedup_row(samples, "plain", "plain", ("wait",)).values["speedup"] == 1.0

    def test_ideal_row_takes_per_repeat_ratios_and_leaves_blanks(self) -> None:
        """vs ideal and speed-up are per-repeat medians; figures a variant lacks stay blank."""
        samples = {
            "loader": [
                {"seconds": 2.0, "wait_fraction": 0.1, "peak_items": 9.0, "depth": 9.0},
                {"seconds": 4.0, "wait_fraction": 0.3, "peak_items": 5.0, "depth": 4.0},
                {"seconds": 1.0, "wait_fraction": 0.2, "peak_items": 3.0, "depth": 2.0},
            ],
            "generator": [{"seconds": 1.0, "wait_fraction": 0.0}] * 3,
        }
        row = ideal_row(samples, "loader", ideals=[1.0, 1.0, 0.9], plain=[4.0, 4.0, 4.0])
        assert row.values["vs_ideal"] == 0.5  # median of 0.5, 0.25, 0.9
        assert row.values["speedup"] == 2.0
        assert row.values["peak_items"] == 5.0 and row.values["depth"] == 4.0
        assert row.values["peak_mib"] == ""
        other = ideal_row(samples, "generator", ideals=[1.0] * 3, plain=[2.0] * 3)
        assert other.values["peak_items"] == "" and other.values["vs_ideal"] == 1.0
        reference = ideal_reference([1.0, 3.0, 2.0])
        assert reference.values["seconds"] == 2.0 and reference.values["depth"] == ""


class TestReport:
    """The reST page and JSON file the docs include."""

    def test_report_is_valid_rest(self, tmp_path: Path) -> None:
        """The page is valid reST with one section per workload; blanks and n/a are kept apart."""
        docutils_core = pytest.importorskip("docutils.core")
        result = WorkloadResult(
            name="demo",
            title="A *demo* workload",
            status="ok",
            description="What it measures | with odd characters.",
            columns=[Column("seconds", "epoch s"), Column("ratio", "speed-up", "{:.2f}x")],
            rows=[
                Row("plain", {"seconds": 1.0, "ratio": 1.0}, {"seconds": [1.0]}),
                Row("wrapped", {"seconds": 0.5, "ratio": float("nan")}, {"seconds": [0.5]}),
                Row("blank", {"seconds": 0.7, "ratio": ""}, {"seconds": [0.7]}),
            ],
            targets=[Target("faster", True, "2.00x")],
            plot="bar",
            trace=TRACE,
            trace_plot="demo_trace.png",
        )
        skipped = WorkloadResult(name="gpu", title="GPU", status="skipped", reason="no CUDA")
        written = write_all([result, skipped], dict(META), tmp_path, "Intro text.")
        plots = {"demo.png", "demo_trace.png"} if HAVE_MATPLOTLIB else set()
        assert {p.name for p in written} == {"results.rst", "results.json"} | plots
        assert "wrapped" in text_table(result) and "-" in text_table(result)
        assert format_value(result.columns[1], result.rows[2].values) == ""  # blank, not n/a
        assert format_value(result.columns[1], result.rows[1].values) == "n/a"
        rst = (tmp_path / "results.rst").read_text(encoding="utf-8")
        assert not any(line.endswith(" ") for line in rst.splitlines())
        assert (".. image:: demo_trace.png" in rst) == HAVE_MATPLOTLIB
        page = "Benchmarks\n==========\n\n" + rst  # as a docs page including it
        doctree = docutils_core.publish_doctree(page, settings_overrides={"warning_stream": False})
        messages = [node.astext() for node in doctree.findall() if node.tagname == "system_message"]
        assert not messages
        sections = [node for node in doctree.findall() if node.tagname == "section"]
        assert len(sections) == 2  # one subsection per workload, under the page title
        data = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
        assert data["workloads"]["demo"]["rows"][1]["values"]["ratio"] is None
        assert data["workloads"]["gpu"]["status"] == "skipped"
        assert data["workloads"]["demo"]["trace"]["events"][1]["reason"] == "hold"


class TestWorkloads:
    """Single workloads at smoke-test sizes."""

    def test_gpu_workload_is_skipped_without_cuda(self) -> None:
        """Without CUDA the GPU workload reports itself skipped, with no figures."""
        if torch.cuda.is_available():
            pytest.skip("CUDA present: the GPU workload would run")
        from benchmarks import gpu

        result = gpu.run(Config(repeats=1, quick=True))
        assert result.status == "skipped"
        assert result.rows == [] and result.targets == []

    @pytest.mark.slow
    @pytest.mark.timeout(60)
    def test_bursty_quick_run_compares_four_configurations(self, tmp_path: Path) -> None:
        """The bursty workload compares depth=auto with fixed depths, its bounds and its trace."""
        from benchmarks import bursty, jittery

        result = bursty.run(Config(repeats=1, quick=True))
        assert result.status == "ok"
        rows = {row.variant: row.values for row in result.rows}
        configurations = [jittery.AUTO, jittery.DEPTH_2, jittery.DEPTH_8, jittery.BG_DEFAULT]
        assert set(configurations) | {"ideal", jittery.PLAIN, jittery.LEARNED} <= set(rows)
        for name in configurations:
            assert 0.0 < float(rows[name]["vs_ideal"]) < 2.0, name
        assert rows[jittery.DEPTH_2]["depth"] == 2.0 and rows[jittery.DEPTH_8]["depth"] == 8.0
        assert float(rows[jittery.DEPTH_2]["peak_items"]) <= 2.0  # a fixed depth is exact
        assert 1.0 <= float(rows[jittery.AUTO]["peak_items"]) <= 32.0
        assert rows[jittery.BG_DEFAULT]["peak_items"] == ""  # a baseline reports none
        assert float(rows[bursty.BYTES_AUTO]["peak_mib"]) <= bursty.MAX_BYTES / 2**20
        names = " | ".join(target.name for target in result.targets)
        for part in ("depth=auto (default, fresh loader) >= 0.9", "throughput-bound", "max_bytes"):
            assert part in names
        assert all(isinstance(target.passed, bool) for target in result.targets)
        trace = result.trace
        assert trace["items"] == 40 and len(trace["waits_ms"]) == 40
        assert trace["start_depth"] == 2 and trace["slow_items"][0] == 10
        for event in trace["events"]:
            assert {"item", "seconds", "old", "new", "reason"} <= set(event)
            assert 1 <= event["item"] <= 40 and event["reason"]
        write_all([result], dict(META), tmp_path, "Intro.")
        data = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
        assert data["workloads"]["bursty"]["trace"]["items"] == 40
        if HAVE_MATPLOTLIB:
            assert (tmp_path / "depth_trace.png").stat().st_size > 0
            assert (tmp_path / "bursty.png").stat().st_size > 0
            assert ".. image:: depth_trace.png" in (tmp_path / "results.rst").read_text("utf-8")
