"""The targets of the ``jpeg`` workload, fixed in advance (issue 13), judged PASS or MISS.

Every figure is a median of per-repeat ratios of interleaved runs. A target
whose variants could not run here is a MISS that says "not measured" and
why; a target whose variants are not in this run's plan (quick mode) is
left out.
"""

from __future__ import annotations

from benchmarks.common import (
    Config,
    Measure,
    Target,
    median,
    median_ratio,
    paired_ratios,
    values_of,
)
from benchmarks.jpeg_variants import AUTOS, FULL, LABELS, NOISE, QUICK, SETTINGS, Variant

__all__ = ["targets"]


class _Judge:
    """Builds the targets from the samples; a target whose variants did not run is MISS."""

    def __init__(self, samples: dict[str, list[Measure]], reasons: dict[str, str]) -> None:
        self.samples = samples
        self.reasons = reasons
        self.targets: list[Target] = []

    def planned(self, *variants: Variant) -> bool:
        """Whether every one of ``variants`` is in this run's plan (ran, or could not run)."""
        return all(v.name in self.samples or self.reasons.get(v.name) for v in variants)

    def missing(self, *variants: Variant) -> str:
        """Why one of ``variants`` has no figures (``""`` when all have)."""
        for variant in variants:
            if self.reasons.get(variant.name):
                return f"not measured: {variant.label} {self.reasons[variant.name]}"
        return ""

    def ratio(
        self, name: str, variant: Variant, base: Variant, key: str, low: float, high: float
    ) -> None:
        """Add a target ``low <= median(variant[key] / base[key]) <= high``."""
        if not self.planned(variant, base):
            return  # not in this run's plan (quick mode)
        why = self.missing(variant, base)
        if why:
            self.targets.append(Target(name, False, why))
            return
        value = median_ratio(self.samples, variant.name, base.name, key)
        detail = f"{value:.2f}x"
        if key == "peak_pss_mib" and all("growth_mib" in run for run in self.samples[base.name]):
            growth = median_ratio(self.samples, variant.name, base.name, "growth_mib")
            detail += f" (growth over the process's start: {growth:.2f}x)"
        self.targets.append(Target(name, low <= value <= high, detail))

    def best_fixed(self, setting: str, levels: tuple[int | str, ...], level: str) -> None:
        """Add the target: auto (at ``level``) >= 0.9x the best fixed thread count, per repeat."""
        epoch = "" if level == "auto" else f" ({level.split(', ', 1)[1]})"
        name = f"jpeg {setting}: fetch_threads='auto'{epoch} >= 0.9x the best fixed thread count"
        auto = Variant(setting, "threads", level)
        fixed = [Variant(setting, "threads", level) for level in levels if isinstance(level, int)]
        if not fixed or not self.planned(auto, *fixed):
            return
        why = self.missing(auto, *fixed)
        if why:
            self.targets.append(Target(name, False, why))
            return
        best = [  # per repeat, the fastest fixed count of that repeat
            max(self.samples[v.name][repeat]["items_per_second"] for v in fixed)
            for repeat in range(len(self.samples[auto.name]))
        ]
        value = median(paired_ratios(values_of(self.samples, auto.name, "items_per_second"), best))
        self.targets.append(Target(name, value >= 0.9, f"{value:.2f}x"))

    def equal(self, setting: str, other: str, levels: tuple[int | str, ...]) -> None:
        """Add the target: ours >= 1.0x ``other`` at every shared concurrency (within noise)."""
        label = LABELS[other].format("N").replace(" xN", "")
        name = (
            f"jpeg {setting}: fetch_threads=N >= 1.0x {label} at N = {levels} (within {NOISE:.0%})"
        )
        pairs = [(Variant(setting, "threads", n), Variant(setting, other, n)) for n in levels]
        if not pairs or not self.planned(*(v for pair in pairs for v in pair)):
            return
        why = self.missing(*(v for pair in pairs for v in pair))
        if why:
            self.targets.append(Target(name, False, why))
            return
        values = [median_ratio(self.samples, a.name, b.name, "items_per_second") for a, b in pairs]
        detail = ", ".join(f"N={n}: {v:.2f}x" for n, v in zip(levels, values, strict=True))
        self.targets.append(Target(name, all(v >= 1 - NOISE for v in values), detail))


RATIOS = (  # (name, variant, baseline, figure, lowest, highest), as issue 13 fixed them
    (
        "jpeg local: fetch_threads=2 >= 0.9x DataLoader(num_workers=2) throughput",
        Variant("local", "threads", 2),
        Variant("local", "dataloader", 2),
        "items_per_second",
        0.9,
        float("inf"),
    ),
    (
        "jpeg local: fetch_threads=2 time to first batch <= 0.2x DataLoader(num_workers=2)",
        Variant("local", "threads", 2),
        Variant("local", "dataloader", 2),
        "first_batch_seconds",
        0.0,
        0.2,
    ),
    (
        "jpeg local: fetch_threads=2 summed PSS <= 0.5x DataLoader(num_workers=2)",
        Variant("local", "threads", 2),
        Variant("local", "dataloader", 2),
        "peak_pss_mib",
        0.0,
        0.5,
    ),
    (
        "jpeg latency: fetch_threads=16 >= 4x DataLoader(num_workers=2) throughput",
        Variant("latency", "threads", 16),
        Variant("latency", "dataloader", 2),
        "items_per_second",
        4.0,
        float("inf"),
    ),
    (
        "jpeg latency: fetch_threads=16 >= 0.9x DataLoader(num_workers=16) throughput",
        Variant("latency", "threads", 16),
        Variant("latency", "dataloader", 16),
        "items_per_second",
        0.9,
        float("inf"),
    ),
    (
        "jpeg latency: fetch_threads=16 summed PSS <= 0.3x DataLoader(num_workers=16)",
        Variant("latency", "threads", 16),
        Variant("latency", "dataloader", 16),
        "peak_pss_mib",
        0.0,
        0.3,
    ),
)
"""The targets that compare one variant with one baseline."""


def targets(
    config: Config, samples: dict[str, list[Measure]], reasons: dict[str, str]
) -> list[Target]:
    """Return the targets judged on ``samples`` (``reasons``: why a variant did not run)."""
    judge = _Judge(samples, reasons)
    for name, variant, base, key, low, high in RATIOS:
        judge.ratio(name, variant, base, key, low, high)
    levels = (QUICK if config.quick else FULL)["threads"]
    for setting in SETTINGS:
        for auto in AUTOS:
            judge.best_fixed(setting, levels, auto)
    shared = tuple(level for level in levels if isinstance(level, int))
    for setting in SETTINGS:
        for other in ("parallel_mapper", "spdl"):
            judge.equal(setting, other, shared)
    return judge.targets
