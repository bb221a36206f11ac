"""TensorFlowOnSpark's ``compat`` helpers, for Keras 2 (tf_keras) and Keras 3."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

__all__ = ["disable_auto_shard", "export_saved_model", "is_gpu_available", "untuned_device_prefetch"]


def export_saved_model(model: Any, export_dir: str, is_chief: bool = False) -> None:
    """Export a SavedModel; call it on *every* worker.

    Under MultiWorkerMirroredStrategy saving runs collectives, so all workers
    must save; only the chief's copy lands in ``export_dir``, the others write
    to a temporary directory that is removed.
    """
    target = export_dir if is_chief else tempfile.mkdtemp(prefix="tfos_nb_export_")
    try:
        if type(model).__module__.startswith("keras.") and hasattr(model, "export"):
            model.export(target)  # Keras 3
        else:
            model.save(target, save_format="tf")  # tf_keras (Keras 2)
    finally:
        if not is_chief:
            shutil.rmtree(target, ignore_errors=True)


def disable_auto_shard(options: Any) -> None:
    """Turn tf.data auto-sharding off in ``options`` (a ``tf.data.Options``): each node reads only its own rows."""
    import tensorflow as tf

    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF


def is_gpu_available() -> bool:
    """Whether TensorFlow sees a GPU in this process (on a node: the GPUs it was given, ``ctx.gpus``)."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU")) > 0


def untuned_device_prefetch() -> bool:
    """Turn tf.data's autotuning off on the per-device datasets of a distribution strategy's input iterators, on a
    process without GPUs; returns whether it is off.

    Under ``MultiWorkerMirroredStrategy`` Keras reads a dataset through a ``MultiDeviceIterator``, which makes a
    per-device dataset -- a prefetch of a fixed size, nothing to tune -- with tf.data's default options, so its
    iterator runs an autotuning thread; deleting the iterator (at the end of every epoch: Keras makes a new one
    for the next) waits for that thread's current sleep, which grows to seconds as training runs (measured with
    TensorFlow 2.21: 2.1-2.5 s after the last step of a 2-worker fit, on one worker or both, by chance). With
    autotuning off those datasets have no such thread. TensorFlow gives no option for them, so the function that
    makes them (``multi_device_iterator_ops._create_device_dataset``) is wrapped; where a TensorFlow version does
    not have it, nothing changes. Not on GPU processes, whose per-device datasets live on the GPUs.
    """
    if is_gpu_available():
        return False
    import tensorflow as tf

    try:
        from tensorflow.python.data.ops import multi_device_iterator_ops as mdi
    except ImportError:  # pragma: no cover - a TensorFlow without the module
        return False
    create = getattr(mdi, "_create_device_dataset", None)
    if not callable(create):  # pragma: no cover - a TensorFlow that builds them otherwise
        return False
    if getattr(create, "__module__", None) == __name__:  # wrapped already, by an earlier call
        return True

    def untuned(*args: Any, **kwargs: Any) -> Any:
        options = tf.data.Options()
        options.autotune.enabled = False
        return create(*args, **kwargs).with_options(options)

    mdi._create_device_dataset = untuned  # see the docstring
    return True
