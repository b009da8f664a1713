"""Workload ``gpu``: host-to-device copies hidden behind training steps.

Runs only when ``torch.cuda.is_available()``; otherwise it reports that it
was skipped and no figures. Variants, all over the same uint8 image batches
(pinned, as ``DataLoader(pin_memory=True)`` gives them, except the last one,
which pins in a :class:`~prefetch.BackgroundLoader` thread) and all
normalising on the GPU:

* a plain loop: ``.to(device, non_blocking=True)`` then normalise, on the
  training stream;
* the apex and timm one-ahead prefetchers (:mod:`benchmarks.baselines`);
  timm's is labelled *racy*: it has neither a fence nor ``record_stream``, so
  the allocator may reuse a batch's memory while the step still reads it
  (it is timed as people use it, not endorsed);
* :class:`~prefetch.CudaPrefetcher` with ``fence`` and ``record_stream``
  lifetimes, depth 1 and 2, and stacked on ``BackgroundLoader(pin_memory=True)``.

Step time comes from CUDA events on the training stream. The share of the
data work hidden is measured from the first hand-over (an event recorded on
the training stream when the first batch arrives): the first batch's copy
and the start-up cannot be hidden by any prefetcher and are not charged.
With ``N`` batches, ``hidden = 1 - (epoch after hand-over - compute only) /
((N - 1) / N x copy and normalise only)``; the references, timed with CUDA
events, are ``N`` steps on a resident normalised batch, and ``N`` copies
each followed by the normalisation every variant does on the GPU. Memory:
peak allocated and reserved after each of several consecutive epochs of one
prefetcher object. The expected run time is printed before the runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from benchmarks.baselines import ApexStylePrefetcher, TimmStylePrefetcher
from benchmarks.common import (
    Column,
    Config,
    Measure,
    Target,
    WorkloadResult,
    interleave,
    row_from,
    speedup_row,
)
from benchmarks.data import MEAN, STD
from prefetch import BackgroundLoader, CudaPrefetcher, Normalize
from prefetch._device.prefetcher import Lifetime
from prefetch._shared.progress import ProgressBar

__all__ = ["run"]

Batch = tuple[torch.Tensor, torch.Tensor]
PLAIN = "plain .to(device)"
COMPUTE = "reference: compute only (resident batch)"
COPIES = "reference: copy + normalise only"
TIMM = "timm-style PrefetchLoader (racy: no fence, no record_stream)"
HIDDEN_TARGET = 0.95
TITLE = "GPU: copies hidden behind the training step"


def gpu_model() -> nn.Module:
    """Return a three-convolution network sized so a step is about a copy's time."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def _same(value: Iterable[Batch]) -> Iterable[Batch]:
    return value


def _events_seconds(work: Callable[[], object]) -> float:
    """Return the time ``work`` takes on the current CUDA stream, by events."""
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    torch.cuda.synchronize()
    start.record()
    work()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3


def skipped(reason: str) -> WorkloadResult:
    """Return the record of a skipped GPU workload (no figures)."""
    return WorkloadResult(name="gpu", title=TITLE, status="skipped", reason=reason)


