"""The thread side: :class:`~prefetch.BackgroundLoader` and what runs it.

How a batch travels through these modules, and which test guards each, is
the Architecture page of the docs (``docs/architecture.rst``). In short:

* :mod:`.loader`: the loader (arguments, what each epoch runs);
  :mod:`.iterator`: the consumer end of one epoch, with :mod:`.reports` (what
  it tells the self-tuning policies); :mod:`.keywords`: the error for a
  keyword the loader does not take.
* :mod:`.engine`: the only place that starts threads; every concurrency
  invariant is written in its docstring. Its threads run a
  :class:`~.producers.Producer` over :mod:`.tasks` (a DataLoader's batches
  read in parallel: :mod:`.parallel_fetch`, :mod:`.sample_board`) and call
  :mod:`.thread_side`; the consumer calls :mod:`.consumer_side`; both share
  :mod:`.shared`, which keeps :mod:`.tickets` and :mod:`.handover`; they pass
  what :mod:`.messages` describes.
* :mod:`.fetch_options`, :mod:`.fetch_info`, :mod:`.allocator`,
  :mod:`.timeout`: the ``fetch_threads`` options, what a fetch thread knows,
  freed memory given back (opt-in), ``timeout=``.
* :mod:`.policy` with :mod:`.depth_policy` (``depth="auto"``),
  :mod:`.thread_policy` and :mod:`.thread_windows` (``fetch_threads="auto"``).

What they need of torch's internals (the seeded sampler start, the worker-pid
lock, the fetcher swap) is in :mod:`prefetch._torch`.
"""
