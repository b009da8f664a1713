"""Print the kill rate of the last ``mutmut run``, in all and per module; check a floor.

Usage (from the repository root, after ``mutmut run``)::

    python tools/mutation_report.py [--min PERCENT]

A mutant counts as killed when a test failed or timed out with it; as
survived when every test passed or no test reached it (an untested line is
as unguarded as a passing one). Mutants not yet checked (an interrupted run)
are reported and left out of the rate, as are those that ended with exit
code 255: mutmut 3.8.1 calls that a timeout, but it is also what it records
for the mutants a Ctrl-C (SIGINT to its processes) stops. Exits 1 if the
rate is below ``--min``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

KILLED = {1, 3, 36, 24, -24, 152}  # test failure, pytest error, timeouts (mutmut's codes)
NOT_CHECKED = {None, 2}  # not run yet, or interrupted
SKIPPED = {34}
DOUBTFUL = {255}  # a "timeout" to mutmut 3.8.1, and what the mutants a Ctrl-C stops get


def module_counts(meta: Path) -> Counter[str]:
    """Count the mutants of one ``.meta`` file as killed / survived / unchecked / skipped."""
    counts: Counter[str] = Counter()
    for code in json.loads(meta.read_text())["exit_code_by_key"].values():
        if code in NOT_CHECKED:
            counts["unchecked"] += 1
        elif code in SKIPPED:
            counts["skipped"] += 1
        elif code in DOUBTFUL:
            counts["doubtful"] += 1
        elif code in KILLED:
            counts["killed"] += 1
        else:
            counts["survived"] += 1  # passed (0), no tests (5, 33), suspicious, segfault
    return counts


def rate(counts: Counter[str]) -> float:
    """Killed over checked mutants, in percent."""
    checked = counts["killed"] + counts["survived"]
    return 100.0 * counts["killed"] / checked if checked else 0.0


def shown_rate(counts: Counter[str]) -> str:
    """The rate as the table shows it: ``-`` where no mutant was checked (a partial run)."""
    return f"{rate(counts):5.1f}%" if counts["killed"] + counts["survived"] else "     -"


def main() -> int:
    """Print the table; return 1 below the floor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min", type=float, default=0.0, help="fail below this kill rate (%%)")
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    args = parser.parse_args()
    package = args.mutants / "prefetch"
    metas = sorted(package.rglob("*.py.meta"))  # prefetch/_threads/engine.py.meta, ...
    if not metas:
        print(f"no mutation results under {args.mutants}/: run `make mutation` first")
        return 1
    total: Counter[str] = Counter()
    print(f"{'module':32} {'mutants':>7} {'killed':>6} {'survived':>8} {'rate':>6}")
    for meta in metas:
        counts = module_counts(meta)
        if not counts:
            continue  # a module with nothing to mutate (an __init__.py)
        total += counts
        name = meta.relative_to(package).as_posix().removesuffix(".meta")
        print(
            f"{name:32} {sum(counts.values()):7} {counts['killed']:6} "
            f"{counts['survived']:8} {shown_rate(counts)}"
        )
    print(
        f"{'all':32} {sum(total.values()):7} {total['killed']:6} "
        f"{total['survived']:8} {shown_rate(total)}"
    )
    if total["unchecked"]:
        print(f"{total['unchecked']} mutants not checked yet (interrupted run): not in the rate")
    if total["doubtful"]:
        print(
            f"{total['doubtful']} mutants ended with exit code 255 (a timeout to mutmut, or "
            "stopped by a Ctrl-C): not in the rate; check them again by name"
        )
    if rate(total) < args.min:
        print(f"kill rate {rate(total):.1f}% is below the floor of {args.min}%")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