def run(config: Config) -> WorkloadResult:
    """Run the GPU comparison, or report it skipped without CUDA."""
    if not torch.cuda.is_available():
        return skipped(
            f"torch.cuda.is_available() is False (torch {torch.__version__}): "
            "no GPU on this machine, so no GPU figures are reported"
        )
    device = torch.device("cuda", torch.cuda.current_device())
    count, size = config.size(40, 8), config.size(128, 32)
    generator = torch.Generator().manual_seed(0)
    unpinned = [
        (
            torch.randint(0, 256, (size, 3, 224, 224), dtype=torch.uint8, generator=generator),
            torch.randint(0, 10, (size,), generator=generator),
        )
        for _ in range(count)
    ]
    pinned = [(x.pin_memory(), y.pin_memory()) for x, y in unpinned]
    model = gpu_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mean = torch.tensor([m * 255 for m in MEAN], device=device).view(1, 3, 1, 1)
    std = torch.tensor([s * 255 for s in STD], device=device).view(1, 3, 1, 1)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        optimizer.step()

    def plain() -> Iterable[Batch]:
        for x, y in pinned:
            x = x.to(device, non_blocking=True).float().sub_(mean).div_(std)
            yield x, y.to(device, non_blocking=True)

    def prefetcher(source: Any, depth: int, lifetime: Lifetime) -> CudaPrefetcher[Batch]:
        return CudaPrefetcher(
            source, device, depth=depth, transform=Normalize(MEAN, STD), lifetime=lifetime
        )

    timm = TimmStylePrefetcher(pinned, device, MEAN, STD)
    makers: dict[str, Callable[[], Iterable[Batch]]] = {
        PLAIN: plain,
        "apex-style data_prefetcher": lambda: ApexStylePrefetcher(pinned, device, MEAN, STD),
        TIMM: lambda: timm,
    }
    lifetimes: tuple[Lifetime, ...] = ("fence", "record_stream")
    for lifetime in lifetimes:
        for depth in (1, 2):
            made = prefetcher(pinned, depth, lifetime)
            makers[f"CudaPrefetcher {lifetime} depth={depth}"] = functools.partial(_same, made)
    stacked = prefetcher(BackgroundLoader(unpinned, pin_memory=True), 1, "fence")
    makers["CudaPrefetcher(BackgroundLoader(pin_memory=True))"] = lambda: stacked

    def train(make: Callable[[], Iterable[Batch]], marks: list[Any] | None = None) -> None:
        for images, labels in make():
            if marks is not None and not marks:  # the first hand-over
                marks.append(torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]  # torch leaves it untyped
                marks[0].record()
            step(images, labels)

    def epoch(make: Callable[[], Iterable[Batch]]) -> float:
        return _events_seconds(functools.partial(train, make))

    resident = (pinned[0][0].to(device).float().sub_(mean).div_(std), pinned[0][1].to(device))

    def compute_only() -> None:
        for _ in range(count):
            step(*resident)

    def copies_only() -> None:
        for x, y in pinned:
            x.to(device, non_blocking=True).float().sub_(mean).div_(std)
            y.to(device, non_blocking=True)

    def timed(work: Callable[[], None]) -> Callable[[], Measure]:
        def measure() -> Measure:
            seconds = _events_seconds(work)
            return {"seconds": seconds, "step_ms": seconds / count * 1e3}

        return measure

    def timed_train(make: Callable[[], Iterable[Batch]]) -> Callable[[], Measure]:
        def measure() -> Measure:
            marks: list[Any] = []
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it untyped

            def work() -> None:
                train(make, marks)
                end.record()

            seconds = _events_seconds(work)
            after = float(marks[0].elapsed_time(end)) / 1e3
            return {"seconds": seconds, "step_ms": seconds / count * 1e3, "after_first": after}

        return measure

    variants = {name: timed_train(make) for name, make in makers.items()}
    variants[COMPUTE] = timed(compute_only)
    variants[COPIES] = timed(copies_only)
    memory_epochs = config.size(4, 2)
    _print_expected(epoch(plain), len(variants), config, memory_epochs * len(makers))
    samples = interleave(variants, config.repeats, "gpu     ", warmup=config.warmup)
    compute = [run["seconds"] for run in samples[COMPUTE]]
    copies = [run["seconds"] * (count - 1) / count for run in samples[COPIES]]
    for name in makers:  # the share hidden after the first hand-over, this repeat's references
        for run, busy, moved in zip(samples[name], compute, copies, strict=True):
            run["hidden"] = min(max(1 - (run["after_first"] - busy) / moved, 0.0), 1.0)
    memory = _memory(makers, epoch, epochs=memory_epochs)
    result = WorkloadResult(
        name="gpu",
        title=TITLE,
        status="ok",
        description=(
            f"{count} batches of {size} uint8 3x224x224 images on "
            f"{torch.cuda.get_device_name(device)}; "
            "step times from CUDA events on the training stream. hidden = 1 - (epoch after "
            "the first hand-over - compute only) / ((N-1)/N x copy + normalise only), with the "
            "two reference rows of the same repeat: the first copy and the start-up are not "
            "charged. Memory: peak allocated and reserved over consecutive epochs of one "
            "object. Rows marked racy time an unsafe pattern as people use it."
        ),
        baseline=PLAIN,
        params={"batches": count, "batch_size": size, "repeats": config.repeats},
        columns=[
            Column("step_ms", "step ms", "{:.2f}"),
            Column("speedup", "speed-up", "{:.2f}x"),
            Column("hidden", "copy hidden", "{:.0%}"),
            Column("peak_mib", "peak MiB", "{:.0f}"),
            Column("reserved_mib", "reserved MiB", "{:.0f}"),
            Column("reserved_growth_mib", "reserved growth MiB", "{:.0f}"),
        ],
        plot="bar",
        plot_key="step_ms",
    )
    result.notes.append(
        f"{TIMM}: the allocator may hand a batch's memory to the next copy while the step "
        "still reads it; its figures are not those of a correct prefetcher."
    )
    for name in (COMPUTE, COPIES):
        result.rows.append(row_from(samples, name, ("step_ms", "seconds")))
    for name in makers:
        peaks, reserved = memory[name]
        row = speedup_row(
            samples,
            name,
            PLAIN,
            ("step_ms", "hidden"),
            peak_mib=max(peaks),
            reserved_mib=reserved[-1],
            reserved_growth_mib=reserved[-1] - reserved[0],
        )
        row.samples.update(peak_mib=peaks, reserved_mib=reserved)
        result.rows.append(row)
        if name.startswith("CudaPrefetcher"):
            share = float(row.values["hidden"])
            flat = reserved[-1] <= reserved[0] * 1.02 and peaks[-1] <= peaks[0] * 1.02
            result.targets.append(
                Target(f"gpu {name}: copy >= 95% hidden", share >= HIDDEN_TARGET, f"{share:.0%}")
            )
            result.targets.append(
                Target(
                    f"gpu {name}: memory flat over epochs",
                    flat,
                    f"reserved {reserved[0]:.0f} -> {reserved[-1]:.0f} MiB, "
                    f"peak {peaks[0]:.0f} -> {peaks[-1]:.0f} MiB",
                )
            )
    return result


