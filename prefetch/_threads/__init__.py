"""The thread side: :class:`~prefetch.BackgroundLoader` and what runs it.

* :mod:`.loader`: the loader (arguments, epochs) and :mod:`.iterator`, the
  consumer end of one epoch; :mod:`.keywords`: the error for a keyword the
  loader does not take (a DataLoader's, a typo).
* :mod:`.engine`: the only place that starts threads; every concurrency
  invariant is written in its docstring. It counts what is in flight with
  :mod:`.tickets` and hands runs over in order with :mod:`.handover`; its
  threads run a producer (:mod:`.producers` over an iterator,
  :mod:`.sample_fetch` over a DataLoader's samples) typed against
  :mod:`.thread_side`, and post what :mod:`.messages` describes.
* :mod:`.tasks`: what a thread draws (in order) and reads (in parallel);
  :mod:`.parallel_fetch`: a DataLoader's batches read in several threads;
  :mod:`.fetch_options`: the ``fetch_threads`` ceilings and ``thread_init_fn``;
  :mod:`.fetch_info`: what a fetch thread knows about itself;
  :mod:`.allocator`: freed tensor memory goes back to the system while fetch
  threads run.
* :mod:`.timeout`: ``timeout=``, the loop's longest wait, and its error.
* :mod:`.policy`: the shape both self-tuning policies share;
  :mod:`.depth_policy` (``depth="auto"``) and :mod:`.thread_policy`
  (``fetch_threads="auto"``): their rules.

What they need of torch's internals (the seeded sampler start, the worker-pid
lock, the fetcher swap) is in :mod:`prefetch._torch`.
"""
