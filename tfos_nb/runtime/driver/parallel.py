"""Independent parallel runs: TensorFlowOnSpark's ``TFParallel`` — N single-node TensorFlow runs.

No cluster is formed between the runs: each is ``map_fun(args, ctx)`` in a
fresh process on an executor (see :mod:`..executor.run_task` for why a process),
for hyper-parameter sweeps and embarrassingly parallel inference.  All runs
are one Spark job, one task per run: a barrier stage when asked for and the
application has a slot per run (the runs start together), else a plain stage
whose tasks run in waves as slots free up.

The driver side reuses the cluster's pieces: the signed control server, the
heartbeat handling of :class:`~.controller.Controller` (output lines,
``ctx.report`` progress, lost runs) and the observable :class:`~.state.ClusterState`
(one node ``run:i`` per run), so ``%tfos_status``, ``%tfos_logs`` and the
notebook panel show runs like nodes.  A run that raises stops the others and
ends :meth:`ParallelRuns.wait` with one :class:`TFParallelError` naming the run,
its arguments, host and last output lines.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..executor.run_task import make_run_task
from ..protocol import messages as m
from ..protocol.channel import ControlServer
from . import state as S
from .cluster import TAIL_IN_ERRORS, TFClusterError, _python_error_line
from .controller import Controller
from .parallel_results import (
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
from .sparkjob import SparkJob
from .start import _driver_host, _start_listeners, _wait_for_slots, available_slots

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

    def __init__(self, message: str, node: S.NodeView | None = None, args: Any = None) -> None:
        super().__init__(message, node)
        self.run = node.index if node is not None else None
        self.run_args = args


# ---------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------



class _RunController(Controller):
    """The cluster controller's heartbeat handling; registration without cluster formation."""

    def _register(self, msg: m.Register) -> m.Reply:
        st = self.state
        reply = m.Reply(ok=True)
        with st.lock:
            node = self._node(msg.node)
            if node is None:
                return m.Reply(ok=False, error=f"no run {msg.node}")
            if st.kill_requested or st.state in (S.C_FAILED, S.C_STOPPED, S.C_FINISHED):
                return m.Reply(ok=False, error=f"runs {st.state}: {node.label} not started")
            if node.state != S.PENDING:
                error = f"{node.label} was started twice (Spark retried its task: executor lost?); runs are not retried"
                self._fail(error)
                reply = m.Reply(ok=False, error=error)
            else:
                node.state = S.STARTING
                node.host, node.pid, node.executor_id = msg.host, msg.pid, msg.executor_id
                node.working_dir = msg.working_dir
                node.gpus = list(msg.gpus)
                node.last_heartbeat = time.monotonic()
                if st.state == S.C_RESERVING:
                    st.state = S.C_RUNNING
        st.notify()
        return reply


def _fixed_slots(sc: Any) -> int | None:
    """Task slots of a master whose size is in its name (local-cluster[N,C,M], local[N])."""
    master = str(getattr(sc, "master", ""))
    match = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if match:
        return int(match.group(1)) * int(match.group(2))
    match = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    return int(match.group(1)) if match else None


