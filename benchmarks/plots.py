"""PNG plots of benchmark results (matplotlib with the Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from benchmarks.common import WorkloadResult

__all__ = ["plot_depth_trace", "plot_scaling", "plot_thread_ramp", "plot_workload"]

LABELS = {
    "seconds": "epoch time (s)",
    "step_ms": "step time (ms)",
    "us_per_item": "µs per item",
    "vs_ideal": "ideal / epoch time (1 = ideal)",
}


def _number(value: float | str | None) -> float:
    return float(value) if isinstance(value, int | float) else float("nan")


def _line(result: WorkloadResult, axes: Any) -> None:
    """Per-item overhead against depth, one line per wrapper."""
    families: dict[str, list[tuple[float, float]]] = {}
    for row in result.rows:
        if " d=" not in row.variant:
            continue
        family = row.variant.rsplit(" d=", 1)[0]
        point = (_number(row.values.get("depth")), _number(row.values.get("us_per_item")))
        families.setdefault(family, []).append(point)
    for family, points in families.items():
        xs, ys = zip(*sorted(points), strict=True)
        axes.plot(xs, ys, marker="o", label=family)
    for row in result.rows:
        if "auto" in row.variant:  # one point: the depth it ended at
            depth, cost = _number(row.values.get("depth")), _number(row.values.get("us_per_item"))
            axes.plot([depth], [cost], "k*", markersize=10, label=f"{row.variant} (final depth)")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("depth / max_prefetch")
    axes.set_ylabel(LABELS["us_per_item"] + " over plain iteration")
    axes.legend(fontsize=8)


def _bars(result: WorkloadResult, axes: Any) -> None:
    """One horizontal bar per variant (median), with every repeat as a dot."""
    key = result.plot_key
    rows = [row for row in result.rows if key in row.values]
    names = [row.variant for row in rows]
    medians = [_number(row.values[key]) for row in rows]
    positions = list(range(len(rows)))
    axes.barh(positions, medians, color="#7aa6d6")
    samples_key = "seconds" if key == "step_ms" else key
    for position, row in zip(positions, rows, strict=True):
        dots = row.samples.get(samples_key, [])
        if key == "step_ms":
            count = float(result.params.get("batches", 1))
            dots = [value / count * 1e3 for value in dots]
        axes.plot(dots, [position] * len(dots), "k.", markersize=4)
    axes.set_yticks(positions, names, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel(LABELS.get(key, key) + " (bar: median, dots: repeats)")


def _grouped(result: WorkloadResult, axes: Any) -> None:
    """Epoch time per DataLoader setting, one bar per wrapper."""
    loaders = list(dict.fromkeys(str(row.values["loader"]) for row in result.rows))
    wrappers = list(dict.fromkeys(str(row.values["wrapper"]) for row in result.rows))
    width = 0.8 / len(wrappers)
    for index, wrapper in enumerate(wrappers):
        heights, labels = [], []
        for loader in loaders:
            row = next(
                r
                for r in result.rows
                if r.values["loader"] == loader and r.values["wrapper"] == wrapper
            )
            heights.append(_number(row.values["seconds"]))
            labels.append(f"{_number(row.values.get('speedup')):.2f}x")
        positions = [i + (index - (len(wrappers) - 1) / 2) * width for i in range(len(loaders))]
        bars = axes.bar(positions, heights, width=width, label=wrapper)
        axes.bar_label(bars, labels=labels, fontsize=7)
    axes.set_xticks(range(len(loaders)), loaders, fontsize=8)
    axes.set_ylabel(LABELS["seconds"] + ", median")
    axes.legend(fontsize=8)


SCALING_STYLES = {
    "dataloader": ("s", "#d62728", "DataLoader num_workers (0 plotted at 1)"),
    "threads": ("o", "#1f77b4", "BackgroundLoader fetch_threads"),
    "parallel_mapper": ("^", "#2ca02c", "torchdata ParallelMapper(thread)"),
    "spdl": ("D", "#9467bd", "SPDL pipeline"),
}


def plot_scaling(result: WorkloadResult, path: Path) -> None:
    """Draw throughput against concurrency, one line per method, one panel per setting.

    Rows give ``setting``, ``method``, ``concurrency`` and ``items_per_second``;
    ``fetch_threads="auto"`` is a star at the most threads it ran (its note
    ``peak threads N``); variants that did not run are left out.
    """
    settings = list(dict.fromkeys(str(row.values["setting"]) for row in result.rows))
    figure, grid = plt.subplots(1, len(settings), figsize=(5.2 * len(settings), 4.4), squeeze=False)
    for axes, setting in zip(grid[0], settings, strict=True):
        lines: dict[str, list[tuple[float, float]]] = {}
        for row in result.rows:
            speed = _number(row.values.get("items_per_second"))
            if row.values["setting"] != setting or speed != speed:  # nan: did not run
                continue
            method, level = str(row.values["method"]), str(row.values["concurrency"])
            if not level.isdigit():  # fetch_threads="auto": first epoch, or second
                note = str(row.values.get("note", ""))
                peak = float(note.rsplit(" ", 1)[-1]) if note.startswith("peak threads") else 1.0
                first = level == "auto"
                axes.plot(
                    [max(peak, 1.0)],
                    [speed],
                    "*" if first else "P",
                    color="k" if first else "tab:red",
                    markersize=13,
                    label=f"fetch_threads='auto', {'1st' if first else '2nd'} epoch (at its peak)",
                    zorder=3,
                )
                continue
            lines.setdefault(method, []).append((max(float(level), 1.0), speed))
        for method, points in lines.items():
            marker, colour, label = SCALING_STYLES.get(method, ("x", "0.5", method))
            xs, ys = zip(*sorted(points), strict=True)
            axes.plot(xs, ys, marker=marker, color=colour, label=label)
        axes.set_xscale("log", base=2)
        axes.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        axes.set_xlabel("concurrency (threads or worker processes)")
        axes.set_ylabel("images/s (median)")
        axes.set_ylim(bottom=0)
        axes.set_title(f"{setting}", fontsize=10)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.suptitle(result.title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_workload(result: WorkloadResult, path: Path) -> None:
    """Draw ``result`` in the style its ``plot`` field names and save it to ``path``."""
    if result.plot == "scaling":
        plot_scaling(result, path)
        return
    if result.plot == "ramp":
        plot_thread_ramp(result, path)
        return
    tall = result.plot == "bar"
    figure, axes = plt.subplots(figsize=(8, 0.45 * len(result.rows) + 1.6 if tall else 4.5))
    {"line": _line, "bar": _bars, "grouped": _grouped}[result.plot](result, axes)
    axes.set_title(result.title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_depth_trace(result: WorkloadResult, path: Path) -> None:
    """Draw ``result.trace``: an adaptive depth item by item, and the loop's waits.

    The depth is a step line, fixed reference depths are dashed lines, holds
    (waits the policy chose not to absorb) are crosses on the depth line, the
    source's slow items are grey ticks along the bottom; on a second axis each
    wait of the loop of at least 0.1 step is a red stem, in steps.
    """
    trace = result.trace
    items, step_ms = int(trace["items"]), float(trace["step_ms"])
    references = [float(depth) for depth in trace.get("reference_depths", [])]
    xs, ys = [0.0], [float(trace["start_depth"])]
    holds: list[tuple[float, float]] = []
    for event in trace["events"]:
        if event["new"] == event["old"]:
            holds.append((float(event["item"]), float(event["old"])))
        else:
            xs.append(float(event["item"]))
            ys.append(float(event["new"]))
    xs.append(float(items))
    ys.append(ys[-1])
    figure, axes = plt.subplots(figsize=(9, 5))
    waits_axes = axes.twinx()
    waited = [
        (float(index + 1), wait / step_ms)
        for index, wait in enumerate(trace["waits_ms"])
        if wait >= 0.1 * step_ms
    ]
    if waited:
        wx, wy = zip(*waited, strict=True)
        waits_axes.vlines(wx, 0, wy, color="#d62728", alpha=0.4, linewidth=1)
        waits_axes.plot(wx, wy, "v", color="#d62728", markersize=5, label="the loop waited")
    waits_axes.set_ylim(0, max([1.0, *(wait for _, wait in waited)]) * 1.25)
    waits_axes.set_ylabel("wait of the loop (steps)", color="#d62728")
    top = max([*ys, *references]) * 1.25 + 1
    slow = trace.get("slow_items", [])
    if slow:
        steps = trace.get("slow_steps")
        label = f"slow item ({float(steps):g}-step read)" if steps else "slow item"
        axes.vlines(slow, 0, top * 0.03, color="0.5", linewidth=1.5, label=label)
    colours = ["#2ca02c", "#9467bd", "#8c564b"]
    for colour, reference in zip(colours, references, strict=False):
        axes.axhline(
            reference, color=colour, linestyle="--", linewidth=1, label=f"depth={reference:g}"
        )
    axes.step(xs, ys, where="post", color="#1f77b4", linewidth=2, label='depth="auto"')
    if holds:
        hx, hy = zip(*holds, strict=True)
        axes.plot(hx, hy, "kx", markersize=7, label="hold (a wait not absorbed)")
    axes.set_xlim(0, items)
    axes.set_ylim(0, top)
    axes.set_xlabel("item handed to the loop")
    axes.set_ylabel("depth (items)")
    axes.set_zorder(waits_axes.get_zorder() + 1)  # the depth line over the stems
    axes.patch.set_visible(False)
    handles, labels = axes.get_legend_handles_labels()
    more, more_labels = waits_axes.get_legend_handles_labels()
    figure.legend(
        handles + more, labels + more_labels, fontsize=8, loc="lower center", ncol=6, frameon=False
    )
    axes.set_title(
        f'{result.title}\ndepth="auto", first epoch of a fresh loader: epoch '
        f"{trace['seconds']:.3f} s, {trace['vs_ideal']:.2f} of ideal (step {step_ms:g} ms)",
        fontsize=10,
    )
    axes.grid(alpha=0.3)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_thread_ramp(result: WorkloadResult, path: Path) -> None:
    """Draw ``fetch_threads="auto"``'s thread count against time, one step line per run.

    ``result.trace["runs"]`` holds each run's ``events`` (``thread_events`` as
    dicts), ``seconds`` (the epoch), ``first_batch_seconds`` and
    ``peak_fetch_threads``; a circle marks the first batch, a cross a hold. An
    event recorded before the epoch's start is drawn at 0 s, and the legend
    says so (the report's notes keep its time as recorded).
    """
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for run in result.trace["runs"]:
        events = run["events"]
        start = float(events[0]["old"]) if events else _number(run["peak_fetch_threads"])
        xs, ys = [0.0], [start]
        for event in events:
            if event["new"] != event["old"]:
                xs.append(max(float(event["seconds"]), 0.0))
                ys.append(float(event["new"]))
        xs.append(float(run["seconds"]))
        ys.append(ys[-1])
        label = f"{run['images']} images: epoch {float(run['seconds']):.2f} s"
        if any(float(event["seconds"]) < 0 for event in events):
            label += " (an event before 0 s drawn at 0)"
        (line,) = axes.step(xs, ys, where="post", linewidth=2, label=label)
        first = float(run["first_batch_seconds"])
        level = next(
            (y for x, y in zip(reversed(xs), reversed(ys), strict=True) if x <= first), start
        )
        axes.plot([first], [level], "o", color=line.get_color(), markersize=7)
        holds = [
            (max(float(e["seconds"]), 0.0), float(e["old"])) for e in events if e["new"] == e["old"]
        ]
        if holds:
            hx, hy = zip(*holds, strict=True)
            axes.plot(hx, hy, "x", color=line.get_color(), markersize=7)
    axes.set_xlabel("seconds from building the loader (circle: first batch; cross: a hold)")
    axes.set_ylabel("fetch threads")
    axes.set_ylim(bottom=0)
    axes.set_title(result.title + ": the median run's thread_events", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
