"""``from tfos_nb import TFCluster`` — TensorFlowOnSpark's module, from the bundled runtime."""

from .runtime.driver.cluster import InputMode, TFCluster, TFClusterError
from .runtime.driver.launch.start import run
from .runtime.driver.options import JobOptions, RetryPolicy
from .runtime.driver.retry import RunOutcome, run_job

__all__ = ["InputMode", "JobOptions", "RetryPolicy", "RunOutcome", "TFCluster", "TFClusterError", "run", "run_job"]
