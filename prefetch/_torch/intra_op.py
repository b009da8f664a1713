"""Torch's intra-op thread count for one thread only, through the OpenMP runtime.

``torch.set_num_threads(n)`` sets the calling thread's count *and* a
process-wide one: every thread that has not run a parallel torch op yet, the
main thread included, starts from it (checked on torch 2.6.0, 2.12.0,
2.13.0, 2.15.0). A loading thread that called it would change the training step's
threads. With ATen's OpenMP backend a thread's count is its OpenMP
``nthreads`` setting (``omp_get_max_threads``), which torch fills from the
process-wide count once per thread, the first time the thread asks for it
(``torch.get_num_threads()`` does). After that first ask, the OpenMP runtime's
own ``omp_set_num_threads(n)`` sets the calling thread's count and nothing
else: :func:`set_thread_intra_op_threads`.

Off (:mod:`prefetch._torch`: no OpenMP backend, its runtime not found, or the
count not taken), a count the user asked for falls back to
``torch.set_num_threads`` (process-wide, as torch does it), and fetch threads
keep torch's default count.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Callable

import torch

from prefetch._torch.workaround import Workaround

MAPS = "/proc/self/maps"
"""The libraries this process has loaded (Linux)."""
RUNTIME = re.compile(r"^lib(gomp|iomp5|iomp5md|omp)[-.]")
"""The file names of the OpenMP runtimes torch ships with (GNU, Intel, LLVM)."""


@functools.cache
def _runtime() -> Callable[[int], object] | None:
    """The loaded OpenMP runtime's ``omp_set_num_threads``, or ``None`` if none is found."""
    torch_dir = os.path.dirname(torch.__file__)
    paths: list[str] = []
    try:
        with open(MAPS) as maps:
            paths = [line.split()[-1] for line in maps if "/" in line]
    except OSError:  # not Linux: look where torch keeps its libraries
        for folder in (os.path.join(torch_dir, "lib"), torch_dir + ".libs"):
            if os.path.isdir(folder):
                paths += [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
    found = [path for path in paths if RUNTIME.match(os.path.basename(path))]
    found.sort(key=lambda path: not path.startswith(torch_dir))  # torch's own first
    for path in found:
        try:
            setter = ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        setter.argtypes, setter.restype = [ctypes.c_int], None
        return setter
    return None


def _openmp_backend() -> str | None:
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return "ATen's parallel backend is not OpenMP (torch.__config__.parallel_info())"
    return None


def _runtime_found() -> str | None:
    if _runtime() is None:
        return "no OpenMP runtime with omp_set_num_threads is loaded (libgomp, libiomp5, libomp)"
    return None


THREAD_INTRA_OP = Workaround(
    "per-thread intra-op count",
    "torch.set_num_threads in a loading thread also sets the count of every thread that has "
    "not run a parallel op yet, the main thread included",
    ("2.6.0", "2.12.0", "2.13.0", "2.15.0"),
    "fetch threads run torch ops with torch's default count, and num_threads= sets torch's "
    "count for the whole process",
    [_openmp_backend, _runtime_found],
)


def set_thread_intra_op_threads(threads: int) -> bool:
    """Make the calling thread's torch ops use ``threads`` threads, this thread only.

    Returns whether it did (``False`` while the workaround is off: then
    nothing changed).

    Example:
        >>> import threading
        >>> counts = []
        >>> def load():
        ...     counts.append(set_thread_intra_op_threads(1) and torch.get_num_threads())
        >>> before = torch.get_num_threads()
        >>> thread = threading.Thread(target=load)
        >>> thread.start(); thread.join()
        >>> counts in ([1], [False]), torch.get_num_threads() == before
        (True, True)
    """
    if not THREAD_INTRA_OP.active():
        return False
    torch.get_num_threads()  # torch's one fill of this thread's count: after it, ours stays
    setter = _runtime()
    assert setter is not None  # active: the check found it
    setter(threads)
    got = torch.get_num_threads()
    if got != threads:
        THREAD_INTRA_OP.turn_off(
            f"torch.get_num_threads() gave {got} after the OpenMP runtime's "
            f"omp_set_num_threads({threads})"
        )
        return False
    return True
