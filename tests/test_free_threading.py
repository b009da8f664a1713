"""The free-threaded run's GIL check (``tests/gil.py``) holds, and can fail.

``make test-ft`` runs the suite on CPython 3.13t with ``PYTHON_GIL=0``. These
tests run on any interpreter; the ones about a free-threaded run skip elsewhere.
The failing sessions run in a subprocess, as a user would start them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from .gil import FREE_THREADED, HINT, gil_enabled, gil_problem

ROOT = Path(__file__).resolve().parent.parent
needs_free_threading = pytest.mark.skipif(
    not FREE_THREADED, reason="needs a free-threaded Python (make test-ft)"
)
DEMO = "PREFETCH_GIL_CHECK_DEMO"


def run_pytest(test: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in env}
    environ.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"{__file__}::{test}"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_no_problem_where_the_interpreter_has_a_gil() -> None:
    """On 3.11 (a GIL always on) the check says nothing: a normal run is unaffected."""
    if FREE_THREADED:
        assert gil_problem("now") is None  # this session got past its start: the GIL is off
    else:
        assert gil_enabled() and gil_problem("now") is None


@needs_free_threading
def test_the_gil_is_off() -> None:
    """The suite runs with the GIL off (the session would have stopped otherwise)."""
    assert not sys._is_gil_enabled()


@needs_free_threading
def test_turn_the_gil_on() -> None:
    """Only in the subprocess below: import a module that turns the GIL on (triton)."""
    if os.environ.get(DEMO) != "1":
        pytest.skip(f"demonstration for test_a_session_whose_gil_comes_on_fails ({DEMO}=1)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "the GIL has been enabled to load ..."
        pytest.importorskip("triton")
    assert gil_enabled(), "importing triton did not turn the GIL on: nothing to demonstrate"


@needs_free_threading
@pytest.mark.slow
def test_a_session_started_with_the_gil_on_fails() -> None:
    """``PYTHON_GIL=1``: the session stops at its start and exits non-zero."""
    done = run_pytest("test_the_gil_is_off", PYTHON_GIL="1")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "the GIL is enabled at the start of the session" in done.stdout + done.stderr
    assert HINT in done.stdout + done.stderr


@needs_free_threading
@pytest.mark.slow
def test_a_session_whose_gil_comes_on_fails() -> None:
    """An import that turns the GIL on fails its test and the session."""
    pytest.importorskip("triton")  # the CUDA build of torch brings it
    done = run_pytest("test_turn_the_gil_on", PYTHON_GIL=None, **{DEMO: "1"})
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "the GIL came on during this test" in out
    assert "the GIL is enabled at the end of the session" in out
