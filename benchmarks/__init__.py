"""Benchmarks of :mod:`prefetch` against the patterns people use today.

Run ``python -m benchmarks`` from the repository root (``make bench``);
``--help`` lists the options. They live outside the :mod:`prefetch` package
(not in its wheel) and need the ``bench`` extra (``pip install -e ".[bench]"``);
each workload needs only the parts of it that it uses.
Workloads:

* ``handoff`` - cost of handing one tiny item between threads, by depth;
* ``jittery`` - storage-like latency with a heavy tail, against the ideal;
* ``bursty`` - a source that stalls 8 steps every 10th batch: ``depth="auto"``
  against fixed depths and the ideal, with its depth trace; also its bounds
  (a throughput-bound source, ``max_bytes``);
* ``pipeline`` - a DataLoader (0 or 2 workers) feeding a small CNN on the CPU;
* ``gpu`` - host-to-device copies hidden behind training steps (CUDA only);
* ``control`` - a negative control: GIL-bound work, where threads cannot help;
* ``jpeg`` - parallel loading of real JPEG files (local, and with 20 ms storage
  latency): DataLoader worker processes against ``fetch_threads``,
  torchdata's ``ParallelMapper`` and SPDL, with summed PSS per variant;
* ``readbound`` - 20 ms reads at 16 threads (issue 34): ``fetch_threads=16``
  against ``ParallelMapper(thread)`` over batches (224x224, batch 8) and
  against the sample-level pipeline (``ParallelMapper`` over samples, then
  ``Batcher``; 128x128, batch 64), beside the physical limit;
* ``autostart`` - ``fetch_threads="auto"`` in a new loader's first epoch
  against fixed counts 4 to 32 (512 and 2048 images of 20 ms reads), its
  first batch and its ramp (``thread_events``);
* ``cow`` - copy-on-write growth of worker processes over a dataset holding
  a million file names, next to threads;
* ``purepy`` - pure-Python loading (parsing text records, ~2 ms per sample):
  ``fetch_threads`` against worker processes, on this interpreter and on a
  free-threaded CPython (``.venv-ft`` or ``PYTHON_FT``) when there is one;
* ``advice`` - one row per scenario of the diagnosing page: the setting
  ``summary()`` names against the other candidates, side by side.

Every configuration runs several times, interleaved, and the reports give
medians and medians of per-repeat ratios. Results go to ``runs/bench/`` (ignored
by git; ``--out`` picks another folder, and ``make bench-docs`` writes the
committed ``docs/benchmarks/``) as ``results.json``, ``results.rst`` and PNG
plots (``depth_trace.png``: the trace of ``depth="auto"`` on the bursty
workload; ``jpeg.png``: throughput against concurrency per method, both
settings). With ``--check`` the exit status says whether every target holds
(see :mod:`benchmarks.__main__`).
"""

from __future__ import annotations

__all__ = ["WORKLOADS"]

WORKLOADS = (
    "handoff",
    "jittery",
    "bursty",
    "pipeline",
    "gpu",
    "control",
    "jpeg",
    "readbound",
    "autostart",
    "cow",
    "purepy",
    "advice",
)
"""Workload names, in the order they run."""
