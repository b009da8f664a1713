"""Write benchmark results: ``results.json``, ``results.rst`` and PNG plots.

``results.rst`` is included by the documentation (``.. include::``), so it
has no document title: each workload is a subsection underlined with ``-``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import Column, Row, WorkloadResult

__all__ = ["format_value", "text_table", "write_all"]


def format_value(column: Column, values: dict[str, float | str]) -> str:
    """Format one cell: missing or ``nan`` prints as ``n/a``; ``""`` (does not apply) as blank."""
    value = values.get(column.key)
    if value == "":
        return ""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return column.fmt.format(value)


def _spread(result: WorkloadResult, row: Row) -> str:
    """Return ``min-max`` of the row's samples of the workload's spread figure."""
    values = row.samples.get(result.spread_key, [])
    if len(values) < 2:
        return "n/a"
    digits = 2 if result.spread_key == "us_per_item" else 3
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def _cells(result: WorkloadResult, row: Row) -> list[str]:
    cells = [format_value(column, row.values) for column in result.columns]
    return [row.variant, *cells, _spread(result, row)]


def _headers(result: WorkloadResult) -> list[str]:
    spread = {"seconds": "range s", "us_per_item": "range µs/item"}.get(
        result.spread_key, "range " + result.spread_key
    )
    return ["variant"] + [column.header for column in result.columns] + [spread]


def text_table(result: WorkloadResult) -> str:
    """Return the workload's table as aligned plain text, for the terminal."""
    rows = [_headers(result)] + [_cells(result, row) for row in result.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        first = row[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _rst_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|")


def _rst_table(result: WorkloadResult) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for cells in [_headers(result)] + [_cells(result, row) for row in result.rows]:
        lines.append(f"   * - {_rst_escape(cells[0])}")
        lines.extend(f"     - {_rst_escape(cell)}".rstrip() for cell in cells[1:])
    return [*lines, ""]


def _image_path(out: Path, name: str) -> str:
    """Path for ``.. image::``: from the Sphinx source root when ``out`` is inside docs/."""
    resolved = out.resolve()
    for parent in [resolved, *resolved.parents]:
        if parent.name == "docs":
            return "/" + (resolved / name).relative_to(parent).as_posix()
    return name


def _section(result: WorkloadResult, out: Path) -> list[str]:
    title = _rst_escape(result.title)
    lines = [title, "-" * len(title), ""]
    if result.status != "ok":
        return [*lines, f"**Skipped:** {_rst_escape(result.reason)}", ""]
    description = result.description
    repeats = result.params.get("repeats")
    if isinstance(repeats, int):  # fewer than the run's (a fresh process per run)
        description += f" Interleaved repeats per variant here: {repeats}."
    lines += [_rst_escape(description), ""]
    lines += _rst_table(result)
    for note in result.notes:
        lines += [_rst_escape(note), ""]
    if result.targets:
        for target in result.targets:
            verdict = "PASS" if target.passed else "MISS"
            lines.append(
                f"- **{verdict}** {_rst_escape(target.name)}: {_rst_escape(target.detail)}"
            )
        lines.append("")
    if result.plot and (out / f"{result.name}.png").exists():
        lines += [
            f".. image:: {_image_path(out, result.name + '.png')}",
            f"   :alt: {title}",
            "",
        ]
    if result.trace_plot and (out / result.trace_plot).exists():
        lines += [
            f".. image:: {_image_path(out, result.trace_plot)}",
            f"   :alt: {title}: depth trace",
            "",
        ]
    return lines


def write_rst(
    results: Sequence[WorkloadResult], meta: dict[str, Any], out: Path, intro: str
) -> Path:
    """Write ``results.rst``: an introduction, then one subsection per workload."""
    lines = [
        ".. This file is written by ``python -m benchmarks``; do not edit it by hand.",
        "",
        intro,
        "",
        (
            f"Run on {meta['date']} with Python {meta['python']}, torch {meta['torch']}, "
            f"prefetch_generator {meta['prefetch_generator']}, {meta['cpu_count']} CPU cores "
            f"(load average {meta['loadavg_start']} at the start), up to {meta['repeats']} "
            f"interleaved repeat(s) per variant (a workload with fewer says so)"
            f"{' (quick mode: smoke-test sizes, figures not meaningful)' if meta['quick'] else ''}."
        ),
        "",
    ]
    for result in results:
        lines += _section(result, out)
    path = out / "results.rst"
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


def write_json(results: Sequence[WorkloadResult], meta: dict[str, Any], out: Path) -> Path:
    """Write ``results.json`` (``nan`` becomes ``null``)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [clean(item) for item in value]
        return value

    data = {"meta": meta, "workloads": {r.name: r.to_json() for r in results}}
    path = out / "results.json"
    path.write_text(json.dumps(clean(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def write_plots(results: Sequence[WorkloadResult], out: Path) -> list[Path]:
    """Write one PNG per workload that has figures, and its trace plot if any.

    Plots use matplotlib with the Agg backend; a workload's trace plot (such
    as ``depth_trace.png``) is named by its ``trace_plot``.

    Without matplotlib no plot is written (and the reST page shows none).
    """
    try:
        from benchmarks.plots import plot_depth_trace, plot_workload
    except ImportError:
        print("matplotlib is not installed: no plots written", file=sys.stderr)
        return []
    written = []
    for result in results:
        if result.status == "ok" and result.plot:
            path = out / f"{result.name}.png"
            plot_workload(result, path)
            result_plot = path.name
            result.plot = result_plot
            written.append(path)
        if result.status == "ok" and result.trace_plot and result.trace:
            path = out / result.trace_plot
            plot_depth_trace(result, path)
            written.append(path)
    return written


def write_all(
    results: Sequence[WorkloadResult], meta: dict[str, Any], out: Path, intro: str
) -> list[Path]:
    """Write plots, then the reST page and the JSON file; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = write_plots(results, out)
    written.append(write_rst(results, meta, out, intro))
    written.append(write_json(results, meta, out))
    return written
