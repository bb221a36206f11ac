"""``from tfos_nb import util`` — TensorFlowOnSpark's module, from the bundled runtime."""

from .runtime.util import find_in_path, get_ip_address, read_executor_id, single_node_env, write_executor_id

__all__ = ["find_in_path", "get_ip_address", "read_executor_id", "single_node_env", "write_executor_id"]
