"""``scripts/gpu_check.sh`` and the GPU tests, checked on a CPU.

The check runs for real only on a GPU machine that is lent briefly, where it
has to work the first time. ``GPU_CHECK_DRY_RUN=1`` (for testing the script
only) hides every GPU from torch and runs the same steps: the GPU tests are
collected and skip, the GPU benchmark reports itself skipped, and every
result lands flat in ``GPU_OUT``, as the device runner brings back (at most
8 files, no folders). A fake ``nvidia-smi`` stands in for the clocks, and
``prefetch_generator`` is blocked, as it is not installed on that machine.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch

from prefetch._device import normalize as normalize_module
from prefetch._device.copier import StreamCopier

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
WRITTEN = {"check.txt", "tests.txt", "tests.xml", "bench.txt", "results.json", "results.rst"}
"""What a run without CUDA writes (with CUDA, also ``gpu.png``)."""
BROUGHT_BACK = 8
"""The most files the device runner brings back from its output folder."""
FAKE_SMI = """#!/usr/bin/env bash
case "$*" in
    *-L*) echo "GPU 0: Fake H200 (UUID: GPU-fake)" ;;
    *--query-gpu*) echo "index, name, clocks.current.sm [MHz], clocks.max.sm [MHz]"
                   echo "0, Fake H200, 345 MHz, 1980 MHz" ;;
    *) exit 9 ;;
esac
"""
NO_GPU_SMI = """#!/usr/bin/env bash
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""
BLOCKER = 'import sys\nsys.modules["prefetch_generator"] = None  # not installed there\n'

needs_no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a real GPU here: the no-GPU paths cannot be shown"
)


def run_script(
    tmp_path: Path, *, dry_run: bool, fake_gpu: bool, timeout: float
) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, str]]:
    """Run the script into ``tmp_path/out`` with this Python; return the run, folder and env."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    shims = {  # ahead of any real ones on PATH: every Python the script tries is this one
        "nvidia-smi": FAKE_SMI if fake_gpu else NO_GPU_SMI,
        "python3": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
        "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
    }
    for name, text in shims.items():
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "GPU_CHECK_DRY_RUN"}
    out = tmp_path / "out"
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(site),
        GPU_OUT=str(out),
        GPU_PYTHON=sys.executable,
    )
    if dry_run:
        env["GPU_CHECK_DRY_RUN"] = "1"
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done, out, env


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dry_run_writes_every_result_flat(tmp_path: Path) -> None:
    """Every step runs to the end, exit 0, at most 8 files flat, the versions printed first."""
    done, out, env = run_script(tmp_path, dry_run=True, fake_gpu=True, timeout=290)
    assert done.returncode == 0, done.stdout + done.stderr
    blocked = subprocess.run(
        [sys.executable, "-c", "import prefetch_generator"], env=env, capture_output=True
    )
    assert blocked.returncode != 0  # the run above could not import it either
    entries = list(out.iterdir())
    assert all(entry.is_file() for entry in entries), entries  # flat: no folders
    names = {entry.name for entry in entries}
    assert len(names) <= BROUGHT_BACK and WRITTEN <= names <= WRITTEN | {"gpu.png"}
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpu-check: python ")
    assert lines[1].startswith("gpu-check: torch ") and "CUDA" in lines[1]
    assert lines[2].startswith("gpu-check: clocks before: index, name, clocks.current.sm")
    assert lines[3] == "gpu-check: clocks before: 0, Fake H200, 345 MHz, 1980 MHz"
    summary = (out / "check.txt").read_text(encoding="utf-8").splitlines()
    assert summary[:4] == lines[:4]
    assert "gpu-check: tests: exit 0 (" in "\n".join(summary)
    assert "gpu-check: benchmark: exit 0 " in "\n".join(summary)
    assert summary[-1].endswith("; exit 0")
    suite = ElementTree.parse(out / "tests.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests", "0")) >= 20  # every GPU test collected
    assert int(suite.get("skipped", "0")) == int(suite.get("tests", "0"))
    assert suite.get("errors") == "0" and suite.get("failures") == "0"
    bench = (out / "bench.txt").read_text(encoding="utf-8")
    assert "skipped: " in bench and "Traceback" not in bench and "bench extra" not in bench
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert list(results["workloads"]) == ["gpu"]
    assert results["workloads"]["gpu"]["status"] == "skipped"


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_no_cuda
def test_without_a_gpu_says_so_and_exits_0(tmp_path: Path) -> None:
    """nvidia-smi finds no GPU and no torch sees CUDA: a message, exit 0, nothing written."""
    done, out, _ = run_script(tmp_path, dry_run=False, fake_gpu=False, timeout=110)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("gpu-check: python ")
    assert "no CUDA GPU on this machine" in done.stdout
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_no_cuda
def test_a_gpu_without_a_cuda_torch_names_the_fix(tmp_path: Path) -> None:
    """nvidia-smi sees a GPU but no Python's torch does: exit 1, naming GPU_PYTHON."""
    done, out, _ = run_script(tmp_path, dry_run=False, fake_gpu=True, timeout=110)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "set GPU_PYTHON" in done.stdout and "Fake H200" in done.stdout
    assert not out.exists()


def test_script_installs_nothing_and_make_only_calls_it() -> None:
    """No pip in the script (the GPU machine has no network); the make target only runs it."""
    code = [line for line in SCRIPT.read_text(encoding="utf-8").splitlines() if "#" not in line]
    assert not any(re.search(r"\bpip\b", line) for line in code)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ngpu-check:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [line.strip() for line in recipe] == ["GPU_OUT='$(GPU_OUT)' bash scripts/gpu_check.sh"]


OTHER_SEAMS: dict[str, object] = {"_stream_key": normalize_module}
"""Private names the GPU controls replace elsewhere than on StreamCopier, with their owner."""


def test_sabotaged_protections_exist() -> None:
    """Each StreamCopier method the GPU controls switch off exists, so a control can fail.

    The controls in ``tests/gpu`` replace these methods by name; one renamed
    would fail only on a GPU, where time is short. The default-stream control
    replaces ``_consumer_wait`` with a function of the same parameters.
    """
    names = set()
    for module in (ROOT / "tests" / "gpu").glob("test_*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"_[a-z][a-z_]*", value):
                names.add(value)
    assert names >= {"_consumer_wait", "_fence", "_record_leaves", "_keep_inputs_alive"}
    for name in names:
        owner = OTHER_SEAMS.get(name, StreamCopier)
        assert callable(getattr(owner, name, None)), name
    parameters = list(inspect.signature(StreamCopier._consumer_wait).parameters)
    assert parameters == ["self", "consumer", "event"]
