"""The one place a job's backend is chosen: the session says classic Spark or Spark Connect.

A classic session gets a :class:`~.job.DriverJob` (its control plane, the
:class:`~.controller.Controller`, in this process behind the control server); a Spark Connect
session a :class:`~.connect.job.ConnectDriverJob` (the Controller in a coordinator on an executor,
mirrored here).  Everything after this choice (starting, feeding, stopping) asks the job and its
control plane, whose capability flags say what a backend lacks.
"""

from __future__ import annotations

from typing import Any

from ...sessions import is_connect
from ..control import state as cluster_state
from ..control.controller import Controller
from ..job import DriverJob
from .slots import dynamic_allocation, require_classic


def new_job(sc: Any, state: cluster_state.ClusterState, controller: Controller, *, runs: bool = False,
            profiles: bool = False, **kw: Any) -> DriverJob:
    """The job for ``state`` on this session; ``controller`` is its Controller (the mirror's writer on Connect).

    ``runs``: the workload is parallel runs, which are the Spark job's own tasks (``nodes_outlive_jobs=False``)
    and may run in waves (so dynamic allocation is allowed); else a cluster, whose nodes outlive the launch
    stage and need a fixed set of executors, unless ``profiles``: its roles ask their own resources, and its
    launch stages may bring executors of their own shape (see :mod:`.stages` for what each mode keeps).
    """
    if runs:
        kw["nodes_outlive_jobs"] = False
    if is_connect(sc):
        from ..connect.job import ConnectDriverJob, RemoteController
        from ..connect.parallel import ConnectRunsJob

        return (ConnectRunsJob if runs else ConnectDriverJob)(sc, state, RemoteController(state, controller), **kw)
    require_classic(sc, "a status tracker and job groups" if runs else "RDDs, barrier tasks")
    if not runs and not profiles and dynamic_allocation(sc):
        msg = ("tfos_nb needs a fixed set of executors: set spark.dynamicAllocation.enabled=false, or give the roles "
               "their resources (resources=), whose stages bring executors of their own")
        raise ValueError(msg)
    return DriverJob(sc, state, controller, **kw)
