"""Everything only Spark Connect needs, on the driver's side of the wire.

On Spark Connect the executors cannot reach the notebook, so the control plane
(the :class:`~..controller.Controller` writing a :class:`~..state.ClusterState`)
runs in ``coordinator.py``, a process on an executor, and the notebook drives
it through tiny Spark jobs.

This package imports nothing at import time: the coordinator process (``python
-m tfos_nb.runtime coordinator``) loads only the modules it needs, none of them
pyspark or TensorFlow.
"""
