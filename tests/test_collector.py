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


def test_a_scoring_worker_leaves_the_model_it_loaded_out_of_the_collectors_full_passes(tmp_path):
    """B3's profile: in a Spark Python worker scoring with ``TFModel.transform``, the collector's full passes over
    TensorFlow's objects were over half of the worker's CPU (1.2 CPU-s for 100,000 rows; 0.55 once settled).  A
    model loaded by the scorer leaves them, though a feeding task froze the worker before; what was frozen at an
    earlier load rejoins them at the next (a model dropped from the worker's cache), so that its cycles are
    collected."""
    import subprocess
    import sys

    code = f"""
import gc, os, weakref
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
from tfos_nb.pipeline import _model_runners as mr
from tfos_nb.runtime.executor.collector import settle_gc

def tracked(o):
    return any(t is o for t in gc.get_objects())

class Affine(tf.Module):
    def __init__(self):
        self.w = tf.Variable(2.0)
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def __call__(self, x):
        return {{"y": x * self.w}}

paths = []
for i in range(mr._CACHE_MAX + 1):
    m = Affine()
    paths.append(os.path.join({str(tmp_path)!r}, f"m{{i}}"))
    tf.saved_model.save(m, paths[-1], signatures={{"serving_default": m.__call__}})
settle_gc()  # a feeding task ran in this worker first
def ref(i):
    return mr.ModelRef(mr.SIGNATURE, paths[i], ("serve",), "serving_default")
run = mr.runner(ref(0), ["x"], ["y"])
assert run({{"x": [1.0, 2.0]}})["y"].tolist() == [2.0, 4.0]
assert not tracked(run) and not tracked(run._loaded), "the loaded model is still in the collector's generations"
class Cycle: pass
c = Cycle(); c.me = c; gone = weakref.ref(c)
mr.runner(ref(1), ["x"], ["y"])  # a second model: what lives now is frozen, the cycle too
assert not tracked(c)
del c
for i in range(2, mr._CACHE_MAX + 1):  # the first model is dropped from the cache: the worker is settled anew
    mr.runner(ref(i), ["x"], ["y"])
assert gone() is None, "garbage frozen at an earlier load was never collected"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
