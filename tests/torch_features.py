"""What the installed torch can do, for tests that need a newer torch than the oldest supported.

``make test-torch-range`` runs the quick suite on the oldest torch the README
claims (2.6.0): a test of something that torch lacks skips there, saying what.
"""

from __future__ import annotations

import pytest
import torch


def profiles_all_threads() -> bool:
    """Whether ``torch.profiler`` can record every thread (``profile_all_threads``).

    torch 2.6.0 cannot (its ``_ExperimentalConfig`` has no such argument);
    2.12.0, 2.13.0 and 2.15.0 can.
    """
    from torch.profiler import _ExperimentalConfig

    try:
        _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return False
    return True


ALL_THREADS_REASON = (
    f"torch {torch.__version__}'s profiler cannot record other threads "
    "(_ExperimentalConfig has no profile_all_threads; 2.6.0 has none, 2.12.0 has it)"
)
needs_all_threads_profiler = pytest.mark.skipif(
    not profiles_all_threads(), reason=ALL_THREADS_REASON
)
"""Skip a test of the producer thread's profiler ranges on a torch that cannot record them."""
