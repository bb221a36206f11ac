"""Python's garbage collector where tfos_nb's data passes, once per process: a Spark Python worker running feeding
tasks, and a node reading its feed (``as_dataset()``).

Both allocate Python objects every batch; every so many, the collector makes a full pass over everything the
process holds — a Spark worker's pyspark, pyarrow and tfos_nb modules, a node's TensorFlow and Keras, hundreds of
thousands of objects.  Measured (``perf``, benchmarks B1 and B2): a third of a feeding worker's CPU, and 4 of the 33 ms
a node spent a training step against native's 28.6.  ``settle_gc`` collects once, then leaves what the process holds
out of later full passes (``gc.freeze``): objects made later are collected as before; objects alive then that
later become unreachable in a reference cycle are not (a node holds its model to its end anyway).
"""

from __future__ import annotations

import gc

__all__ = ["settle_gc"]


def settle_gc() -> None:
    """Once per process: collect, then leave what the process holds out of the collector's full passes; a process
    whose objects someone already froze is left alone."""
    if not gc.get_freeze_count():
        gc.collect()
        gc.freeze()
