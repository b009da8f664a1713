"""Smoke tests of ``python -m prefetch.bench`` and ``python -m prefetch.demo``.

They check that the commands run and write what the docs include; they never
assert on timings (the machines are shared and noisy).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefetch.bench import WORKLOADS
from prefetch.bench.__main__ import parse_args
from prefetch.bench.common import Column, Config, Row, Target, WorkloadResult, median_ratio
from prefetch.bench.report import text_table, write_all

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_bench_writes_json_rst_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = run_module("prefetch.bench", "--quick", "--out", str(out), timeout=110)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert set(data) == {"meta", "workloads"}
    assert data["meta"]["quick"] is True
    assert data["meta"]["repeats"] == 1
    assert list(data["workloads"]) == list(WORKLOADS)
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
    rst = (out / "results.rst").read_text(encoding="utf-8")
    assert "Hand-off overhead per item\n--------------------------" in rst
    assert ".. list-table::" in rst
    assert "PASS" in done.stdout or "MISS" in done.stdout


def test_bench_arguments() -> None:
    args = parse_args(["--workloads", "control,handoff", "--quick"])
    assert args.workloads == ["handoff", "control"]
    assert args.repeats == 1
    assert parse_args([]).repeats == 5
    with pytest.raises(SystemExit):
        parse_args(["--workloads", "nope"])
    with pytest.raises(SystemExit):
        parse_args(["--repeats", "0"])


def test_median_ratio_pairs_runs_of_the_same_repeat() -> None:
    samples = {"a": [{"seconds": 2.0}, {"seconds": 4.0}, {"seconds": 3.0}]}
    samples["b"] = [{"seconds": 1.0}, {"seconds": 2.0}, {"seconds": 3.0}]
    assert median_ratio(samples, "a", "b") == 2.0


def test_gpu_workload_is_skipped_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the GPU workload would run")
    from prefetch.bench import gpu

    result = gpu.run(Config(repeats=1, quick=True))
    assert result.status == "skipped"
    assert result.rows == [] and result.targets == []


def test_report_is_valid_rest(tmp_path: Path) -> None:
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
        ],
        targets=[Target("faster", True, "2.00x")],
        plot="bar",
    )
    skipped = WorkloadResult(name="gpu", title="GPU", status="skipped", reason="no CUDA")
    written = write_all([result, skipped], dict(META), tmp_path, "Intro text.")
    expected = {"results.rst", "results.json"} | ({"demo.png"} if HAVE_MATPLOTLIB else set())
    assert {p.name for p in written} == expected
    assert "wrapped" in text_table(result) and "-" in text_table(result)
    rst = (tmp_path / "results.rst").read_text(encoding="utf-8")
    page = "Benchmarks\n==========\n\n" + rst  # as a docs page including it
    doctree = docutils_core.publish_doctree(page, settings_overrides={"warning_stream": False})
    messages = [node.astext() for node in doctree.findall() if node.tagname == "system_message"]
    assert not messages
    sections = [node for node in doctree.findall() if node.tagname == "section"]
    assert len(sections) == 2  # one subsection per workload, under the page title
    data = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert data["workloads"]["demo"]["rows"][1]["values"]["ratio"] is None
    assert data["workloads"]["gpu"]["status"] == "skipped"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_demo_prints_the_comparison_table() -> None:
    done = run_module("prefetch.demo", "--epochs", "1", "--batches", "4", timeout=80)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "waited for data" in done.stdout
    assert "plain DataLoader" in done.stdout
    assert "BackgroundLoader(DataLoader)" in done.stdout
    assert "identical" in done.stdout
