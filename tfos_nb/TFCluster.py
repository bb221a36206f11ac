"""``from tfos_nb import TFCluster`` — TensorFlowOnSpark's module, from the bundled runtime."""

from .runtime.cluster import InputMode, TFCluster, TFClusterError
from .runtime.start import run

__all__ = ["InputMode", "TFCluster", "TFClusterError", "run"]
