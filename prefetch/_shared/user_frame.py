"""Warnings that point at the user's line, through any stack of this package's frames."""

from __future__ import annotations

import os
import sys
from types import FrameType

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_stacklevel() -> int:
    """Return the ``stacklevel`` that makes the caller's ``warnings.warn`` name the user's line.

    Counted from the function that calls this one (``stacklevel=1`` would be
    that function): the first frame outside this package, however many
    wrappers sit in between.
    """
    frame: FrameType | None = sys._getframe(2)  # the caller of the function that asks
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
