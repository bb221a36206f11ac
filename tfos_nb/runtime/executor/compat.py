"""TensorFlowOnSpark's ``compat`` helpers, for Keras 2 (tf_keras) and Keras 3."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

__all__ = ["disable_auto_shard", "export_saved_model", "is_gpu_available"]


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
