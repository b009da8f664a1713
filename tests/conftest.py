"""Shared fixtures: every test must leave no ``prefetch-`` thread behind.

On a free-threaded Python the GIL must stay off while the tests run (``gil.py``).
SIGINT is handled as in a terminal, even when the run was started as a shell's
background job.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest

from .accelerators import make_accelerator, reset_accelerate  # noqa: F401  (a fixture, found by name)
from .gil import (  # noqa: F401  (hooks and a fixture, found by name)
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
    the_gil_stays_off,
)
from .processes import prefetch_threads, wait_until

LEAK_GRACE_SECONDS = 3.0

# The tests build every model and dataset in memory (transformers from a config): never
# reach for the Hugging Face hub, here or in a child process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A non-interactive shell's background job (`make stress-ft &`) starts with SIGINT
    # ignored, and Python then installs no handler: _thread.interrupt_main() does
    # nothing and the Ctrl-C tests' scripts (which inherit it) ignore their SIGINTs.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def no_prefetch_thread_outlives_the_test() -> Iterator[None]:
    """Fail a test that leaves a ``prefetch-`` thread alive for more than a few seconds."""
    yield
    if not wait_until(lambda: not prefetch_threads(), LEAK_GRACE_SECONDS):
        names = [t.name for t in prefetch_threads()]
        pytest.fail(f"prefetch threads outlived the test: {names}")


@pytest.fixture(autouse=True)
def no_accelerator_outlives_the_test() -> Iterator[None]:
    """Forget any Accelerator a test made, its own or one a framework made for it.

    accelerate's state is process-wide: a ``transformers.Trainer`` leaves an
    Accelerator set up, and every later test that wraps a plain DataLoader
    would then be warned that accelerate has not prepared it.
    """
    yield
    if "accelerate.state" in sys.modules:
        reset_accelerate()
