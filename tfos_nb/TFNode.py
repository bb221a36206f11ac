"""``from tfos_nb import TFNode`` — TensorFlowOnSpark's module, from the bundled runtime."""

from .runtime.executor.tfnode import DataFeed, batch_results, hdfs_path, next_batch, start_cluster_server, terminate

__all__ = ["DataFeed", "batch_results", "hdfs_path", "next_batch", "start_cluster_server", "terminate"]
