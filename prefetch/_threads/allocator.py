"""Freed tensor memory back to the system (glibc): opt-in, for the whole process.

glibc's ``malloc`` serves a request of at least its *mmap threshold* (128 KiB
at start) with its own ``mmap``, and ``free`` returns it to the system at
once. But the threshold is dynamic: each such block freed raises it to that
block's size (up to 32 MiB), so from then on every tensor of that size comes
from an arena, and a freed one stays in the process. Each thread allocates
from an arena of its own, so with fetch threads every arena keeps what its
thread once held, and the resident set grows beyond what is alive: measured
with 4 fetch threads, batches of 16 MiB and ``max_bytes=64 MiB``, 250 to 305
MiB, while ``stats.peak_bytes`` never passed 64 MiB; with the threshold fixed,
115 to 145 MiB (the budget, the batches the loop holds and those being
collated). At the sizes people train with the difference is small (batches
of 64 images 128x128: 8 MiB of peak RSS), and the fixed threshold costs
speed: every large tensor is mapped and its pages faulted in afresh on each
allocation (a 224x224 JPEG pipeline with 16 threads ran 25 to 35% slower).

Invariant: nothing here runs unless the user calls :func:`return_freed_memory`
(``prefetch.return_freed_memory()``): it fixes the threshold at glibc's
starting value for the whole process, once, and never where the C library is
not glibc or where the user chose a threshold (``MALLOC_MMAP_THRESHOLD_`` in
the environment, which glibc reads at start-up).
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
    """Have glibc give freed tensors back to the system, for the whole process (opt-in).

    With fetch threads glibc's per-thread arenas keep the memory of freed
    batches, so the resident set can grow to a few times ``max_bytes`` with
    large batches (the guide's memory section gives the bounds, measured).
    This fixes glibc's mmap threshold at its starting value, 128 KiB, so every
    tensor larger than that is mapped on allocation and returned on free: the
    resident set then stays near what is alive. It changes ``malloc`` for the
    whole process (and costs the time to map and fault in each large tensor
    afresh), which is why prefetch never does it by itself. Call it once, at
    start-up; it does nothing where the C library is not glibc or where
    ``MALLOC_MMAP_THRESHOLD_`` is set in the environment (your choice wins).

    Returns:
        Whether this process's threshold is now fixed by this call or an earlier one.

    Example:
        >>> import subprocess, sys
        >>> code = "import prefetch; print(prefetch.return_freed_memory())"
        >>> run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        >>> run.stdout.split() in (["True"], ["False"])  # False where glibc is not the C library
        True
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