def _can_gang_schedule(sc: Any, n: int) -> bool:
    """Whether a barrier stage of ``n`` tasks can start now (waits a little for executors to come up)."""
    if str(sc.getConf().get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return False  # Spark refuses barrier stages under dynamic allocation
    slots, _ = available_slots(sc)
    if slots >= n:
        return True
    fixed = _fixed_slots(sc)
    if fixed is not None and fixed < n:
        return False
    try:
        _wait_for_slots(sc, n, 60)
    except RuntimeError:
        return False
    return True


def _runs_args(tf_args: Any, num_executors: int | None, per_run: bool = False) -> tuple[list[Any], list[dict] | None]:
    """(args of each run, the grid's dicts or None): a list of dicts is a grid, one dict per run."""
    if per_run and not (isinstance(tf_args, (list, tuple)) and tf_args):
        msg = f"per_run=True needs a non-empty list of run arguments, got {type(tf_args).__name__}"
        raise ValueError(msg)
    is_grid = isinstance(tf_args, (list, tuple)) and len(tf_args) > 0 and all(isinstance(a, Mapping) for a in tf_args)
    is_grid = is_grid or per_run
    if num_executors is not None and (
        not isinstance(num_executors, int) or isinstance(num_executors, bool) or num_executors < 1
    ):
        msg = f"num_executors must be a positive integer (the number of runs), got {num_executors!r}"
        raise ValueError(msg)
    if is_grid:
        if num_executors is not None and num_executors != len(tf_args):
            msg = (
                f"tf_args is a list of {len(tf_args)} dicts (one per run) but num_executors={num_executors}: "
                "give one dict per run, or num_executors=None"
            )
            raise ValueError(msg)
        return list(tf_args), [dict(a) for a in tf_args] if all(isinstance(a, Mapping) for a in tf_args) else None
    if num_executors is None:
        msg = "num_executors (the number of runs) is needed unless tf_args is a list of dicts, one per run"
        raise ValueError(msg)
    return [tf_args] * num_executors, None


class ParallelRuns:
    """N independent runs on Spark executors (made by :func:`start`); owns their Spark job and control server.

    ``wait()`` returns the :class:`RunResult` of every run in order, or raises;
    ``stop()`` asks the runs to stop (from any thread); ``close()`` tears
    everything down (idempotent; also on KeyboardInterrupt in ``wait()`` and at
    interpreter exit).  ``status()`` is a live :class:`ParallelView`.
    """

    def __init__(self, sc: Any, map_fun: Callable[[Any, Any], Any], runs_args: list[Any], params: list[dict] | None,
                 *, name: str | None, env: dict[str, str] | None, keras: str, num_gpus: int,
                 use_barrier: bool | None, heartbeat_timeout: float, metric: str | None = None,
                 mode: str | None = None) -> None:
        import cloudpickle

        self.sc = sc
        self.num_runs = len(runs_args)
        self.runs_args = runs_args
        self.params = params
        self.use_barrier = use_barrier
        self.barrier = False
        self.cluster_id = uuid.uuid4().hex[:12]
        self.name = name or f"tfos-parallel-{self.cluster_id}"
        self.state = RunsState(self.cluster_id, self.name, self.num_runs, params, metric, mode)
        self.state.job_group = f"tfos-{self.cluster_id}"
        self._controller = _RunController(self.state, input_mode_spark=False, tensorboard=False, log_dir=None,
                                          num_gpus=num_gpus, heartbeat_timeout=heartbeat_timeout)
        secret = m.new_secret()
        self._codec_args = (secret, self.cluster_id)
        self._server: ControlServer | None = None
        self._blob = cloudpickle.dumps((map_fun, runs_args))
        self._meta: dict[str, Any] = {
            "cluster_id": self.cluster_id,
            "secret": secret.hex(),
            "num_runs": self.num_runs,
            "hb_interval": 0.5,
            "driver_timeout": max(heartbeat_timeout, 10.0),
            "env": dict(env or {}),
            "keras": keras,
            "num_gpus": num_gpus,
        }
        self._job: SparkJob | None = None
        self._stop_reason: str | None = None
        self._results: list[RunResult] | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        atexit.register(self._atexit)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> ParallelRuns:
        """Start the control server and the Spark job; returns at once (idempotent)."""
        if self._job is not None:
            return self
        sc = self.sc
        host = _driver_host(sc)
        secret, cid = self._codec_args
        server = ControlServer(m.Codec(secret, cid, "driver"), self._controller.handle, host,
                               on_tick=self._controller.tick)
        try:
            address = server.start()
        except OSError:
            server = ControlServer(m.Codec(secret, cid, "driver"), self._controller.handle, "0.0.0.0",
                                   on_tick=self._controller.tick)
            address = (host, server.start()[1])
        self._server = server
        try:
            default_fs = sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
        except Exception:  # noqa: BLE001
            default_fs = "file:///"
        self._meta.update(control=[address[0], address[1]], default_fs=default_fs, driver_pid=os.getpid())
        try:
            if self.use_barrier is None:  # auto (%%tfos_parallel): one barrier stage when it fits, else waves
                self.barrier = _can_gang_schedule(sc, self.num_runs)
                if not self.barrier:
                    log.info("tfos_nb: %d runs, fewer task slots: running them in waves, without a barrier stage",
                             self.num_runs)
            elif self.use_barrier:
                if not _can_gang_schedule(sc, self.num_runs):
                    slots, executors = available_slots(sc)
                    msg = (f"use_barrier=True runs the {self.num_runs} runs as one barrier stage, which needs "
                           f"{self.num_runs} task slots; this Spark application has {slots} on {executors} "
                           "executor(s). Pass use_barrier=False to run them in waves, or give Spark more executors.")
                    raise RuntimeError(msg)
                self.barrier = True
            else:
                self.barrier = False
            task = make_run_task(self._meta, self._blob, self.barrier)
            n, barrier = self.num_runs, self.barrier

            def action() -> list:
                rdd = sc.parallelize(range(n), n)
                return (rdd.barrier() if barrier else rdd).mapPartitions(task).collect()

            # One job; named like a cluster's launch job so the panel's Spark progress finds it.
            self._job = SparkJob(sc, f"{self.state.job_group}-launch", f"tfos_nb {self.name}: {n} parallel runs",
                                 action)
            self._job.start()
        except BaseException:
            self.close()
            raise
        return self

    def stop(self, reason: str = "stopped") -> None:
        """Ask the runs to stop now, from any thread; ``wait()`` then tears down and raises."""
        with self.state.lock:
            if self._stop_reason is None and self._results is None:
                self._stop_reason = reason
        self.state.notify()

    def close(self) -> None:
        """Stop every run, cancel the Spark job, stop the control server; idempotent, never raises."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._teardown()
            finally:
                atexit.unregister(self._atexit)

    def _teardown(self) -> None:
        st = self.state
        try:
            with st.lock:
                st.kill_requested = True
                st.stop_requested = True
            job = self._job
            if job is not None and not job.done:
                deadline = time.monotonic() + STOP_WAIT_S
                while time.monotonic() < deadline:  # runs get "kill" in their next heartbeat reply
                    if not [n for n in st.snapshot().nodes if n.state in (S.STARTING, S.RUNNING, S.REGISTERED)]:
                        break
                    with st.changed:
                        st.changed.wait(0.1)
                job.cancel(join_timeout=10)  # also drops runs still waiting for a slot
        finally:
            if self._server is not None:
                self._server.stop()
            with st.lock:
                for n in st.nodes:
                    if n.state not in S.TERMINAL:
                        n.state = S.STOPPED
                final = S.C_FINISHED if all(n.state == S.FINISHED for n in st.nodes) else S.C_STOPPED
            st.set_cluster_state(final)

    def _atexit(self) -> None:
        self.close()

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
        if self._job is None:
            self.start()
        assert self._job is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                view = self.state.snapshot()
                if view.state == S.C_FAILED or self._stop_reason is not None or self._job.done:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    self.close()
                    msg = f"parallel runs {self.name} did not finish within {timeout:g} s and were stopped"
                    raise TimeoutError(msg)
                with self.state.changed:
                    self.state.changed.wait(0.2)
            return self._finish()
        except KeyboardInterrupt:
            self.close()
            raise

    def _finish(self) -> list[RunResult]:
        assert self._job is not None
        if self.state.snapshot().state == S.C_FAILED:
            self.close()
            raise self._error()
        if self._stop_reason is not None:
            self.close()
            msg = f"parallel runs {self.name} were stopped ({self._stop_reason})"
            raise RuntimeError(msg)
        job = self._job
        if job.error is not None:
            self.close()
            if self.state.snapshot().state == S.C_FAILED:
                raise self._error()
            msg = f"parallel runs {self.name} failed: {_python_error_line(job.error)}"
            raise RuntimeError(msg) from None
        import cloudpickle

        outcomes: dict[int, tuple[dict, bytes | None]] = {}
        for index, status, value in job.result():
            outcomes[int(index)] = (json.loads(status), value)
        results: list[RunResult] = []
        st = self.state
        failed = False
        for i in range(self.num_runs):
            status, blob = outcomes.get(i, ({"ok": False, "error": "no result came back"}, None))
            node = st.nodes[i]
            report = status.get("report") or {}
            with st.lock:
                node.host = node.host or status.get("host", "")
                node.executor_id = node.executor_id or status.get("executor_id", "")
                if report:
                    st.update_progress(node, report)
                if not status.get("ok"):
                    failed = True
                    if node.state != S.FAILED:
                        node.state = S.FAILED
                        node.error = node.error or status.get("error") or "failed"
                        node.tail = node.tail or list(status.get("tail") or [])
                    self._controller._fail(f"{node.label} failed")
                    continue
            value = cloudpickle.loads(blob) if blob is not None else None
            metrics = dict(node.metrics)
            metrics.update(scalars(value))
            with st.lock:
                node.metrics.update(scalars(value))
                node.state = S.FINISHED
            results.append(RunResult(i, self.runs_args[i], value, metrics, status.get("host", ""),
                                     str(status.get("executor_id", "")), float(status.get("elapsed", 0.0))))
        st.notify()
        if failed:
            self.close()
            raise self._error()
        self._results = results
        self.close()
        return results

    def _error(self) -> TFParallelError:
        view = self.state.snapshot()
        failed = [n for n in view.nodes if n.state == S.FAILED]
        # The first run that failed on its own is the cause; lost runs come last.
        failed.sort(key=lambda n: (n.error is None or "no heartbeat" in (n.error or ""), n.index))
        if not failed:
            return TFParallelError(f"parallel runs {view.name} failed: {view.error or 'unknown error'}")
        n = failed[0]
        params = self.params[n.index] if self.params else None
        given = f" ({describe_args(params)})" if params else ""
        msg = f"{n.label}{given} failed on host {n.host or '?'} (executor {n.executor_id or '?'}): {n.error or 'unknown error'}"
        tail = [line for line in n.tail if line.strip()][-TAIL_IN_ERRORS:]
        if tail:
            msg += f"\n--- last {len(tail)} lines of {n.label}'s output ---\n" + "\n".join(tail)
        others = [o.label for o in failed[1:]]
        if others:
            msg += f"\n(also failed: {', '.join(others)})"
        return TFParallelError(msg, n, self.runs_args[n.index])

    # -- information -----------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._closed

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

    def logs(self, run: int | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """Output lines of one run (by index) or of all."""
        return {n.label: self.state.logs(n.index, tail) for n in self.state.nodes if run in (None, n.index)}

    def __repr__(self) -> str:
        return f"<tfos_nb parallel runs {self.name!r}: {self.state.snapshot().state}, {self.num_runs} run(s)>"


def start(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int | None = None,
    use_barrier: bool | None = True,
    *,
    name: str | None = None,
    env: dict[str, str] | None = None,
    keras: str = "tf_keras",
    num_gpus: int = 1,
    heartbeat_timeout: float = 10.0,
    log_callback: Callable[[str, list[str]], None] | None = None,
    on_state: Callable[[S.ClusterState], None] | None = None,
    per_run: bool = False,
    params: Sequence[Mapping[str, Any]] | None = None,
    metric: str | None = None,
    mode: str | None = None,
) -> ParallelRuns:
    """Start the runs and return their :class:`ParallelRuns` at once (see :func:`run`).

    ``per_run=True``: ``tf_args`` is a list with one entry per run, of any type
    (a list of dicts always is).  ``params``: what the panel shows as each run's
    parameters (default: the run's dict of a grid).  ``metric``/``mode``: how the
    best run is picked (default: :func:`default_metric`, :func:`default_mode`).
    """
    if mode not in (None, "max", "min"):
        msg = f"mode must be 'max' or 'min', got {mode!r}"
        raise ValueError(msg)
    if getattr(sc, "_jsc", None) is None:
        msg = (
            "tfos_nb needs a classic SparkContext (RDDs); this session has none (Spark Connect?). "
            "Use a cluster with a full Spark driver."
        )
        raise TypeError(msg)
    if keras not in ("tf_keras", "keras3"):
        msg = f"keras must be 'tf_keras' or 'keras3', got {keras!r}"
        raise ValueError(msg)
    runs_args, grid = _runs_args(tf_args, num_executors, per_run)
    if params is not None:
        if len(params) != len(runs_args):
            msg = f"params has {len(params)} entries for {len(runs_args)} runs"
            raise ValueError(msg)
        grid = [dict(p) for p in params]
    runs = ParallelRuns(sc, map_fun, runs_args, grid, name=name, env=env, keras=keras, num_gpus=num_gpus,
                        use_barrier=use_barrier, heartbeat_timeout=heartbeat_timeout, metric=metric, mode=mode)
    if log_callback is not None:
        runs.state.add_log_listener(log_callback)
    if on_state is not None:
        runs.state.add_listener(on_state)
    for listener in list(_start_listeners):  # e.g. the notebook's panel for runs started by a Python call
        try:
            listener(runs.state)
        except Exception:  # noqa: BLE001 - a UI bug must not stop the runs from starting
            pass
    return runs.start()


def run(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int | None = None,
    use_barrier: bool | None = True,
    *,
    timeout: float | None = None,
    **kwargs: Any,
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
    host, last output lines).  Keyword options: ``name``, ``env`` (environment
    of every run, e.g. TensorFlow's thread counts), ``keras`` (``"tf_keras"``,
    the default, or ``"keras3"``), ``num_gpus``, ``timeout``,
    ``heartbeat_timeout``, ``log_callback(label, lines)``, ``on_state(state)``,
    ``per_run`` (``tf_args`` lists one entry per run, of any type), ``params``,
    ``metric``/``mode`` (how the panel picks the best run).
    """
    runs = start(sc, map_fun, tf_args, num_executors, use_barrier, **kwargs)
    try:
        return [r.result for r in runs.wait(timeout)]
    finally:
        runs.close()
