"""``from tfos_nb import compat`` — TensorFlowOnSpark's module, from the bundled runtime."""

from .runtime.executor.compat import disable_auto_shard, export_saved_model, is_gpu_available

__all__ = ["disable_auto_shard", "export_saved_model", "is_gpu_available"]
