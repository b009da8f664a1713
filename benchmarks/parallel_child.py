"""One variant of the ``jpeg`` or ``cow`` workload, in a process of its own.

``python -m benchmarks.parallel_child SPEC`` (SPEC a JSON object) builds one
loader, runs one epoch over it, and prints one line of JSON: what it
delivered and how long it took. :func:`benchmarks.memory.run_child` starts
it and samples its memory (and its worker processes') from outside, so each
variant's memory is its own.

SPEC keys: ``workload`` (``"jpeg"``, ``"cow"`` or ``"purepy"``), ``method``
(:data:`METHODS`), ``concurrency`` (an int, or ``"auto"`` for
``fetch_threads``), ``batch_size``; for ``jpeg``: ``folder``, ``count``,
``latency`` (seconds per read); for ``cow``: ``names`` (list length) and
``items`` (how many of them one epoch reads, in a seeded random order); for
``purepy``: ``records`` and ``words`` (:class:`benchmarks.records.Records`).
Optional: ``side`` (``jpeg``: the square the images are resized to, 224 by
default) and ``trace`` (true: a ``fetch_threads`` report adds
``thread_events``, each change of the thread count as a dict).
The report says whether the GIL was on at the end (``gil_enabled``, 1 or 0).

The epoch clock starts before the loader is built, so the start-up of
worker processes, threads and pipelines counts; time to first batch is
measured from the same point. Imports happen before it, for every method,
and then one full garbage collection: the imports leave each process owing
the collector a different amount, and the full collection that pays it (66
ms with torch imported, measured) would otherwise fall inside whichever
method's epoch first crosses the collector's threshold.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from benchmarks.jpeg_files import SIDE, JpegFolder, NameList
from benchmarks.memory import pss_kib
from benchmarks.records import Records

LEARNED = "auto, 2nd epoch"
"""``fetch_threads="auto"`` timed on its second epoch, after one untimed epoch has tuned it."""

__all__ = ["METHODS", "build", "main", "run_epoch"]

METHODS = ("dataloader", "threads", "parallel_mapper", "sample_mapper", "spdl")
"""``DataLoader(num_workers=N)``, ``BackgroundLoader(..., fetch_threads=N)``,
torchdata.nodes ``ParallelMapper(method="thread")`` over batches (each task
reads and collates a batch), the same over single samples followed by
``Batcher`` and a collating ``Mapper`` (the sample-level pipeline), an SPDL
pipeline."""
SEED = 0


class MapAndCollate:
    """Fetch one batch of indices from a dataset and collate it (as DataLoader's fetcher does)."""

    def __init__(self, dataset: Dataset[Any], collate: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate = collate

    def __call__(self, indices: list[int]) -> Any:
        return self.collate([self.dataset[index] for index in indices])


def _collate(batch: list[Any]) -> Any:
    return torch.utils.data.default_collate(batch)


def _sampler(dataset: Dataset[Any], spec: dict[str, Any]) -> Iterable[int]:
    if spec["workload"] == "cow":
        generator = torch.Generator().manual_seed(SEED)
        return RandomSampler(dataset, num_samples=int(spec["items"]), generator=generator)  # type: ignore[arg-type]  # a sized dataset
    return SequentialSampler(dataset)  # type: ignore[arg-type]  # a sized dataset


def _threads(loader: DataLoader[Any], concurrency: int | str) -> Iterable[Any]:
    from prefetch import BackgroundLoader

    factory: Any = BackgroundLoader  # untyped: concurrency comes from JSON (an int or "auto")
    threads = "auto" if concurrency == LEARNED else concurrency
    return factory(loader, fetch_threads=threads)  # type: ignore[no-any-return]


def build(spec: dict[str, Any], dataset: Dataset[Any]) -> tuple[Iterable[Any], Callable[[], None]]:
    """Return the loader ``spec`` describes over ``dataset``, and how to close it."""
    method, concurrency, size = spec["method"], spec["concurrency"], int(spec["batch_size"])
    sampler = _sampler(dataset, spec)
    if method in ("dataloader", "threads"):
        workers = int(concurrency) if method == "dataloader" else 0
        loader = DataLoader(
            dataset, batch_size=size, sampler=sampler, num_workers=workers, collate_fn=_collate
        )
        if method == "dataloader":
            return loader, lambda: None
        wrapped = _threads(loader, concurrency)
        return wrapped, getattr(wrapped, "close", lambda: None)
    batches = BatchSampler(sampler, batch_size=size, drop_last=False)
    fetch = MapAndCollate(dataset, _collate)
    if method == "parallel_mapper":
        import torchdata.nodes as tn

        node = tn.SamplerWrapper(batches)
        mapped = tn.ParallelMapper(
            node, map_fn=fetch, num_workers=int(concurrency), method="thread", in_order=True
        )
        return tn.Loader(mapped), lambda: None
    if method == "sample_mapper":
        return _sample_pipeline(dataset, sampler, int(concurrency), size), lambda: None
    if method == "spdl":
        from spdl.pipeline import PipelineBuilder

        source: Iterable[list[int]] = batches
        pipeline: Any = (
            PipelineBuilder[list[int], Any]()
            .add_source(source)
            .pipe(fetch, concurrency=int(concurrency), output_order="input")
            .add_sink(3)
            .build(num_threads=int(concurrency))
        )
        pipeline.start()
        return pipeline, pipeline.stop
    msg = f"parallel_child: method must be one of {METHODS}, got {method!r}"
    raise ValueError(msg)


def _sample_pipeline(
    dataset: Dataset[Any], sampler: Iterable[int], threads: int, size: int
) -> Iterable[Any]:
    """torchdata.nodes: ``ParallelMapper`` over single samples, ``Batcher``, collate (in order)."""
    import torchdata.nodes as tn

    samples = tn.ParallelMapper(
        tn.SamplerWrapper(sampler),
        map_fn=dataset.__getitem__,
        num_workers=threads,
        method="thread",
        in_order=True,
    )
    batches = tn.Batcher(samples, batch_size=size, drop_last=False)
    loader: Iterable[Any] = tn.Loader(tn.Mapper(batches, map_fn=_collate))
    return loader


MODULES = {
    "dataloader": "torch.utils.data",
    "threads": "prefetch",
    "parallel_mapper": "torchdata.nodes",
    "sample_mapper": "torchdata.nodes",
    "spdl": "spdl.pipeline",
}
"""The module each method imports, imported before the clock starts (SPDL's takes 0.15 s)."""


def run_epoch(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the dataset and loader of ``spec``, run one epoch, return the report."""
    dataset: Dataset[Any]
    if spec["workload"] == "jpeg":
        paths = sorted(Path(spec["folder"]).glob("*.jpg"))[: int(spec["count"])]
        side = int(spec.get("side", SIDE))
        dataset = JpegFolder(paths, latency=float(spec["latency"]), side=side)
    elif spec["workload"] == "purepy":
        dataset = Records(int(spec["records"]), words=int(spec["words"]))
    else:
        dataset = NameList(int(spec["names"]))
    if spec["method"] in MODULES:  # an unknown method: build() says what is expected
        importlib.import_module(MODULES[spec["method"]])
    warmed: tuple[Iterable[Any], Callable[[], None]] | None = None
    if spec["concurrency"] == LEARNED:  # one untimed epoch tunes the thread count first
        warmed = build(spec, dataset)
        for _ in warmed[0]:
            pass
    gc.collect()  # every method starts owing the collector nothing (see the module)
    start_kib = pss_kib(os.getpid())
    clock = time.perf_counter
    started = clock()
    loader, close = warmed if warmed is not None else build(spec, dataset)
    first = float("nan")
    items = batches = 0
    checksum = 0
    try:
        for batch in loader:
            if batches == 0:
                first = clock() - started
            batches += 1
            if spec["workload"] == "cow":  # a tensor of name lengths
                items += len(batch)
                continue
            for label in batch[1].tolist():  # labels in delivery order: the same in every variant
                items += 1
                checksum += items * int(label)
    finally:
        close()
    seconds = clock() - started
    report: dict[str, Any] = {
        "items": items,
        "batches": batches,
        "seconds": seconds,
        "first_batch_seconds": first,
        "items_per_second": items / seconds,
        "checksum": checksum,
        "start_pss_mib": start_kib / 1024 if start_kib is not None else float("nan"),
        "gil_enabled": int(getattr(sys, "_is_gil_enabled", lambda: True)()),
    }
    stats = getattr(loader, "stats", None)
    if spec["method"] == "threads" and stats is not None:
        report["fetch_threads"] = getattr(stats, "fetch_threads", None)
        report["peak_fetch_threads"] = getattr(stats, "peak_fetch_threads", None)
        if spec.get("trace"):
            events = getattr(stats, "thread_events", [])
            report["thread_events"] = [dataclasses.asdict(event) for event in events]
    return report


def main(argv: list[str]) -> int:
    """Run the variant whose JSON spec is ``argv[0]``; print its report as one JSON line."""
    spec = json.loads(argv[0])
    print(json.dumps(run_epoch(spec)), flush=True)
    gc.collect()  # loaders of the epoch are unreachable now: their __del__ stops their threads
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # Leave without interpreter teardown: torchdata's ParallelMapper can leave a thread
    # running into it, which aborted one run ("terminate called without an active
    # exception") after its report was complete. Every method leaves the same way.
    os._exit(code)
