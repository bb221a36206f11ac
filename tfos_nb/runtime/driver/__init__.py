"""Start clusters and parallel runs, feed them, watch them: the Spark driver's side of the runtime.

Most of it runs in the notebook's (Spark driver's) process.  Not all: on Spark Connect the cluster's
control server is ``connect/coordinator.py``, a process on an executor (``python -m tfos_nb.runtime
coordinator``), and the task bodies built here (``connect/spark_jobs.py``, the feeders from ``executor``)
run in Spark tasks.  Everything only Spark Connect needs is in ``connect/``.
"""