def _print_expected(plain_seconds: float, variants: int, config: Config, extra: int) -> None:
    """Print about how long the runs will take, from one plain epoch (already warm)."""
    epochs = variants * (config.repeats + (1 if config.warmup else 0)) + extra
    print(
        f"gpu: {epochs} epochs of about {plain_seconds:.2f} s (a plain one): "
        f"expect about {epochs * plain_seconds + 5:.0f} s",
        flush=True,
    )


def _memory(
    makers: dict[str, Callable[[], Iterable[Batch]]],
    epoch: Callable[[Callable[[], Iterable[Batch]]], float],
    epochs: int,
) -> dict[str, tuple[list[float], list[float]]]:
    """Run each variant ``epochs`` times in a row; peak and reserved MiB per epoch."""
    mib = 1024.0**2
    found: dict[str, tuple[list[float], list[float]]] = {}
    with ProgressBar(len(makers) * epochs, "gpu mem ") as bar:
        for name, make in makers.items():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            peaks: list[float] = []
            reserved: list[float] = []
            for _ in range(epochs):
                torch.cuda.reset_peak_memory_stats()
                epoch(make)
                peaks.append(torch.cuda.max_memory_allocated() / mib)
                reserved.append(torch.cuda.memory_reserved() / mib)
                bar.update(note=name)
            found[name] = (peaks, reserved)
    return found
