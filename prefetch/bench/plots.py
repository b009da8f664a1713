"""PNG plots of benchmark results (matplotlib with the Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from prefetch.bench.common import WorkloadResult

__all__ = ["plot_workload"]

LABELS = {"seconds": "epoch time (s)", "step_ms": "step time (ms)", "us_per_item": "µs per item"}


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


def plot_workload(result: WorkloadResult, path: Path) -> None:
    """Draw ``result`` in the style its ``plot`` field names and save it to ``path``."""
    tall = result.plot == "bar"
    figure, axes = plt.subplots(figsize=(8, 0.45 * len(result.rows) + 1.6 if tall else 4.5))
    {"line": _line, "bar": _bars, "grouped": _grouped}[result.plot](result, axes)
    axes.set_title(result.title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
