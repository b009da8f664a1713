"""Command line: ``python -m benchmarks [--workloads W,...] [--quick] [--out D] [--check]``.

Run it from the repository root. ``make bench`` runs every workload with
``--check`` into ``runs/bench/`` (ignored by git, so a run never changes a
tracked file); ``make bench-docs`` rewrites the committed page's results in
``docs/benchmarks/``.

Exit status:

* 0: every selected workload ran (or was skipped, as ``gpu`` is without
  CUDA); with ``--check``, also every target PASS;
* 1: a workload raised (its error is in the report; the others still ran);
* 2: nothing ran: bad arguments, or a distribution of the ``bench`` extra
  that a selected workload needs is missing (the message says which);
* 3: only with ``--check``: every workload ran, but some target is MISS.

Each workload needs only the extras it uses (:data:`WORKLOAD_EXTRAS`): the
``gpu`` workload runs without ``prefetch_generator``, for example.

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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "runs" / "bench"
"""Where the results go by default: the repository's ``runs/bench/`` (ignored by git), not the
cwd's: a run never rewrites the committed page (``make bench-docs`` passes ``--out``)."""
DOCS_RESULTS = ROOT / "docs" / "benchmarks"
"""The results the documentation includes (``make bench-docs`` writes them)."""

EXIT_OK, EXIT_ERROR, EXIT_NOT_RUN, EXIT_MISS = 0, 1, 2, 3
"""Exit statuses: all ran; a workload raised; nothing ran; with ``--check``, a target MISS."""

BENCH_EXTRA = {
    "matplotlib": "matplotlib",
    "numpy": "numpy",
    "pillow": "PIL",
    "prefetch_generator": "prefetch_generator",
}
"""Distributions of the ``bench`` extra (setup.cfg) that some workload needs, and their modules."""
PLOTS = ("matplotlib",)
"""What drawing a workload's plot needs (every workload draws one)."""
WORKLOAD_EXTRAS: dict[str, tuple[str, ...]] = {
    "handoff": ("prefetch_generator", *PLOTS),
    "jittery": ("prefetch_generator", *PLOTS),
    "bursty": ("prefetch_generator", *PLOTS),  # it imports jittery's variants
    "pipeline": ("prefetch_generator", *PLOTS),  # DataLoaderX iterates through it
    "gpu": PLOTS,  # torch only, and matplotlib for its plot
    "control": ("prefetch_generator", *PLOTS),
    "jpeg": ("numpy", "pillow", *PLOTS),  # writes and decodes the JPEG files
    "readbound": ("numpy", "pillow", *PLOTS),  # the jpeg workload's files, other sizes
    "autostart": ("numpy", "pillow", *PLOTS),
    "cow": ("numpy", "pillow", *PLOTS),  # its child processes import the jpeg dataset
    "purepy": ("numpy", "pillow", *PLOTS),  # it imports the jpeg workload's variants
    "advice": PLOTS,  # torch only (accelerate, if installed, for its prepared-loader row)
}
"""The distributions of :data:`BENCH_EXTRA` each workload needs; a run checks only those of the
workloads it runs (``--workloads gpu`` runs where ``prefetch_generator`` is not installed)."""
OPTIONAL_EXTRA = {"spdl_core": "spdl", "torchdata": "torchdata"}
"""Distributions of the ``bench`` extra that only some variants need: without one, the ``jpeg``
workload reports those variants as not available and the rest still run."""
INSTALL_HINT = 'pip install -e ".[bench]"'

INTRO = (
    "These figures come from ``python -m benchmarks`` (``make bench-docs``). Each "
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
        help="output folder (default: runs/bench/ of this repository, wherever you run it; "
        "make bench-docs writes docs/benchmarks/)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit {EXIT_MISS} when any target is MISS (without it a MISS is reported, exit 0)",
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


def missing_extras(workloads: Sequence[str] = WORKLOADS) -> dict[str, list[str]]:
    """Return the missing distributions ``workloads`` need, each with the workloads needing it."""
    missing: dict[str, list[str]] = {}
    for name in workloads:
        for distribution in WORKLOAD_EXTRAS[name]:
            if importlib.util.find_spec(BENCH_EXTRA[distribution]) is None:
                missing.setdefault(distribution, []).append(name)
    return missing


def exit_status(results: Sequence[WorkloadResult], *, check: bool) -> int:
    """Return the exit status of a run: an error first, then (with ``check``) a MISS."""
    if any(result.status == "error" for result in results):
        return EXIT_ERROR
    if check and any(not t.passed for result in results for t in result.targets):
        return EXIT_MISS
    return EXIT_OK


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
        The exit status (see the module docstring): :data:`EXIT_OK`,
        :data:`EXIT_ERROR` when a workload raised, :data:`EXIT_NOT_RUN` when
        an extra a selected workload needs is missing (nothing runs; the
        message says what to install), and with ``--check``
        :data:`EXIT_MISS` when a target is MISS.
    """
    args = parse_args(argv)
    missing = missing_extras(args.workloads)
    if missing:
        needs = "; ".join(f"{dist} (for {', '.join(names)})" for dist, names in missing.items())
        print(
            f"The benchmarks need the bench extra; missing: {needs}. "
            f"Install it from the repository root with: {INSTALL_HINT}, "
            "or choose other workloads with --workloads.",
            file=sys.stderr,
        )
        return EXIT_NOT_RUN
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
    status = exit_status(results, check=args.check)
    if status == EXIT_ERROR:
        print(f"exit {status}: a workload raised (see its error above)")
    elif status == EXIT_MISS:
        print(f"exit {status} (--check): {len(targets) - passed} target(s) MISS")
    return status


if __name__ == "__main__":
    sys.exit(main())
