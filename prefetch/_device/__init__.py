"""The device side: :class:`~prefetch.CudaPrefetcher` and the stream protocol.

* :mod:`.prefetcher`: the loader (arguments, epochs); :mod:`.iterator`: one
  epoch, on the training loop's thread.
* :mod:`.copier`: the stream protocol (fences, events, memory lifetime), one
  batch at a time; :mod:`.ops`: every accelerator call behind one small
  interface (the seam the tests replace with a recording fake).
* :mod:`.normalize`: :class:`~prefetch.Normalize`, run on the side stream.
"""
