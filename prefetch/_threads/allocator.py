"""Freed tensor memory goes back to the system while fetch threads run (glibc).

glibc's ``malloc`` serves a request of at least its *mmap threshold* (128 KiB
at start) with its own ``mmap``, and ``free`` returns it to the system at
once. But the threshold is dynamic: each such block freed raises it to that
block's size (up to 32 MiB), so from then on every tensor of that size comes
from an arena, and a freed one stays in the process. Each fetch thread
allocates from an arena of its own, so every arena keeps what its thread once
held, and the resident set grows far beyond what is alive: measured with 4
fetch threads, batches of 16 MiB and ``max_bytes=64 MiB``, it grew 300 MiB,
while ``stats.peak_bytes`` never passed 64 MiB; with a fixed threshold it grew
101 MiB (the budget, the batches the loop holds and one being collated).

Invariant: :func:`return_freed_memory` fixes the threshold at glibc's starting
value once per process, the first time a :class:`~prefetch.BackgroundLoader`
with ``fetch_threads`` starts an epoch, and never otherwise: not with one
thread (its single arena reuses what it frees), not where the C library is not
glibc, and not when the user chose a threshold (``MALLOC_MMAP_THRESHOLD_`` in
the environment, which glibc reads at start-up). What it costs: a large tensor
is mapped and its pages faulted in on each allocation instead of reused.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number for the mmap threshold (``malloc.h``)."""
FIXED_THRESHOLD = 128 * 1024
"""The threshold fixed: glibc's own starting value."""
USER_SETTING = "MALLOC_MMAP_THRESHOLD_"
"""The environment variable through which a user sets the threshold for glibc."""

_lock = threading.Lock()
_done: bool | None = None  # None: not tried yet; else whether the threshold was fixed


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold once (see the module invariant); idempotent.

    Returns:
        Whether this process's threshold is fixed by prefetch.
    """
    global _done
    with _lock:
        if _done is None:
            _done = _fix_threshold()
        return _done


def _fix_threshold() -> bool:
    if USER_SETTING in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, FIXED_THRESHOLD))
