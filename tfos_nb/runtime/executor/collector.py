"""Python's garbage collector where tfos_nb's data passes, once per process: a Spark Python worker running feeding
tasks, and a node reading its feed (``as_dataset()``); and in a Spark Python worker scoring rows
(``TFModel.transform``), at every model it loads.

Both allocate Python objects every batch; every so many, the collector makes a full pass over everything the
process holds — a Spark worker's pyspark, pyarrow and tfos_nb modules, a node's TensorFlow and Keras, hundreds of
thousands of objects.  Measured (``perf``, benchmarks B1 and B2): a third of a feeding worker's CPU, and 4 of the 33 ms
a node spent a training step against native's 28.6.  ``settle_gc`` collects once, then leaves what the process holds
out of later full passes (``gc.freeze``): objects made later are collected as before; objects alive then that
later become unreachable in a reference cycle are not (a node holds its model to its end anyway) — until the
process is settled again (``again``: a scoring worker at each model it loads; B3 measured the full passes over
TensorFlow's objects at over half of a scoring worker's CPU).
"""

from __future__ import annotations

import gc

__all__ = ["settle_gc"]


def settle_gc(again: bool = False) -> None:
    """Once per process: collect, then leave what the process holds out of the collector's full passes; a process
    whose objects someone already froze is left alone.  ``again``: settle it anew whatever was frozen before (a
    model was just loaded, or one dropped: what it holds leaves the full passes, or rejoins them to be collected)."""
    if again:
        gc.unfreeze()
    if again or not gc.get_freeze_count():
        gc.collect()
        gc.freeze()
