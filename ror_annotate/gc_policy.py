"""The cyclic garbage collector's settings for long runs: fewer collections, and none of the heap
that was there before the run.

Our stages allocate a few objects per segment or per request and keep few of them; CPython's
collector, with its default thresholds (700, 10, 10), collected the youngest generation every 700
net allocations and the whole heap every few hundred thousand. Measured on 2 cores:

- the LLM judge, 6,090 requests at concurrency 256: about 1,000 young and 8 full collections took
  1.6 of the run's 8.3 CPU seconds, each full one stalling every thread for up to 190 ms
  (``benchmarks/bench_judge.py --throughput``);
- ``ror run`` with the baseline judge (``benchmarks/bench_scale.py --mode run``): 1,000,037 segments
  in 51.0 s and 80.8 CPU s against 59.0 s and 89.5 CPU s with the defaults (peak RSS 599 against
  614 MiB, the export byte-identical); 100,000 segments in 6.5-6.9 s against 7.3-7.6 s.

Garbage cycles are still collected, in bounded batches of at most :data:`RUN_THRESHOLD0` young
objects. A collector turned off by its owner (threshold 0) is left off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["RUN_THRESHOLD0", "fewer_collections", "set_for_process"]

#: Net allocations between two collections of the youngest generation in a run (CPython: 700).
RUN_THRESHOLD0 = 20_000

_depth = 0
_lock = threading.Lock()
#: What the first of the blocks now open found: the thresholds, and whether it froze the heap.
_saved: tuple[tuple[int, int, int], bool] = ((700, 10, 10), False)


def set_for_process() -> None:
    """A process this package owns (the ``ror`` command, and the worker processes of its pools): the
    youngest generation collected every :data:`RUN_THRESHOLD0` net allocations for the process's
    life. A program that imports the package keeps its own settings."""
    threshold = gc.get_threshold()
    if threshold[0] > 0:
        gc.set_threshold(max(threshold[0], RUN_THRESHOLD0), *threshold[1:])


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Inside the block, the objects that existed before it (modules, the codebook, the store: most
    of the heap) are frozen out of collection (:func:`gc.freeze`) and the youngest generation is
    collected every :data:`RUN_THRESHOLD0` net allocations at least. On exit (also on an error) the
    previous thresholds come back and the frozen objects return to collection. Blocks open at the
    same time (nested, or in other threads) act once: the first one's entry sets, the last one's
    exit restores what the first found. A program that froze objects itself (``gc.get_freeze_count()
    > 0``) keeps them frozen: the block then freezes nothing and unfreezes nothing.
    """
    global _depth, _saved
    with _lock:
        _depth += 1
        if _depth == 1:
            old = gc.get_threshold()
            freeze = gc.get_freeze_count() == 0  # gc.unfreeze() would release the program's own frozen objects too
            _saved = (old, freeze)
            if freeze:
                gc.freeze()
            if old[0] > 0:
                gc.set_threshold(max(old[0], RUN_THRESHOLD0), *old[1:])
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                old, froze = _saved
                _saved = ((700, 10, 10), False)
                if old[0] > 0:
                    gc.set_threshold(*old)
                if froze:
                    gc.unfreeze()
