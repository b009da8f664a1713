"""Side streams of our own: created outside torch's stream pool, recycled between prefetchers.

``torch.cuda.Stream()`` hands out one of 32 pool streams per priority,
round-robin, so other code (another prefetcher, a graph capture, a library)
can be handed the same ``cudaStream_t`` and allocate on it. Memory the
consumer freed after a fenced copy goes back to that stream's pool, and an
allocation that is not fenced could take it while the consumer's kernels
still read it. A CUDA side stream is therefore created by the driver
(:func:`create_cuda_stream`, non-blocking like torch's own) and wrapped in
``torch.cuda.ExternalStream``; nobody else is handed it.

Such a stream is never destroyed: the caching allocator keeps cached blocks
under its handle, and a new stream given the same handle value would inherit
them unordered. When a prefetcher is collected its stream goes back to
:data:`REGISTRY`, with the consumer streams whose reads of its memory only a
fence orders (:attr:`SideStream.readers`); a later prefetcher that takes it
keeps fencing those too, so recycling is as safe as a stream of one's own.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

CU_STREAM_NON_BLOCKING = 0x1
"""``cuStreamCreate`` flag: no implicit synchronisation with the legacy default stream."""


class SideStream:
    """A side stream and the consumer streams that must be fenced before it allocates.

    ``readers`` grows, never shrinks: a batch a previous owner handed over
    may be freed at any later time, on the stream that read it.
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.readers: list[Any] = []

    def fence_targets(self, consumer: Any) -> list[Any]:
        """Add ``consumer`` to the readers (once); return every reader to wait for."""
        if not any(reader == consumer for reader in self.readers):
            self.readers.append(consumer)
        return self.readers


class StreamRegistry:
    """Free side streams per (ops type, device); thread-safe (finalizers run anywhere)."""

    def __init__(self) -> None:
        self._free: dict[tuple[type, Any], list[SideStream]] = {}
        self._lock = threading.Lock()

    def acquire(self, ops: Any, *, fences: bool) -> tuple[SideStream, tuple[type, Any]]:
        """Return a free side stream for ``ops``' device (or a new one) and its key.

        A copier that does not fence (``record_stream`` lifetime) only takes a
        stream no previous owner fenced: it would not wait for their readers.
        """
        key = (type(ops), ops.device)
        with self._lock:
            free = self._free.get(key, [])
            for index in range(len(free) - 1, -1, -1):
                if fences or not free[index].readers:
                    return free.pop(index), key
        return SideStream(ops.new_stream()), key

    def release(self, side: SideStream, key: tuple[type, Any]) -> None:
        """Give ``side`` back for a later prefetcher on the same device."""
        with self._lock:
            self._free.setdefault(key, []).append(side)

    def free_count(self, key: tuple[type, Any]) -> int:
        """How many streams wait for a new owner under ``key``."""
        with self._lock:
            return len(self._free.get(key, []))


REGISTRY = StreamRegistry()
"""The process's side streams (tests swap in a fresh one)."""


class DriverError(RuntimeError):
    """A CUDA driver call failed (or the driver library is missing)."""


def _driver() -> Any:
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        return ctypes.CDLL(name)
    except OSError as error:
        msg = f"cannot load the CUDA driver library {name}: {error}"
        raise DriverError(msg) from error


def _check(result: int, call: str) -> None:
    if result != 0:
        msg = f"{call} failed with CUresult {result}"
        raise DriverError(msg)


def create_cuda_stream(index: int) -> int:
    """Create a non-blocking stream on CUDA device ``index`` in its primary context.

    The primary context is the one the CUDA runtime, and so torch, uses; it
    is retained here and never released (torch never releases it either), so
    the stream outlives any reset of the runtime's own reference. Returns the
    ``cudaStream_t`` as an int, for ``torch.cuda.ExternalStream``.
    """
    cuda = _driver()
    _check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    _check(cuda.cuDeviceGet(ctypes.byref(device), ctypes.c_int(index)), "cuDeviceGet")
    context = ctypes.c_void_p()
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    _check(cuda.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
    stream = ctypes.c_void_p()
    try:
        flags = ctypes.c_uint(CU_STREAM_NON_BLOCKING)
        _check(cuda.cuStreamCreate(ctypes.byref(stream), flags), "cuStreamCreate")
    finally:
        popped = ctypes.c_void_p()
        cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
    if not stream.value:
        msg = "cuStreamCreate returned a null stream"
        raise DriverError(msg)
    return int(stream.value)
