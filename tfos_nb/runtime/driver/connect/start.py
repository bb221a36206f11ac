"""Starting a cluster on a Spark Connect session (``run()`` sends Connect sessions here).

No SparkContext, no RDDs, and executors cannot reach the notebook: the launch
stage is a barrier ``mapInArrow`` whose task 0 starts the cluster's coordinator
(its control server, on an executor); the notebook then mirrors the
coordinator's state (see ``job.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ...executor.launch_connect import make_connect_launcher
from .. import state as S
from ..awaiting import await_running
from ..cluster import InputMode, TFCluster
from ..controller import new_cluster
from ..errors import python_error_line
from ..roles import trainers_finished
from ..slots import connect_slots, not_enough_executors
from .job import KERNEL_TIMEOUT_S, ConnectDriverJob, RemoteController


def run_connect(spark: Any, map_fun: Callable[[Any, Any], Any], tf_args: Any, roles: list[tuple[str, int]],
                num_executors: int, *, tensorboard: bool, input_mode: int, log_dir: str | None,
                reservation_timeout: float, release_port: bool, name: str | None, env: dict[str, str] | None,
                num_gpus: int | None, keras: str, heartbeat_timeout: float, notebook_timeout: float = KERNEL_TIMEOUT_S,
                log_callback: Callable[[str, list[str]], None] | None,
                on_state: Callable[[S.ClusterState], None] | None,
                on_start: Callable[[Any], None] | None, stall_after: float | None = 120.0) -> TFCluster:
    import cloudpickle

    if not notebook_timeout > 0:
        msg = f"notebook_timeout must be a positive number of seconds, got {notebook_timeout!r}"
        raise ValueError(msg)
    found = connect_slots(spark)
    if found is not None and found[0] < len(roles):  # else a barrier stage too big waits for Spark's own check
        raise RuntimeError(not_enough_executors(len(roles), found[0], str(found[1])))
    local = new_cluster(roles, name, tf_args, num_gpus, input_mode_spark=input_mode == InputMode.SPARK,
                        tensorboard=tensorboard, log_dir=log_dir, heartbeat_timeout=heartbeat_timeout,
                        stall_after=stall_after)
    state = local.state
    job = ConnectDriverJob(spark, state, RemoteController(state, local), nodes_outlive_jobs=True, linger_s=10.0,
                           join_s=5.0, finished=trainers_finished)
    job.announce(log_callback=log_callback, on_state=on_state, on_start=on_start)
    try:
        meta = job.launch_meta(job.open_control(), heartbeat_timeout=heartbeat_timeout, env=env, keras=keras,
                               roles=roles, reservation_timeout=float(reservation_timeout), first_node=0,
                               release_port=bool(release_port)).to_dict()
        meta["coordinator"] = job.coordinator_meta("cluster", notebook_timeout).to_dict()
        cluster = TFCluster(job, meta, input_mode, num_executors)
        launcher = make_connect_launcher(meta, cloudpickle.dumps((map_fun, tf_args)))
        n = len(roles)

        def launch() -> list[dict[str, Any]]:
            rows = spark.range(0, n, 1, n).mapInArrow(launcher, "s string", barrier=True).collect()
            return [json.loads(r["s"]) for r in rows]

        launch_job = job.spark_job("launch", f"tfos_nb {state.name}: start {n} nodes", launch)
        deadline = time.monotonic() + reservation_timeout
        while not launch_job.wait(0.2):
            job.check_cancelled()
            if time.monotonic() > deadline:
                msg = (f"reservation timed out after {reservation_timeout:.0f} s: the launch stage of {n} barrier "
                       "tasks did not run. Are there enough free executor slots?")
                raise TimeoutError(msg)
        job.check_cancelled()
        if launch_job.error is not None:
            msg = f"starting the nodes failed: {python_error_line(launch_job.error)}"
            raise RuntimeError(msg)
        statuses = launch_job.result()
        coordinator = next((s.get("coordinator") for s in statuses if s.get("coordinator")), None) or {}
        if coordinator.get("ok"):
            meta["control"] = list(coordinator["control"])
            job.connected(meta)
        bad = [s for s in statuses if not s.get("ok")]
        if bad:
            lines = [f"{state.nodes[s['node']].label}: {s.get('error')}" for s in bad]
            raise RuntimeError("nodes did not start:\n" + "\n".join(lines))
        await_running(state, launch_job, reservation_timeout)
        job.forget(launch_job)
        job.mark_up()
        job.controller.set_running()
        return cluster
    except BaseException:
        job.close()
        raise
