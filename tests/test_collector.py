"""The garbage collector settled where data passes (``executor/collector.py``)."""

from __future__ import annotations


def test_a_feeding_worker_leaves_what_it_held_out_of_the_collectors_full_passes_once():
    """B1's profile: a full garbage-collector pass over a Spark Python worker (pyspark's, pyarrow's and tfos_nb's
    modules) every so many batches cost a third of the worker's CPU.  The first feeding task collects once and
    freezes what the worker holds; later ones leave it; garbage made before is collected, not frozen."""
    import subprocess
    import sys

    code = """
import gc, weakref
from tfos_nb.runtime.executor import collector as worker
def tracked(o):
    return any(t is o for t in gc.get_objects())
held = [[i] for i in range(1000)]
class Cycle: pass
c = Cycle(); c.me = c; gone = weakref.ref(c); del c
assert gc.get_freeze_count() == 0 and gone() is not None and tracked(held[0])
worker.settle_gc()
frozen = gc.get_freeze_count()
assert frozen > len(held) and gone() is None and not tracked(held[0]), (frozen, gone())
later = [[i] for i in range(1000)]
worker.settle_gc()
assert gc.get_freeze_count() == frozen and tracked(later[0])
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
