"""``from tfos_nb import TFParallel`` — TensorFlowOnSpark's module: independent single-node runs.

``TFParallel.run(sc, map_fun, tf_args, num_executors, use_barrier=True)`` runs
``map_fun(args, ctx)`` as ``num_executors`` TensorFlow runs with no cluster
between them (hyper-parameter sweeps, embarrassingly parallel inference).
As there, ``use_barrier=True`` with more runs than Spark task slots fails at
once (``use_barrier=False`` runs them in waves).  Unlike TensorFlowOnSpark it
returns each run's result, in run order, and ``tf_args`` may be a list of
dicts, one per run; ``sc`` may also be a Spark Connect session (``spark``).  ``start`` returns the
:class:`ParallelRuns` at once (``wait()``, ``stop()``, ``status()``).
"""

from .runtime.driver.parallel.runs import (
    ParallelRuns,
    ParallelView,
    RunResult,
    TFParallelError,
    best_index,
    run,
    start,
)
from .runtime.executor.process.run_task import RunContext

__all__ = ["ParallelRuns", "ParallelView", "RunContext", "RunResult", "TFParallelError", "best_index", "run", "start"]
