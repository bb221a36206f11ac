"""Parallel runs on a Spark Connect session (``TFParallel.run``/``start`` send Connect sessions here).

No SparkContext, no RDDs, and executors cannot reach the notebook: as for a
cluster (``start.py``), the runs' control server is a *coordinator*
process on an executor, started by a one-task job, and the notebook keeps a
mirror of its state (``job.py``: snapshot jobs, commands).  The runs are
then one ``mapInArrow`` stage, barrier or not (see
:mod:`...executor.run_task_connect`), whose ``collect()`` brings back each run's
outcome as the classic path's does.

Unlike a cluster's nodes, the runs *are* Spark tasks and hold their task slots
until they end: a snapshot or command job waits for a free slot.  While every
slot runs a run (e.g. 2 runs on 2 slots), the mirror is brought up to date when
a slot frees and in full once the runs' job is over (the teardown's final
snapshot); a run that fails stops the others from the coordinator, without the
notebook.  Stopping cancels the runs' job (Spark kills the tasks' Python workers,
whose run processes follow) when the kill cannot reach the coordinator at once.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...executor.run_task_connect import RESULT_SCHEMA, make_connect_run_task, make_coordinator_starter
from ...protocol import remote
from .. import state as S
from ..errors import python_error_line
from ..parallel_control import RunController
from .job import KERNEL_TIMEOUT_S, ConnectDriverJob, RemoteController
from .spark_jobs import ConnectSparkJob, ask

KILL_REACH_S = 1.0  # a kill command not run by then found no free task slot: the runs' job is cancelled instead
START_TIMEOUT_S = 180.0  # the coordinator's one-task job may wait this long for a slot


class ConnectRunsJob(ConnectDriverJob):
    """The runs' :class:`ConnectDriverJob`: teardown first ends the runs' job, whose tasks hold the slots."""

    def _teardown(self, wait: float) -> None:
        try:
            self._end_runs(wait)
        finally:
            super()._teardown(0.0)  # kill, close and the final snapshot: their jobs find free slots now

    def _end_runs(self, wait: float) -> None:
        running = [j for j in self.jobs if not j.done]
        if not running:
            return
        kill = None
        if self.meta is not None:  # a free slot takes the kill to the coordinator: the runs stop on their own
            meta = self.meta
            kill = ConnectSparkJob(self.sc, f"{self.state.job_group}-kill", f"tfos_nb {self.name}: stop the runs",
                                   lambda: ask(self.sc, meta, remote.Command(op="request_kill")))
            kill.start()
            started = time.monotonic()
            while not all(j.done for j in running) and time.monotonic() - started < wait:
                if not kill.done and time.monotonic() - started > KILL_REACH_S:
                    break  # every slot holds a run: cancelling the job is the way to stop them
                running[0].wait(0.1)
        for job in ([kill] if kill is not None else []) + running:
            job.cancel(join_timeout=self.join_s)


def connect_runs_job(spark: Any, state: S.ClusterState, controller: RunController, *, linger_s: float,
                     join_s: float) -> ConnectRunsJob:
    return ConnectRunsJob(spark, state, RemoteController(state, controller), nodes_outlive_jobs=False,
                          linger_s=linger_s, join_s=join_s)


def launch_connect_runs(job: ConnectRunsJob, meta: dict[str, Any], blob: bytes, n: int, barrier: bool) -> ConnectSparkJob:
    """Start the coordinator (waits for it), then the runs' ``mapInArrow`` job; returns the runs' job."""
    spark, name = job.sc, job.name
    meta["roles"] = [("run", i) for i in range(n)]
    meta["coordinator"] = job.coordinator_meta("parallel", KERNEL_TIMEOUT_S).to_dict()
    starter = make_coordinator_starter(meta)

    def start() -> dict[str, Any]:
        rows = spark.range(0, 1, 1, 1).mapInArrow(starter, "s string").collect()
        return dict(json.loads(rows[0]["s"]))

    start_job = job.spark_job("coordinator", f"tfos_nb {name}: start the runs' coordinator", start)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not start_job.wait(0.2):
        job.check_cancelled()
        if time.monotonic() > deadline:
            msg = f"{name}: the runs' coordinator did not start within {START_TIMEOUT_S:.0f} s (no free task slot?)"
            raise TimeoutError(msg)
    job.forget(start_job)
    if start_job.error is not None:
        msg = f"{name}: starting the runs' coordinator failed: {python_error_line(start_job.error)}"
        raise RuntimeError(msg)
    status = start_job.result()
    if not status.get("ok"):
        raise RuntimeError(f"{name}: {status.get('error') or 'the runs coordinator did not start'}")
    meta["control"] = list(status["control"])
    job.connected(meta)
    job.check_cancelled()
    task = make_connect_run_task(meta, blob, barrier)

    def action() -> list[tuple[int, str, bytes | None]]:
        rows = spark.range(0, n, 1, n).mapInArrow(task, RESULT_SCHEMA, barrier=barrier).collect()
        return [(int(r["i"]), str(r["s"]), None if r["v"] is None else bytes(r["v"])) for r in rows]

    return job.spark_job("launch", f"tfos_nb {name}: {n} parallel runs", action)
