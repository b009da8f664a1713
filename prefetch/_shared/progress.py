r"""A tiny progress bar for the demo (and the benchmarks); no ``tqdm`` needed.

On a terminal it writes one line to its stream (``stderr`` by default) and
redraws it in place with ``\r``, at most ten times a second, so it never
slows down what it measures. Anywhere else (a pipe, a log file, a
``StringIO``) it writes plain lines, without carriage returns: one every
few seconds while it runs, and the final state when it closes.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_SECONDS = 0.1
"""Shortest interval between two redraws on a terminal."""
PLAIN_LINE_SECONDS = 5.0
"""Shortest interval between two plain lines when the stream is not a terminal."""
WIDTH = 119
"""Characters a terminal line is cut or padded to."""


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


class ProgressBar:
    r"""Draw ``label [#####.....] 12/40 3.1s note`` on ``stderr``.

    Args:
        total: Number of steps in all.
        label: Text in front of the bar.
        width: Characters inside the brackets.
        stream: Where to draw (``sys.stderr`` by default).

    Example:
        >>> import io
        >>> out = io.StringIO()  # not a terminal: plain lines, no carriage returns
        >>> with ProgressBar(4, "demo", width=4, stream=out) as bar:
        ...     for _ in range(4):
        ...         bar.update()
        >>> out.getvalue().startswith("demo [####] 4/4")
        True
        >>> "\r" in out.getvalue()
        False
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
        self._terminal = _is_terminal(self.stream)
        self._started = time.perf_counter()
        self._drawn = self._started
        self._closed = False
        if self._terminal:
            self._draw(force=True)

    def update(self, steps: int = 1, note: str | None = None) -> None:
        """Advance by ``steps``; ``note`` replaces the text after the counter."""
        self.done = min(self.done + steps, self.total)
        if note is not None:
            self.note = note
        self._draw(force=self._terminal and self.done == self.total)

    def set_note(self, note: str) -> None:
        """Show ``note`` after the counter without advancing."""
        self.note = note
        self._draw(force=self._terminal)

    def _text(self, now: float) -> str:
        filled = round(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = now - self._started
        return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s {self.note}"

    def _draw(self, *, force: bool) -> None:
        now = time.perf_counter()
        interval = REDRAW_SECONDS if self._terminal else PLAIN_LINE_SECONDS
        if not force and now - self._drawn < interval:
            return
        self._drawn = now
        if self._terminal:
            self.stream.write("\r" + self._text(now)[:WIDTH].ljust(WIDTH))
        else:
            self.stream.write(self._text(now).rstrip() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (once; closing again does nothing)."""
        if self._closed:
            return
        self._closed = True
        self._draw(force=True)
        if self._terminal:
            self.stream.write("\n")
        self.stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
