"""The Spark Python worker a feeding task runs in."""

from __future__ import annotations

import gc

__all__ = ["settle_gc"]


def settle_gc() -> None:
    """Once per Python worker, as its first feeding task starts: what the worker holds then (pyspark's, pyarrow's and
    tfos_nb's modules, a few hundred thousand objects) leaves the garbage collector's full passes (``gc.freeze``,
    after one last collection).  A feeding task allocates objects every batch; a full pass over the whole worker
    every so many batches and after each task cost it a third of its CPU (``perf`` and the workers' CPU time,
    benchmark B1).  Objects made later are collected as before; a worker someone already froze is left alone."""
    if not gc.get_freeze_count():
        gc.collect()
        gc.freeze()
