"""What the thread side and the device side both use.

* :mod:`.wrapper`: the base of every wrapper (pass-through of ``len``,
  ``set_epoch``, ``dataset``, ...; ``close``; the one ``__iter__``), and
  :mod:`.epoch`: one epoch's life (its record, the base of its iterator, the
  registry of a wrapper's open epochs).
* :mod:`.structure`: walking nested batches (every tensor leaf, rebuilt with
  the same container types).
* :mod:`.stats`: the public :class:`~prefetch.LoaderStats` and policy events;
  :mod:`.totals`: :class:`~prefetch.TotalStats`, a wrapper's epochs summed;
  :mod:`.advice`: what ``summary()`` advises, from the figures and
  :mod:`.facts` (:class:`~prefetch.LoaderFacts`); :mod:`.cpu_clock`: the
  threads' time on, and waiting for, a core.
* :mod:`.checkpointing` and :mod:`.stateful`: ``state_dict`` only where the
  wrapped loader has state.
* :mod:`.pinning`: page-locked memory, pinned in the producer thread for the
  device's copies.
* Small helpers: :mod:`.arguments` (argument checks that name the argument),
  :mod:`.distributed` (the unsharded and unprepared-loader warnings), :mod:`.profiling`,
  :mod:`.progress`, :mod:`.user_frame`.
"""
