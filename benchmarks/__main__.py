"""Command line: ``python -m benchmarks [--workloads W,...] [--repeats N] [--quick] [--out D]``.

Run it from the repository root (``make bench`` does).

See :mod:`benchmarks` for the workloads.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import prefetch
from benchmarks import WORKLOADS
from benchmarks.common import Config, WorkloadResult
from benchmarks.report import text_table, write_all

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
"""Where the results go by default: the repository's ``docs/benchmarks/``, not the cwd's."""

BENCH_EXTRA = {
    "matplotlib": "matplotlib",
    "numpy": "numpy",
    "pillow": "PIL",
    "prefetch_generator": "prefetch_generator",
}
"""Distributions of the ``bench`` extra (setup.cfg) that every run needs, and the module of each."""
OPTIONAL_EXTRA = {"spdl_core": "spdl", "torchdata": "torchdata"}
"""Distributions of the ``bench`` extra that only some variants need: without one, the ``jpeg``
workload reports those variants as not available and the rest still run."""
INSTALL_HINT = 'pip install -e ".[bench]"'

INTRO = (
    "These figures come from ``python -m benchmarks`` (``make bench``). Each "
    "variant runs several times, interleaved with the others (A B C A B C ...) so "
    "that drift of a shared machine hits all of them alike; tables give medians, "
    "and ratios are medians of per-repeat ratios. Targets are fixed in advance and "
    "reported as PASS or MISS, never tuned to pass. Where prefetching cannot help "
    "it says so: a background thread only overlaps work that releases the GIL "
    "(I/O, sleeping, torch kernels, waiting on DataLoader worker processes); with "
    "pure-Python work on both sides (the negative control) or with the cores "
    "already saturated by worker processes, expect about 1.0x."
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark prefetch against prefetch_generator, DataLoaderX, apex and timm.",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated list from {', '.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="interleaved runs per variant (5; quick: 1)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, a smoke run well under a minute"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="output folder (default: docs/benchmarks/ of this repository, wherever you run it)",
    )
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or not names:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    args.workloads = [name for name in WORKLOADS if name in names]
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _loadavg() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def missing_extras() -> list[str]:
    """Return the distributions of the ``bench`` extra that every run needs but are missing."""
    return [
        name for name, module in BENCH_EXTRA.items() if importlib.util.find_spec(module) is None
    ]


def run_workload(name: str, config: Config) -> WorkloadResult:
    """Import and run one workload; an exception becomes an ``error`` record."""
    try:
        module: Any = importlib.import_module(f"benchmarks.{name}")
        result: WorkloadResult = module.run(config)
    except Exception as error:  # reported; the other workloads still run
        traceback.print_exc()
        return WorkloadResult(
            name=name, title=name, status="error", reason=f"{type(error).__name__}: {error}"
        )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected workloads, print their tables and write the reports.

    Returns:
        0 when every workload ran (or was skipped), 1 when one raised, 2 when
        the ``bench`` extra is not installed (nothing runs; the message says
        what to install).
    """
    args = parse_args(argv)
    missing = missing_extras()
    if missing:
        print(
            f"The benchmarks need the bench extra; missing: {', '.join(missing)}. "
            f"Install it from the repository root with: {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 2
    config = Config(repeats=args.repeats, quick=args.quick)
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "prefetch": prefetch.__version__,
        "prefetch_generator": _version("prefetch_generator"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
        "repeats": config.repeats,
        "quick": config.quick,
        "workloads": args.workloads,
        "loadavg_start": _loadavg(),
    }
    print(
        f"prefetch {prefetch.__version__} benchmarks: {', '.join(args.workloads)}; "
        f"{config.repeats} interleaved repeats{' (quick)' if config.quick else ''}; "
        f"load average {meta['loadavg_start']}",
        flush=True,
    )
    started = time.perf_counter()
    results: list[WorkloadResult] = []
    for name in args.workloads:
        result = run_workload(name, config)
        results.append(result)
        print(f"\n== {result.title} ==", flush=True)
        if result.status != "ok":
            print(f"{result.status}: {result.reason}", flush=True)
            continue
        print(text_table(result))
        for note in result.notes:
            print(note)
        for target in result.targets:
            print(f"{'PASS' if target.passed else 'MISS'}  {target.name}: {target.detail}")
        sys.stdout.flush()
    meta["loadavg_end"] = _loadavg()
    meta["seconds"] = round(time.perf_counter() - started, 1)
    written = write_all(results, meta, args.out, INTRO)
    targets = [t for r in results for t in r.targets]
    passed = sum(t.passed for t in targets)
    print(f"\n{passed}/{len(targets)} targets PASS; {meta['seconds']} s in all.")
    print("Wrote " + ", ".join(str(path) for path in written))
    return 1 if any(r.status == "error" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
