"""Whether a torch profiler records now, read without a call into C.

Entering ``record_function`` costs several microseconds even when nothing
records (8.6 us on torch 2.13, a 2-core machine), more than handing an item
between threads, so :mod:`prefetch._shared.profiling` marks its spans only
while a profiler records. torch has no public check; its private module flag
``torch.autograd.profiler._is_profiler_enabled`` is the one it keeps up to
date itself. Off (:mod:`prefetch._torch`), nothing is marked: traces lack
the ``prefetch.fetch`` and ``prefetch.wait`` ranges.
"""

from __future__ import annotations

from torch.autograd import profiler

from prefetch._torch.workaround import Workaround, bool_at

_MODULE = "torch.autograd.profiler"
_FLAG = "_is_profiler_enabled"
PROFILER_FLAG = Workaround(
    "profiler flag",
    "torch has no public, cheap way to ask whether a profiler records",
    ("2.6.0", "2.12.0", "2.13.0", "2.15.0"),
    "profiler traces show no prefetch.fetch and prefetch.wait ranges",
    [bool_at(_MODULE, _FLAG)],
)


def recording() -> bool:
    """Return whether a torch profiler records now (false while the workaround is off).

    Example:
        >>> recording()
        False
    """
    return PROFILER_FLAG.active() and getattr(profiler, _FLAG) is True
