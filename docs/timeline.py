"""Draw docs/_static/timeline.png: a real producer/consumer timeline, plain vs prefetched.

The picture on the "Diagnosing a data-bound loop" page comes from this script.
It runs a small, real workload twice:

* a source whose every item sleeps ``--load-ms`` (standing in for reading and
  decoding a file: ``time.sleep`` releases the GIL, as real I/O does);
* a training step that sleeps ``--step-ms`` (standing in for a GPU step, during
  which the host thread mostly waits for the device);

once as a plain ``for batch in source`` loop and once with the source wrapped
in :class:`prefetch.BackgroundLoader`. It records when every fetch and every
step starts and ends, and how long each ``next()`` made the loop wait, then
draws both runs as Gantt charts on one time axis.

``make docs`` does not run it; the PNG is committed. To regenerate it::

    .venv/bin/python docs/timeline.py            # writes docs/_static/timeline.png
    .venv/bin/python docs/timeline.py --help     # workload knobs

Timings come from ``time.perf_counter`` on a real run, so each run draws a
slightly different picture.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from prefetch import BackgroundLoader

OUTPUT = Path(__file__).resolve().parent / "_static" / "timeline.png"

FETCH_COLOR = "#4c72b0"
STEP_COLOR = "#55a868"
WAIT_COLOR = "#c44e52"
EDGES = {"edgecolor": "white", "linewidth": 1.2}


@dataclass
class Trace:
    """Start/end times, in seconds from the start of the epoch."""

    fetches: list[tuple[float, float]] = field(default_factory=list)
    steps: list[tuple[float, float]] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)
    fetch_threads: set[str] = field(default_factory=set)
    total: float = 0.0


class SlowSource:
    """An iterable of ``items`` integers, each taking ``load_s`` to produce."""

    def __init__(self, items: int, load_s: float, trace: Trace, origin: list[float]) -> None:
        self.items = items
        self.load_s = load_s
        self.trace = trace
        self.origin = origin

    def __len__(self) -> int:
        return self.items

    def __iter__(self) -> Iterator[int]:
        for index in range(self.items):
            start = time.perf_counter()
            time.sleep(self.load_s)
            end = time.perf_counter()
            self.trace.fetches.append((start - self.origin[0], end - self.origin[0]))
            self.trace.fetch_threads.add(threading.current_thread().name)
            yield index


def run(items: int, load_s: float, step_s: float, depth: int | None) -> Trace:
    """Run one epoch (plain if ``depth`` is None) and return what happened when."""
    trace = Trace()
    origin = [0.0]
    source = SlowSource(items, load_s, trace, origin)
    loader: Iterable[int] = source if depth is None else BackgroundLoader(source, depth=depth)
    origin[0] = time.perf_counter()
    iterator = iter(loader)
    while True:
        asked = time.perf_counter()
        try:
            next(iterator)
        except StopIteration:
            break
        got = time.perf_counter()
        trace.waits.append((asked - origin[0], got - origin[0]))
        time.sleep(step_s)  # the training step
        trace.steps.append((got - origin[0], time.perf_counter() - origin[0]))
    trace.total = time.perf_counter() - origin[0]
    return trace


Interval = tuple[float, float]


def spans(intervals: list[Interval], min_width: float = 0.0) -> list[Interval]:
    """Convert (start, end) pairs to matplotlib's (start, width), dropping tiny ones."""
    return [(start, end - start) for start, end in intervals if end - start > min_width]


def draw(plain: Trace, wrapped: Trace, depth: int, output: Path) -> None:
    """Draw the two traces as stacked Gantt charts and save a small PNG."""
    end = max(plain.total, wrapped.total) * 1.03
    figure, axes = plt.subplots(2, 1, figsize=(9.0, 3.9), sharex=True, layout="constrained")
    panels = (
        (axes[0], plain, "plain loop: load, then step, then load again"),
        (axes[1], wrapped, f"BackgroundLoader(source, depth={depth}): loading overlaps the step"),
    )
    for axis, trace, title in panels:
        fetch_row = "producer thread" if trace.fetch_threads - {"MainThread"} else "main thread"
        axis.broken_barh(spans(trace.fetches), (1.15, 0.7), color=FETCH_COLOR, **EDGES)
        axis.broken_barh(spans(trace.steps), (0.15, 0.7), color=STEP_COLOR, **EDGES)
        axis.broken_barh(spans(trace.waits, 0.002), (0.15, 0.7), color=WAIT_COLOR, **EDGES)
        axis.set_yticks([0.5, 1.5], ["training loop", f"fetch ({fetch_row})"])
        axis.set_ylim(0, 2)
        axis.set_xlim(0, end)
        axis.set_title(f"{title} — epoch {trace.total * 1000:.0f} ms", fontsize=10, loc="left")
        axis.grid(axis="x", alpha=0.3)
        axis.tick_params(labelsize=9)
        axis.axvline(trace.total, color="black", linewidth=1)
    axes[1].set_xlabel("time since iter() (s)", fontsize=9)
    figure.legend(
        handles=[
            Patch(color=FETCH_COLOR, label="fetch an item (simulated I/O)"),
            Patch(color=STEP_COLOR, label="training step"),
            Patch(color=WAIT_COLOR, label="loop waits for data"),
        ],
        loc="outside lower center",
        ncols=3,
        fontsize=9,
        frameon=False,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=90)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10, help="items per epoch (default 10)")
    parser.add_argument("--load-ms", type=float, default=30.0, help="time to fetch one item")
    parser.add_argument("--step-ms", type=float, default=40.0, help="time of one training step")
    parser.add_argument("--depth", type=int, default=2, help="BackgroundLoader depth")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"default {OUTPUT}")
    args = parser.parse_args()
    load_s, step_s = args.load_ms / 1000, args.step_ms / 1000
    run(2, 0.001, 0.001, args.depth)  # warm up threads and imports
    plain = run(args.items, load_s, step_s, None)
    wrapped = run(args.items, load_s, step_s, args.depth)
    draw(plain, wrapped, args.depth, args.output)
    size = args.output.stat().st_size // 1024
    print(f"plain {plain.total * 1000:.0f} ms, wrapped {wrapped.total * 1000:.0f} ms")
    print(f"wrote {args.output} ({size} KB)")


if __name__ == "__main__":
    main()
