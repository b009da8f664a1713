"""The GIL check of a free-threaded run (``make test-ft``): a check, not a hope.

On a free-threaded CPython (``Py_GIL_DISABLED`` is 1) the suite only proves
something about threads running Python in parallel if the GIL stays off while
it runs. CPython turns it back on at start-up with ``PYTHON_GIL=1`` and later
when a module is imported that has not declared it runs without the GIL (triton,
pulled in by ``torch._inductor`` and by lightning, unless ``PYTHON_GIL=0``).
``tests/conftest.py`` uses these hooks: the session stops at once if the GIL is
on at its start, a test during which it came on fails, and the session fails if
it is on at the end. On an interpreter with a GIL (3.11) none of this applies.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterator

import pytest

FREE_THREADED = sysconfig.get_config_var("Py_GIL_DISABLED") == 1
HINT = "run free-threaded tests with PYTHON_GIL=0 (make test-ft sets it)"


def gil_enabled() -> bool:
    """Return whether the GIL is on now (always True where there is no choice)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def gil_problem(when: str) -> str | None:
    """Return why a free-threaded run is not one ``when``, or None when the GIL is off."""
    if FREE_THREADED and gil_enabled():
        return f"free-threaded Python, but the GIL is enabled {when}: {HINT}"
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop before running anything when the GIL is already on."""
    problem = gil_problem("at the start of the session")
    if problem is not None:
        pytest.exit(problem, returncode=pytest.ExitCode.TESTS_FAILED)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when the GIL came on while it ran (an import, a test)."""
    problem = gil_problem("at the end of the session")
    if problem is not None:
        session.config.stash[GIL_PROBLEM] = problem
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say why a session whose tests passed failed all the same."""
    problem = terminalreporter.config.stash.get(GIL_PROBLEM, None)
    if problem is not None:
        terminalreporter.section("GIL check", sep="=", red=True, bold=True)
        terminalreporter.line(f"FAILED: {problem}", red=True)


@pytest.fixture(autouse=True)
def the_gil_stays_off() -> Iterator[None]:
    """Fail the test during which the GIL came on (it names the culprit; later tests pass)."""
    was_off = FREE_THREADED and not gil_enabled()
    yield
    if was_off and gil_enabled():
        pytest.fail(f"the GIL came on during this test (an import?): {HINT}")


GIL_PROBLEM = pytest.StashKey[str]()
