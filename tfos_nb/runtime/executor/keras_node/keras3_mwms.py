"""Keras 3 (TensorFlow backend) across nodes: three narrow, version-guarded repairs of its trainer under
``MultiWorkerMirroredStrategy``, applied on every node as Keras' TensorFlow trainer is imported.

Keras 3's ``model.fit``/``evaluate`` fail before the first step under ``MultiWorkerMirroredStrategy`` with more
than one worker (keras-team/keras#20585, tensorflow/tensorflow#72388): ``ValueError: Attempt to convert a value
(PerReplica:{...}) with an unsupported type``.  Read in Keras 3.15 (``keras/src/backend/tensorflow/trainer.py``):

1. ``TensorFlowTrainer._maybe_symbolic_build`` pulls the first batch of the distributed dataset only to learn its
   shapes and calls ``strategy.reduce("MEAN", batch, axis=None)`` on the whole ``(x, y)`` structure; the
   multi-worker strategy's ``_reduce_to`` is not nest-aware and converts the tuple of ``PerReplica`` values to a
   tensor (the error).  Even where it works — under any strategy, one worker's included — the pulled batch is
   dropped with the iterator's prefetched ones (``epoch_iterator.reset()`` follows): a one-pass stream such as a
   node's feed loses those rows (a one-node cluster lost two batches of its first epoch; found by recovery's
   row audit).  Repaired under every strategy: build from the dataset's ``element_spec`` (shapes and dtypes are
   all ``_symbolic_build`` uses), reading no data; where the spec has an unknown non-batch dimension, Keras' own
   pull of one batch, across workers taking this worker's value instead of the reduce.
2. ``reduce_per_replica`` averages each step's logs with ``strategy.reduce("MEAN", v, axis=0)``, which fails on
   the scalar loss and metric values across workers; repaired with ``axis=None`` (the mean over replicas).
3. ``get_metrics_result`` reads the metrics in replica context inside a step, so each worker's step logs are its
   own; read in a ``merge_call`` (as tf_keras does), every step's logs are the global values, the same on every
   worker and, at an epoch's last step, equal to the epoch's logs and ``History`` (what the panel shows).

Each repair replaces one function and keeps the original on it (``import_patches.replace_once``); nothing changes unless Keras' major
version is 3 and the three functions exist.  ``tests/test_keras3.py`` fails when upstream changes them (then this
module is revisited: dropped once Keras fixes it).  Outside multi-worker training repairs 2 and 3 call the
originals, and repair 1 builds from the spec where Keras would pull a batch.  ``steps_per_execution > 1`` fails
inside Keras under the strategy (a separate Keras 3 problem): refused before the first step with one sentence
(:data:`STEPS_PER_EXECUTION`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..import_patches import replace_once

TARGET = "keras.src.backend.tensorflow.trainer"
STEPS_PER_EXECUTION = (
    "Keras 3 runs one step per execution under MultiWorkerMirroredStrategy across workers: compile("
    "steps_per_execution={n}) fails inside Keras' TensorFlow trainer ('You must feed a value for placeholder "
    "tensor ...'); compile without steps_per_execution (or use tf.keras, which is tf_keras on the nodes)")


def _spec_batch(spec: Any, tf: Any) -> Any:
    """``spec`` as a structure of ``tf.TensorSpec`` for ``_symbolic_build``; None where a shape is not known."""
    from tensorflow.python.distribute import values as dist_values

    usable = [True]

    def leaf(s: Any) -> Any:
        if s is None or isinstance(s, tf.OptionalSpec):
            return None  # Keras feeds the absent parts (sample_weight=None) as empty Optionals
        if isinstance(s, dist_values.PerReplicaSpec):
            s = s._value_specs[0]
        shape, dtype = getattr(s, "shape", None), getattr(s, "dtype", None)
        if shape is None or dtype is None or shape.rank is None or None in shape.as_list()[1:]:
            usable[0] = False
            return None
        return tf.TensorSpec(shape, dtype)

    out = tf.nest.map_structure(leaf, spec)
    return out if usable[0] else None


def _multi_worker(strategy: Any, tf: Any) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode())


def _symbolic_build(original: Callable[..., Any]) -> Callable[..., Any]:
    import tensorflow as tf

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = self._distribute_strategy
        if strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        multi = _multi_worker(strategy, tf)
        if multi and int(getattr(self, "steps_per_execution", 1) or 1) > 1:
            raise ValueError(STEPS_PER_EXECUTION.format(n=self.steps_per_execution))
        spec = getattr(getattr(iterator, "_distributed_dataset", None), "element_spec", None)
        data_batch = _spec_batch(spec, tf) if spec is not None else None
        if data_batch is None:
            if not multi:  # Keras' own pull of a batch (a one-worker strategy reduces it fine)
                return original(self, iterator=iterator, data_batch=None)
            for _, _, it in iterator:  # Keras' own pull of a batch, minus the cross-worker reduce of the data
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v, next(it))
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    return _maybe_symbolic_build


def _reduce_per_replica(original: Callable[..., Any]) -> Callable[..., Any]:
    import tensorflow as tf

    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        mean = reduction == "mean" or (reduction == "auto" and not isinstance(strategy, tf.distribute.TPUStrategy))
        if mean and _multi_worker(strategy, tf):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    return reduce_per_replica


def _metrics_result(original: Callable[..., Any]) -> Callable[..., Any]:
    import tensorflow as tf

    def get_metrics_result(self: Any) -> Any:
        if not tf.distribute.in_cross_replica_context() and _multi_worker(tf.distribute.get_strategy(), tf):
            return tf.distribute.get_replica_context().merge_call(lambda _: original(self))
        return original(self)

    return get_metrics_result


def patch_trainer(module: Any) -> bool:
    """Repair Keras 3's TensorFlow trainer module (once); False when it is not the Keras these repairs are for."""
    try:
        from keras.src.version import __version__ as version  # not keras.__version__: keras is half imported here
    except ImportError:
        return False
    cls = getattr(module, "TensorFlowTrainer", None)
    found = {"_maybe_symbolic_build": (cls, _symbolic_build), "get_metrics_result": (cls, _metrics_result),
             "reduce_per_replica": (module, _reduce_per_replica)}
    if not version.startswith("3.") or any(getattr(owner, name, None) is None for name, (owner, _) in found.items()):
        return False
    for name, (owner, repair) in found.items():
        replace_once(owner, name, repair)  # reduce_per_replica: a module global the step functions look up
    return True


def install() -> None:
    """Repair Keras 3's trainer in this process as soon as it is imported (now, if it was)."""
    from ..import_patches import patch_modules

    patch_modules(lambda name: name == TARGET, patch_trainer)
