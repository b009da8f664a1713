"""The only place that uses torch's private names: each workaround, checked and switchable.

Every read or write of a private name of torch (``_x`` attributes of its
modules, DataLoader iterators and their classes; imports from
``torch.*._*`` modules) lives here; ``tests/test_layout.py`` checks that no
other module has one. Each use is a :class:`~prefetch._torch.workaround.Workaround`
that names the torch behaviour it works around and the torch versions its
tests passed on, and checks, the first time it is used, that the names it
needs are present and of the expected kind. When torch changed underneath, it
turns itself off with one :class:`~prefetch.TorchWorkaroundWarning` (naming
the workaround, the torch version and what is lost) and its caller falls back
to torch's public behaviour. ``PREFETCH_TORCH_WORKAROUNDS=0`` in the
environment (read once, at import) turns them all off, without warnings.

.. list-table::
   :header-rows: 1
   :widths: 14 40 14 32

   * - Workaround (module)
     - What it does (private names)
     - Checked on torch
     - Off
   * - worker shutdown (:mod:`.workers`)
     - Stops a multi-process DataLoader iterator's workers when an epoch ends,
       breaks or fails, not when the iterator is collected (pytorch #149837)
       (``_shutdown_workers``, ``_persistent_workers``)
     - 2.6.0, 2.12.0, 2.13.0, 2.15.0
     - The workers live until the iterator is garbage-collected (an error's
       traceback may keep it)
   * - dead workers (:mod:`.workers`)
     - After a worker died: no more reads from that iterator, the others
       terminated, the done event's lock bypassed
       (``_workers``, ``_shutdown``, ``_workers_done_event``)
     - 2.6.0, 2.12.0, 2.13.0, 2.15.0
     - The error still reaches the loop; the thread may read on and wait for
       ever, and the shutdown may hang (a thread left behind)
   * - interrupted start (:mod:`.interrupted_start`)
     - Removes the worker-pid record of an iterator interrupted while it
       started (``_worker_pids_set``, ``_workers``,
       ``signal_handling._remove_worker_pids``)
     - 2.6.0, 2.12.0, 2.13.0, 2.15.0
     - A loop interrupted there may not start again (``ValueError:
       _set_worker_pids should be called only once``)
   * - worker-pid guard (:mod:`.worker_pids`)
     - With the GIL off, one lock around torch's worker-pid map
       (``signal_handling._set_worker_pids``, ``_remove_worker_pids``,
       ``_error_if_any_worker_fails``); with the GIL on it changes nothing
     - 2.12.0 (3.13t, GIL off: the only torch there); names present on 2.6.0,
       2.13.0, 2.15.0
     - With the GIL off, a multi-worker DataLoader may crash the process
       (SIGSEGV)
   * - sampler start (:mod:`.sampler_start`)
     - Starts a ``num_workers=0`` DataLoader's sampler on the caller's
       thread (``_SingleProcessDataLoaderIter``, ``_sampler_iter``)
     - 2.6.0, 2.12.0, 2.13.0, 2.15.0
     - ``torch.manual_seed`` no longer fixes the shuffle order (the seed is
       drawn on the prefetch thread)
   * - profiler flag (:mod:`.profiler`)
     - Marks ``prefetch.fetch`` / ``prefetch.wait`` only while a profiler
       records (``torch.autograd.profiler._is_profiler_enabled``)
     - 2.6.0, 2.12.0, 2.13.0, 2.15.0
     - Traces show no ``prefetch.*`` ranges
   * - per-thread intra-op count (:mod:`.intra_op`)
     - Sets a loading thread's torch intra-op count for that thread alone,
       through the OpenMP runtime's ``omp_set_num_threads`` once torch has
       filled the thread's count (no private name; the OpenMP backend and
       the runtime's library are what it needs)
     - 2.6.0, 2.12.0, 2.13.0, 2.15.0
     - Fetch threads run torch ops with torch's default count, and
       ``num_threads=`` sets torch's count for the whole process
       (``torch.set_num_threads``)
   * - parallel fetch (:mod:`.fetcher`), *required*
     - ``fetch_threads``: swaps the iterator's ``_dataset_fetcher``, reads
       ``_num_yielded``, ``_base_seed``, ``_pin_memory``,
       ``_pin_memory_device``, ``DataLoader._get_iterator``,
       ``_utils.pin_memory.pin_memory``
     - 2.6.0, 2.12.0, 2.13.0, 2.15.0
     - Not a workaround: ``BackgroundLoader(fetch_threads=...)`` raises
       ``RuntimeError`` saying why and to leave ``fetch_threads`` unset; no
       warning

"Checked on" lists the torch releases on which the workaround's tests
passed, slow ones included (``test_torch_workarounds.py``,
``test_faults_workers.py``, ``test_faults_signals.py``, ``test_release.py``,
``test_torch_guard.py``, the seeded-run, lazy-start, profiler, parallel-fetch
and resume tests; 6 December 2026): 2.6.0 and 2.15.0 in the venvs of ``make
test-torch-range`` (which itself runs only the quick suite there), 2.13.0 in
``.venv`` (``make test``), 2.12.0 on free-threaded 3.13t with the GIL off
(``.venv-ft``). This subpackage is the lowest layer: it imports nothing else
of ``prefetch``.
"""

from prefetch._torch.fetcher import PARALLEL_FETCH
from prefetch._torch.interrupted_start import INTERRUPTED_START
from prefetch._torch.intra_op import THREAD_INTRA_OP
from prefetch._torch.profiler import PROFILER_FLAG
from prefetch._torch.sampler_start import SAMPLER_START
from prefetch._torch.worker_pids import WORKER_PID_GUARD
from prefetch._torch.workers import DEAD_WORKERS, WORKER_SHUTDOWN

WORKAROUNDS = (
    WORKER_SHUTDOWN,
    DEAD_WORKERS,
    INTERRUPTED_START,
    WORKER_PID_GUARD,
    SAMPLER_START,
    PROFILER_FLAG,
    THREAD_INTRA_OP,
    PARALLEL_FETCH,
)
"""Every workaround, in the order of the table above."""
