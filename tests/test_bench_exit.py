"""``python -m benchmarks``: extras checked per workload, where results go, the exit status.

A run needs only the ``bench`` extras of the workloads it runs (the GPU
machine has no ``prefetch_generator``); it writes to the ignored
``runs/bench/`` unless told otherwise, so it never changes a tracked file;
and its exit status tells an error (1) and nothing run (2) apart from, with
``--check``, a target MISS (3).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import benchmarks.__main__ as cli
from benchmarks import WORKLOADS
from benchmarks.common import Target, WorkloadResult

ROOT = Path(__file__).resolve().parents[1]
IMPORT_WITH_ONLY = """
import importlib, sys
import torch, torch.utils.data, prefetch  # already loaded before any workload imports
from benchmarks.__main__ import BENCH_EXTRA, OPTIONAL_EXTRA, WORKLOAD_EXTRAS
name = sys.argv[1]
allowed = {BENCH_EXTRA[dist] for dist in WORKLOAD_EXTRAS[name]}
for module in [*BENCH_EXTRA.values(), *OPTIONAL_EXTRA.values()]:
    if module not in allowed:
        sys.modules[module] = None  # import fails, as when it is not installed
importlib.import_module(f"benchmarks.{name}")
"""


def result(name: str, status: str = "ok", *passed: bool) -> WorkloadResult:
    """A synthetic workload result with one target per ``passed``."""
    targets = [Target(f"{name} target {i}", ok, "detail") for i, ok in enumerate(passed)]
    return WorkloadResult(name=name, title=name, status=status, targets=targets, reason="why")


class TestExtrasPerWorkload:
    """Each workload needs only the extras it uses."""

    def test_table_covers_every_workload(self) -> None:
        """Every workload has an entry, naming only distributions of the bench extra."""
        assert set(cli.WORKLOAD_EXTRAS) == set(WORKLOADS)
        for needs in cli.WORKLOAD_EXTRAS.values():
            assert set(needs) <= set(cli.BENCH_EXTRA)
        assert "prefetch_generator" not in cli.WORKLOAD_EXTRAS["gpu"]

    def test_missing_names_the_workloads_that_need_it(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """Without prefetch_generator, gpu and jpeg miss nothing; handoff does, and says so."""
        monkeypatch.setitem(sys.modules, "prefetch_generator", None)
        assert cli.missing_extras(["gpu", "jpeg"]) == {}
        assert cli.missing_extras(["handoff", "gpu", "control"]) == {
            "prefetch_generator": ["handoff", "control"]
        }
        out = tmp_path / "results"
        assert cli.main(["--workloads", "handoff,gpu", "--out", str(out)]) == cli.EXIT_NOT_RUN
        assert "prefetch_generator (for handoff)" in capsys.readouterr().err
        assert not out.exists()

    @pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the gpu workload runs long")
    def test_gpu_workload_runs_without_prefetch_generator(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """With prefetch_generator not importable, ``--workloads gpu`` runs and reports itself."""
        monkeypatch.setitem(sys.modules, "prefetch_generator", None)
        out = tmp_path / "results"
        assert cli.main(["--workloads", "gpu", "--check", "--out", str(out)]) == cli.EXIT_OK
        data = json.loads((out / "results.json").read_text(encoding="utf-8"))
        assert data["workloads"]["gpu"]["status"] == "skipped"

    @pytest.mark.slow
    @pytest.mark.timeout(120)
    def test_each_workload_imports_with_only_its_extras(self) -> None:
        """Each workload's module imports with every other bench module made unimportable."""
        runs = {
            name: subprocess.Popen(
                [sys.executable, "-c", IMPORT_WITH_ONLY, name],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name in WORKLOADS
        }
        failed = {}
        for name, run in runs.items():
            output, _ = run.communicate(timeout=110)
            if run.returncode != 0:
                failed[name] = output.strip().splitlines()[-1:]
        assert not failed


class TestExitStatus:
    """0 ran, 1 a workload raised, 2 nothing ran, 3 a MISS under --check."""

    def test_statuses_are_distinct(self) -> None:
        """The four statuses differ, and 0 is success."""
        statuses = (cli.EXIT_OK, cli.EXIT_ERROR, cli.EXIT_NOT_RUN, cli.EXIT_MISS)
        assert cli.EXIT_OK == 0 and len(set(statuses)) == 4

    def test_exit_status_of_synthetic_results(self) -> None:
        """A MISS fails only with check; an error wins over a MISS; a skip is no failure."""
        passing = [result("a", "ok", True, True), result("gpu", "skipped")]
        missing = [result("a", "ok", True, False), result("b", "ok", True)]
        broken = [result("a", "ok", False), result("b", "error")]
        for check in (False, True):
            assert cli.exit_status(passing, check=check) == cli.EXIT_OK
            assert cli.exit_status(broken, check=check) == cli.EXIT_ERROR
        assert cli.exit_status(missing, check=False) == cli.EXIT_OK
        assert cli.exit_status(missing, check=True) == cli.EXIT_MISS

    @pytest.mark.parametrize(
        ("made", "check", "status"),
        [
            (result("gpu", "ok", True, False), True, cli.EXIT_MISS),
            (result("gpu", "ok", True, False), False, cli.EXIT_OK),
            (result("gpu", "ok", True, True), True, cli.EXIT_OK),
            (result("gpu", "error"), True, cli.EXIT_ERROR),
        ],
    )
    def test_main_returns_it(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        made: WorkloadResult,
        check: bool,
        status: int,
    ) -> None:
        """main() runs the (synthetic) workload, writes its report and returns that status."""
        monkeypatch.setattr(cli, "run_workload", lambda name, config: made)
        monkeypatch.setattr(cli, "missing_extras", lambda workloads: {})
        args = ["--workloads", "gpu", "--out", str(tmp_path), *(["--check"] if check else [])]
        assert cli.main(args) == status
        printed = capsys.readouterr().out
        assert ("MISS  gpu target" in printed) == any(not t.passed for t in made.targets)
        assert (tmp_path / "results.json").exists()
        assert (f"exit {status}" in printed) == (status != cli.EXIT_OK)


class TestOutput:
    """A run writes to an ignored folder; the docs page is refreshed on purpose only."""

    def test_default_folder_is_ignored_and_not_in_docs(self) -> None:
        """runs/bench/ is outside docs/ and git ignores what is written there."""
        assert cli.parse_args([]).out == cli.RESULTS == ROOT / "runs" / "bench"
        assert not cli.RESULTS.is_relative_to(ROOT / "docs")
        if shutil.which("git") is None or not (ROOT / ".git").exists():
            pytest.skip("not a git checkout")
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", "runs/bench/results.json"], cwd=ROOT, check=False
        )
        assert ignored.returncode == 0

    def test_make_targets(self) -> None:
        """make bench checks the targets into runs/bench/; make bench-docs writes the docs."""
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        recipes = {
            block.split(":", 1)[0]: block.splitlines()[1].strip()
            for block in makefile.split("\n\n")
            if block.startswith(("bench:", "bench-docs:"))
        }
        assert "BENCH_OUT ?= runs/bench" in makefile
        assert recipes["bench"] == "$(PY) -m benchmarks --check --out $(BENCH_OUT) $(BENCH_ARGS)"
        assert recipes["bench-docs"] == "$(PY) -m benchmarks --out docs/benchmarks $(BENCH_ARGS)"
        assert cli.DOCS_RESULTS == ROOT / "docs" / "benchmarks"
