r"""A tiny progress bar for the demo and the benchmarks (no ``tqdm`` needed).

It writes one line to ``stderr`` and redraws it in place with ``\r``, at
most ten times a second, so it never slows down what it measures.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]

REDRAW_SECONDS = 0.1
"""Shortest interval between two redraws."""


class ProgressBar:
    """Draw ``label [#####.....] 12/40 3.1s`` on one line of ``stderr``.

    Args:
        total: Number of steps in all.
        label: Text in front of the bar.
        width: Characters inside the brackets.
        stream: Where to draw (``sys.stderr`` by default).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with ProgressBar(4, "demo", stream=out) as bar:
        ...     for _ in range(4):
        ...         bar.update()
        >>> "4/4" in out.getvalue()
        True
    """

    def __init__(
        self, total: int, label: str = "", width: int = 28, stream: TextIO | None = None
    ) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.width = width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.note = ""
        self._started = time.perf_counter()
        self._drawn = 0.0
        self._draw(force=True)

    def update(self, steps: int = 1, note: str | None = None) -> None:
        """Advance by ``steps``; ``note`` replaces the text after the counter."""
        self.done = min(self.done + steps, self.total)
        if note is not None:
            self.note = note
        self._draw(force=self.done == self.total)

    def set_note(self, note: str) -> None:
        """Show ``note`` after the counter without advancing."""
        self.note = note
        self._draw(force=True)

    def _draw(self, *, force: bool) -> None:
        now = time.perf_counter()
        if not force and now - self._drawn < REDRAW_SECONDS:
            return
        self._drawn = now
        filled = round(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = now - self._started
        text = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s {self.note}"
        self.stream.write("\r" + text[:119].ljust(119))
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line."""
        self._draw(force=True)
        self.stream.write("\n")
        self.stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
