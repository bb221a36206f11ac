"""Parallel runs on a Spark Connect session: their coordinator, and a teardown that frees the runs' slots.

No SparkContext, and executors cannot reach the notebook: as for a cluster,
the runs' control server is a *coordinator* process on an executor and the
notebook keeps a mirror of its state (``job.py``: snapshot jobs, commands).
The runs themselves are the same ``mapInArrow`` stage as on a classic session
(:mod:`..parallel`, :func:`...executor.run_task.make_run_task`); what differs is
that the coordinator must listen before the first run registers, and a run's
stage may not be a barrier one (waves), so no task of it can start the
coordinator for the others: a one-task job does, first
(:meth:`ConnectRunsJob.start_coordinator`).

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

from ...executor.process.launch import coordinator_status
from ...protocol import messages, remote
from ...sessions import in_one_task
from ..errors import python_error_line
from .job import ConnectDriverJob
from .spark_jobs import ConnectSparkJob, ask

KILL_REACH_S = 1.0  # a kill command not run by then found no free task slot: the runs' job is cancelled instead
START_TIMEOUT_S = 180.0  # the coordinator's one-task job may wait this long for a slot


class ConnectRunsJob(ConnectDriverJob):
    """The runs' :class:`ConnectDriverJob`: starts their coordinator first; teardown first ends the runs' job,
    whose tasks hold the slots."""

    def start_coordinator(self, meta: dict[str, Any]) -> None:
        """Start the runs' coordinator in a one-task job and wait for it; ``meta["control"]`` is then its address,
        and the mirror follows it."""
        launch_meta = messages.LaunchMeta.parse(meta)
        spark, name = self.sc, self.name

        def start() -> messages.CoordinatorStarted:
            answer = in_one_task(spark, lambda: json.dumps(coordinator_status(launch_meta).to_dict()))
            return messages.CoordinatorStarted.from_dict(json.loads(answer))

        start_job = self.spark_job("coordinator", f"tfos_nb {name}: start the runs' coordinator", start)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not start_job.wait(0.2):
            self.check_cancelled()
            if time.monotonic() > deadline:
                msg = f"{name}: the runs' coordinator did not start within {START_TIMEOUT_S:.0f} s (no free task slot?)"
                raise TimeoutError(msg)
        self.forget(start_job)
        if start_job.error is not None:
            msg = f"{name}: starting the runs' coordinator failed: {python_error_line(start_job.error)}"
            raise RuntimeError(msg)
        started = start_job.result()
        if not started.ok:
            raise RuntimeError(f"{name}: {started.error or 'the runs coordinator did not start'}")
        meta["control"] = started.address
        self.connected(meta)

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
                                   lambda: ask(self.sc, meta, remote.Command(op="request_kill"), remote.Done))
            kill.start()
            started = time.monotonic()
            while not all(j.done for j in running) and time.monotonic() - started < wait:
                if not kill.done and time.monotonic() - started > KILL_REACH_S:
                    break  # every slot holds a run: cancelling the job is the way to stop them
                running[0].wait(0.1)
        for job in ([kill] if kill is not None else []) + running:
            job.cancel(join_timeout=self.join_s)
