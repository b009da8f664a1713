"""GPU tests: every module here marks itself ``gpu`` and skips without CUDA.

A GPU idles at a low clock and speeds up under load (an H200 by several
times): a test that calibrates against GPU time while the clock is still
rising measures the wrong thing. :func:`warm_gpu` runs first, once per
session, and keeps the GPU busy until it is at its working clock; a timing
test that idles the GPU while it prepares calls
:func:`~tests.gpu.gpu_helpers.busy_gpu` again just before it measures.
"""

from __future__ import annotations

import pytest
import torch

from .gpu_helpers import busy_gpu

WARM_SECONDS = 1.5
"""How long :func:`warm_gpu` keeps the GPU busy with matrix products."""


@pytest.fixture(scope="session", autouse=True)
def warm_gpu() -> None:
    """Keep the GPU busy for :data:`WARM_SECONDS` before the first GPU test (no-op on a CPU)."""
    if torch.cuda.is_available():
        busy_gpu(WARM_SECONDS)
