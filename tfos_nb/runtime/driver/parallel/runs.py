"""Independent parallel runs: TensorFlowOnSpark's ``TFParallel`` — N single-node TensorFlow runs.

No cluster is formed between the runs: each is ``map_fun(args, ctx)`` in a
fresh process on an executor (see :mod:`...executor.run_task` for why a process),
for hyper-parameter sweeps and embarrassingly parallel inference.  All runs
are one Spark job, one task per run, on either backend the same ``mapInArrow``
stage over ``range(n)`` (:func:`~...executor.run_task.make_run_task`): a barrier
stage when asked for and the application has a slot per run (the runs start
together), else a plain stage whose tasks run in waves as slots free up.  Each
run's outcome comes back as one row of that stage (index, status, pickled value)
through Spark's own ``collect()``.

The driver side reuses the cluster's pieces: the signed control server, the
heartbeat handling of :class:`~..controller.Controller` (output lines,
``ctx.report`` progress, lost runs) and the observable :class:`~..state.ClusterState`
(one node ``run:i`` per run), so ``%tfos_status``, ``%tfos_logs`` and the
notebook panel show runs like nodes.  A run that raises stops the others and
ends :meth:`ParallelRuns.wait` with one :class:`TFParallelError` naming the run,
its arguments, host and last output lines.

On a Spark Connect session (no SparkContext, executors cannot reach the
notebook) the control server is a coordinator on an executor, started by a
one-task job before the runs' stage, and the state a mirror of it: see
:mod:`.connect.parallel`.  That, the teardown, and how many task slots a barrier
stage can count on are all that differ between the backends here.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...executor.process.run_task import RESULT_SCHEMA, make_run_task
from ..connect.parallel import ConnectRunsJob
from ..control import state
from ..errors import TFClusterError, failure_message, first_failure, python_error_line
from ..job import DriverJob
from ..keywords import OptionKeywords, RunsKeywords
from ..launch.backends import new_job
from ..launch.slots import spark_context, spark_session
from ..launch.sparkjob import SparkJob
from ..options import JobOptions
from ..tracking import tracked_start
from .control import RunController, barrier_refusal, classic_gang, connect_gang, runs_args
from .results import (
    ParallelView,
    RunResult,
    RunsState,
    best_index,
    default_metric,
    default_mode,
    describe_args,
    runs_view,
    scalars,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is Python 3.11+; only annotations use it

log = logging.getLogger(__name__)

__all__ = ["ParallelRuns", "ParallelView", "RunResult", "TFParallelError", "best_index", "default_metric", "describe_args",
           "default_mode", "run", "start"]

STOP_WAIT_S = 4.0  # runs told to stop get this long to report it before the Spark job is cancelled


class TFParallelError(TFClusterError):
    """A parallel run failed (or was lost); the other runs were stopped.

    ``node`` is the run's label (``run:2``) and ``run`` its index, with ``run_args``
    (what the run was given), ``host``, ``executor_id``, ``exit_code`` and
    ``tail`` (its last output lines).
    """

    def __init__(self, message: str, node: state.NodeView | None = None, args: Any = None) -> None:
        super().__init__(message, node)
        self.run = node.index if node is not None else None
        self.run_args = args


class ParallelRuns:
    """N independent runs on Spark executors (made by :func:`start`); owns their Spark job and control server.

    ``wait()`` returns the :class:`RunResult` of every run in order, or raises;
    ``stop()`` asks the runs to stop (from any thread); ``close()`` tears
    everything down (idempotent; also on KeyboardInterrupt in ``wait()`` and at
    interpreter exit).  ``status()`` is a live :class:`ParallelView`.
    """

    def __init__(self, sc: Any, map_fun: Callable[[Any, Any], Any], args: list[Any], params: list[dict[str, Any]] | None,
                 options: JobOptions, *, use_barrier: bool | None, metric: str | None = None,
                 mode: str | None = None) -> None:
        import cloudpickle

        self.sc = sc
        self.num_runs = len(args)
        self.runs_args = args
        self.params = params
        self.use_barrier = use_barrier
        self.barrier = False
        self.cluster_id = uuid.uuid4().hex[:12]
        self.name = options.name or f"tfos-parallel-{self.cluster_id}"
        self.state = RunsState(self.cluster_id, self.name, self.num_runs, params, metric, mode)
        self.state.job_group = f"tfos-{self.cluster_id}"
        num_gpus = 1 if options.num_gpus is None else options.num_gpus
        self._controller = RunController(self.state, options.replace(num_gpus=num_gpus), input_mode_spark=False,
                                         tensorboard=False, log_dir=None)
        # The one backend choice: on Spark Connect the runs' control server is a coordinator on an executor
        # (connect/parallel.py), and a barrier stage's fit is read from the session's configuration.
        self.job: DriverJob = new_job(sc, self.state, self._controller, runs=True, linger_s=STOP_WAIT_S, join_s=10.0)
        self._coordinated = self.job if isinstance(self.job, ConnectRunsJob) else None
        self._gang = connect_gang if self._coordinated is not None else classic_gang
        self._blob = cloudpickle.dumps((map_fun, args))
        self._options = options
        self._launch: dict[str, Any] = dict(num_runs=self.num_runs, num_gpus=num_gpus,
                                            roles=[("run", i) for i in range(self.num_runs)])
        self._spark_job: SparkJob | None = None
        self._stop_reason: str | None = None
        self._results: list[RunResult] | None = None
        self.tracking: Any = None  # the MLflow run (driver.tracking.JobRun) when the runs are tracked

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> ParallelRuns:
        """Start the control server and the Spark job; returns at once (idempotent)."""
        if self._spark_job is not None:
            return self
        try:
            meta = self.job.launch_meta(self.job.open_control(), self._options, **self._launch,
                                        coordinator=self.job.coordinator_section(
                                            "parallel", self._options.notebook_timeout)).to_dict()
            self.barrier = self._choose_barrier()
            self.job.check_cancelled()
            if self._coordinated is not None:  # Spark Connect: the runs register with a coordinator, started first
                self._coordinated.start_coordinator(meta)
                self.job.check_cancelled()
            n, barrier = self.num_runs, self.barrier
            task = make_run_task(meta, self._blob, barrier)
            session = spark_session(self.sc)

            def action() -> list[tuple[int, str, bytes | None]]:
                rows = session.range(0, n, 1, n).mapInArrow(task, RESULT_SCHEMA, barrier=barrier).collect()
                return [(int(r["i"]), str(r["s"]), None if r["v"] is None else bytes(r["v"])) for r in rows]

            # One job; named like a cluster's launch job so the panel's Spark progress finds it.
            self._spark_job = self.job.spark_job("launch", f"tfos_nb {self.name}: {n} parallel runs", action)
            self.job.mark_up()
        except BaseException:
            self.close()
            raise
        return self

    def _choose_barrier(self) -> bool:
        """Whether the runs are one barrier stage; raises when ``use_barrier=True`` cannot be (too few slots)."""
        n = self.num_runs
        if self.use_barrier is False:
            return False
        fits, slots, executors = self._gang(self.sc, n)
        if fits is None:  # the session does not say (Spark Connect): auto runs waves, use_barrier=True lets Spark decide
            fits = self.use_barrier is True
        if self.use_barrier is None:  # auto (%%tfos_parallel): one barrier stage when it fits, else waves
            if not fits:
                log.info("tfos_nb: %d runs, fewer task slots: running them in waves, without a barrier stage", n)
            return fits
        if not fits:
            raise RuntimeError(barrier_refusal(n, slots, executors))
        return True

    def stop(self, reason: str = "stopped") -> None:
        """Ask the runs to stop now, from any thread; ``wait()`` then tears down and raises."""
        with self.state.lock:
            if self._stop_reason is None and self._results is None:
                self._stop_reason = reason
        self.state.notify()

    def cancel(self, reason: str) -> None:
        """Stop the runs now, from any thread (idempotent): see :meth:`DriverJob.cancel`."""
        self.stop(reason)
        self.job.cancel(reason)

    def close(self) -> None:
        """Stop every run, cancel the Spark job, stop the control server; idempotent, never raises."""
        self.job.close()

    def __enter__(self) -> ParallelRuns:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- waiting ---------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> list[RunResult]:
        """Every run's :class:`RunResult`, in run order; raises :class:`TFParallelError` if a run failed.

        ``TimeoutError`` after ``timeout`` s, ``RuntimeError`` when stopped; the runs
        are torn down in every case, and on KeyboardInterrupt.
        """
        if self._results is not None:
            return self._results
        if self._spark_job is None:
            self.start()
        assert self._spark_job is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        looked = 0.0
        try:
            while True:
                view = self.state.snapshot()
                if view.state == state.C_FAILED or self._stop_reason is not None or self._spark_job.done:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    self.close()
                    msg = f"parallel runs {self.name} did not finish within {timeout:g} s and were stopped"
                    raise TimeoutError(msg)
                looked = self.state.wait_a_change(0.2, looked)
            return self._finish()
        except KeyboardInterrupt:
            self.close()
            raise

    def _finish(self) -> list[RunResult]:
        assert self._spark_job is not None
        if self._coordinated is not None:
            self.close()  # the state is a mirror: its final snapshot first, so the outcomes below write the last word
        if self.state.snapshot().state == state.C_FAILED:
            self.close()
            raise self._error()
        if self._stop_reason is not None:
            self.close()
            msg = f"parallel runs {self.name} were stopped ({self._stop_reason})"
            raise RuntimeError(msg)
        job = self._spark_job
        if job.error is not None:
            self.close()
            if self.state.snapshot().state == state.C_FAILED:
                raise self._error()
            msg = f"parallel runs {self.name} failed: {python_error_line(job.error)}"
            raise RuntimeError(msg) from None
        import cloudpickle

        outcomes: dict[int, tuple[dict[str, Any], bytes | None]] = {}
        for index, status, value in job.result():
            outcomes[int(index)] = (json.loads(status), value)
        results: list[RunResult] = []
        failed = False
        for i in range(self.num_runs):
            status, blob = outcomes.get(i, ({"ok": False, "error": "no result came back"}, None))
            if not status.get("ok"):
                failed = True
                self._controller.record_outcome(i, status, None)
                continue
            value = cloudpickle.loads(blob) if blob is not None else None
            self._controller.record_outcome(i, status, scalars(value))
            metrics = dict(self.state.nodes[i].metrics)  # its last reported metrics, updated with value's scalars
            results.append(RunResult(i, self.runs_args[i], value, metrics, status.get("host", ""),
                                     str(status.get("executor_id", "")), float(status.get("elapsed", 0.0))))
        if failed:
            self.close()
            raise self._error()
        self._results = results
        if self.tracking is not None:
            self.tracking.log_returned(results, self.state)
        self.close()
        return results

    def _error(self) -> TFParallelError:
        view = self.state.snapshot()
        n = first_failure(view)[0]
        params = self.params[n.index] if self.params and n is not None else None
        given = f" ({describe_args(params)})" if params else ""
        msg = failure_message(view, f"parallel runs {view.name}", given=given)
        return TFParallelError(msg, n, self.runs_args[n.index] if n is not None else None)

    # -- information -----------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.job.closed

    @property
    def results(self) -> list[RunResult] | None:
        """Every run's result once ``wait()`` returned them, else None."""
        return self._results

    def status(self, metric: str | None = None, mode: str | None = None) -> ParallelView:
        """A snapshot of the runs, with parameters and the best finished run by ``metric`` (default: ``start``'s)."""
        if metric is None and mode is None:
            return self.state.snapshot()
        return runs_view(self.state.snapshot(), self.state.params, metric or self.state.metric,
                          mode or self.state.mode)

    def logs(self, run: str | int | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """Output lines of one run (``"run:2"`` or its index) or of all; ``KeyError`` for an unknown run
        (as ``TFCluster.logs``)."""
        return self.state.logs_by_label(run, tail)

    def __repr__(self) -> str:
        return f"<tfos_nb parallel runs {self.name!r}: {self.state.snapshot().state}, {self.num_runs} run(s)>"


def start(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int | None = None,
    use_barrier: bool | None = True,
    *,
    per_run: bool = False,
    params: Sequence[Mapping[str, Any]] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    options: JobOptions | None = None,
    **given: Unpack[OptionKeywords],
) -> ParallelRuns:
    """Start the runs and return their :class:`ParallelRuns` at once (see :func:`run`).

    ``per_run=True``: ``tf_args`` is a list with one entry per run, of any type
    (a list of dicts always is).  ``params``: what the panel shows as each run's
    parameters (default: the run's dict of a grid).  ``metric``/``mode``: how the
    best run is picked (default: :func:`default_metric`, :func:`default_mode`).  Other keywords (or
    ``options=``): :class:`~tfos_nb.runtime.driver.options.JobOptions`' fields, as for ``TFCluster.run``
    (``num_gpus`` defaults to 1; ``stall_after``, ``node_output`` and ``preflight`` do not apply);
    ``mlflow``: a parent MLflow run and one child run per run (see :mod:`~tfos_nb.runtime.driver.tracking`).
    """
    options = JobOptions.of(options, **given)
    options.refuse("parallel runs", "stall_after", "node_output", "preflight", "resources")
    if mode not in (None, "max", "min"):
        msg = f"mode must be 'max' or 'min', got {mode!r}"
        raise ValueError(msg)
    sc = spark_context(sc)
    args, grid = runs_args(tf_args, num_executors, per_run)
    if params is not None:
        if len(params) != len(args):
            msg = f"params has {len(params)} entries for {len(args)} runs"
            raise ValueError(msg)
        grid = [dict(p) for p in params]
    facts = {"sc": sc, "tf_args": tf_args, "num_executors": num_executors, "per_run": per_run, "params": params}

    def start_runs(opts: JobOptions) -> ParallelRuns:
        runs = ParallelRuns(sc, map_fun, args, grid, opts, use_barrier=use_barrier, metric=metric, mode=mode)
        runs.job.announce(log_callback=opts.log_callback, on_state=opts.on_state, on_start=opts.on_start)
        return runs.start()

    return tracked_start("parallel", facts, options, start_runs)


def run(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int | None = None,
    use_barrier: bool | None = True,
    *,
    timeout: float | None = None,
    **given: Unpack[RunsKeywords],
) -> list[Any]:
    """Run ``map_fun(args, ctx)`` as ``num_executors`` independent single-node TensorFlow runs.

    ``tf_args`` is given to every run, or — a list of dicts — one dict per run
    (a hyper-parameter grid; ``num_executors`` may then be left out).  Returns
    one entry per run, in run order: what ``map_fun`` returned, or, when it
    returned ``None``, the last metrics it reported with ``ctx.report``.
    TensorFlowOnSpark's ``TFParallel.run`` returned nothing.

    With ``use_barrier=True`` (the default, as in TensorFlowOnSpark) the runs are
    one barrier stage (they start together) and fewer task slots than runs is a
    ``RuntimeError`` at once; ``use_barrier=False`` runs them in waves as slots
    free up; ``use_barrier=None`` picks: a barrier stage when it fits, else waves.  A run that
    raises stops the others and raises :class:`TFParallelError` (run, args,
    host, last output lines).  Keyword options: ``timeout``, and those of :func:`start` (``per_run``,
    ``params``, ``metric``/``mode``, and :class:`~tfos_nb.runtime.driver.options.JobOptions`' fields:
    ``name``, ``env``, ``keras``, ``num_gpus``, ``heartbeat_timeout``, ``seed``, ``log_callback``…).
    """
    runs = start(sc, map_fun, tf_args, num_executors, use_barrier, **given)
    try:
        return [r.result for r in runs.wait(timeout)]
    finally:
        runs.close()
