"""The handle a ``%%tfos_cluster`` cell leaves in the notebook (a :class:`~._run_handle.RunHandle`).

Its thread starts the cluster, feeds the data and waits for the end, in the
runtime's retry loop (``retry.attempts``, each attempt one ``retry.Attempts.once``, as
``run_job``'s), which starts the cluster again after a node failure (``--retries``).  Every call that
cancels, stops or closes the driver's cluster is in ``_on_start``, ``_cancel_start``, ``_stop_job`` and
``_close_cluster`` (the seams to the driver's job API).  Nothing here imports IPython.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from ..runtime import step_time
from ..runtime.driver import retry
from ..runtime.driver.cluster import InputMode, TFCluster, TFClusterError
from ..runtime.driver.control import stacks, state
from ..runtime.driver.launch import start
from ..runtime.driver.options import ClusterShape, JobOptions, RetryPolicy, StartOptions, Training
from ._run_handle import RunFailed, RunHandle, first_line

__all__ = ["ClusterFailed", "ClusterHandle"]


class ClusterFailed(RunFailed):
    """A cell's cluster failed and was torn down.

    IPython shows it as the node's error alone (role:index, host, the tail of its
    output), without the frames of the magic and the runtime, which would only
    bury the one part the user can act on.
    """

    wraps = TFClusterError
    shown_as = "TFClusterError"
    prefix = "cluster {name}"


class ClusterHandle(RunHandle):
    """A cluster started by ``%%tfos_cluster``: watch it, wait for it, stop it.

    ``wait()`` blocks until the run ends and re-raises a node's error;
    ``shutdown()`` stops the cluster now; ``result`` is a dict (state, metrics
    and step per node, ``last_feed``, elapsed seconds, error, the chief's
    ``value``); ``value`` is what the chief's function returned, ``history``
    every reported metric (a pandas DataFrame); ``nodes``,
    ``metrics``, ``tensorboard_url`` and ``state`` show it live; ``logs()``
    (per node) and ``output`` (all nodes, interleaved) give the nodes' output.
    """

    error_type = ClusterFailed
    _STILL = "cluster {name} is still {state} after {timeout:g} s"
    _REPR = "<tfos_nb cluster {name!r}: {state}, {n} node(s){extra}>"

    def __init__(
        self,
        name: str,
        *,
        sc: Any,
        fn: Any,
        args: Any,
        shape: ClusterShape,
        options: JobOptions | None = None,
        policy: RetryPolicy | None = None,
        data: Any = None,
        epochs: int = 1,
        validation: Any = None,
        tensorboard: bool = False,
        log_dir: str | None = None,
        evaluator_grace: float = 30.0,
        timeout: float | None = None,
        background: bool = False,
        start_cluster: Callable[..., TFCluster] = start.start_cluster,
        clock: Callable[[], float] = time.time,
        tracking: Any = None,
    ) -> None:
        super().__init__(name, sc=sc, num_nodes=shape.num_nodes, timeout=timeout, background=background, clock=clock,
                         tracking=tracking)
        self.policy = policy if policy is not None else RetryPolicy()
        self.attempt = 1  # 2, 3, … after a node failure started the cluster again (--retries)
        self.failures: list[str] = []  # first line of each failed attempt's error
        self._shape = shape
        # the handle shows the nodes' lines itself (the cell's stream, ``output``, ``logs()``): no node_output
        self._options = JobOptions.of(options, name=name, node_output=False, log_callback=self._on_log,
                                      on_state=self._on_state, on_start=self._on_start)
        self._launch = StartOptions(tensorboard=tensorboard,
                                    input_mode=InputMode.SPARK if data is not None else InputMode.TENSORFLOW,
                                    log_dir=log_dir, reservation_timeout=min(timeout, 600) if timeout else 600)
        # after the chief/workers finished: the evaluator's time to evaluate the last checkpoint (shutdown's grace)
        self._training = Training(data=data, num_epochs=epochs, feed_timeout=timeout or 600,
                                  validation=validation,  # fed once as the named set "validation"
                                  grace_secs=float(evaluator_grace) if shape.evaluator else 0.0,
                                  shutdown_timeout=timeout or 259200)
        self._start = start_cluster  # tfos_nb.runtime.driver.launch.start.start_cluster, or a test's fake
        self._fn, self._args = fn, args
        self._timer: threading.Timer | None = None
        self._stalled_at_timeout = ""  # the stall flags when the timeout stopped the job (its message says them)
        self._stopper: threading.Thread | None = None
        self._cluster: TFCluster | None = None
        self._live: TFCluster | None = None  # the attempt's cluster until the handle's thread tore it down
        self._cstate: state.ClusterState | None = None
        self._starting: Any = None  # the start in progress (run()'s on_start), cancellable from any thread
        self._states: list[tuple[int, state.ClusterState]] = []  # (attempt, its cluster state), for history

    # -- the job: every call into the driver's cluster ------------------------------------
    def _on_start(self, job: Any) -> None:
        """run()'s start hook: the start in progress, which ``job.cancel(reason)`` stops from any thread."""
        with self._lock:
            self._starting = job
            reason = self._stop_reason
        if reason is not None:
            job.cancel(reason)

    def _cancel_start(self, reason: str) -> None:
        """Stop a cluster whose start has not returned yet (idempotent; a start not begun yet is
        cancelled by ``_on_start`` as it begins)."""
        with self._lock:
            job = self._starting
        if job is not None:
            job.cancel(reason)

    def _stop_job(self, reason: str) -> None:
        with self._lock:
            cluster = self._cluster
            if cluster is not None and self._stopper is None:
                self._stopper = threading.Thread(target=self._close_cluster, args=(cluster,),
                                                 name=f"tfos-stop-{self.name}", daemon=True)
                self._stopper.start()
        if cluster is None:
            self._cancel_start(reason)

    @staticmethod
    def _close_cluster(cluster: TFCluster) -> None:
        """Kill the cluster's nodes and close its server (returns at once while another thread does it)."""
        cluster.close()

    def _close_job(self) -> None:
        if self._live is not None:
            self._close_cluster(self._live)
        with self._lock:
            stopper = self._stopper
        if stopper is not None:
            stopper.join(30)  # close() returns at once while another thread is still tearing down

    # -- the handle's thread --------------------------------------------------------------
    def _run_job(self) -> None:
        if self.timeout:
            self._timer = threading.Timer(self.timeout, self._time_out)
            self._timer.daemon = True
            self._timer.start()
        if self._stop_reason is None:  # the runtime's retry loop, with this handle's attempt, stop and log line
            # every attempt logs into the job's one run; untracked, as the cell decided on its own thread (where an
            # active MLflow run is seen), not as this thread would
            job = retry.Attempts(self._sc, self._fn, self._args, self._shape, self._options, self._training,
                                 self.policy, start=self._start, tracking=self.tracking, launch=self._launch)
            try:
                self._live, _ = retry.attempts(functools.partial(self._attempt, job), self.policy.retries,
                                               failures=self.failures, on_retry=self._on_retry,
                                               stopped=lambda: self._stop_reason is not None)
            finally:
                job.close()

    def _time_out(self) -> None:
        self._stalled_at_timeout = self.stalled_now()  # where the job was stuck, before the stop clears it
        self.stop("timeout")

    def _on_retry(self, attempt: int, exc: TFClusterError) -> None:
        self._on_log("tfos", [f"{first_line(exc)}; starting again (attempt {attempt} of {self.policy.retries + 1})"])

    def _attempt(self, job: retry.Attempts, attempt: int) -> TFCluster:
        """One start → train → shutdown (:meth:`retry.Attempts.once`); the cluster is kept in ``_cluster`` for
        stop()."""
        with self._lock:
            self._cluster = None
            self.attempt = attempt
        return job.once(attempt, on_cluster=self._hold, on_resume=self._resumed)

    def _hold(self, cluster: TFCluster) -> bool:
        """The attempt's cluster runs: keep it for stop(); False when the handle was stopped meanwhile."""
        with self._lock:
            self._cluster = cluster
            return self._stop_reason is None

    def _resumed(self, attempt: int, said: str) -> None:
        self._on_log("tfos", [f"attempt {attempt} resumes {said}"])

    def _finished(self) -> None:
        if self._stop_reason == "timeout":
            self._error = TimeoutError(f"did not finish within {self.timeout:g} s and was torn down"
                                       f"{self._stalled_at_timeout}")
        if self._timer is not None:
            self._timer.cancel()
        self._result = self._make_result(ended=True)

    def _on_state(self, st: state.ClusterState) -> None:
        if self._cstate is None or (st is not self._cstate and self._cluster is None):
            self._cstate = st
            with self._lock:
                self._states.append((self.attempt, st))
        super()._on_state(st)

    # -- information -------------------------------------------------------------
    @property
    def cluster(self) -> TFCluster | None:
        """The runtime's TFCluster, once its nodes run."""
        return self._cluster

    def status(self) -> state.ClusterView | None:
        st = self._cstate
        return st.snapshot() if st is not None else None

    def stacks(self, node: str | None = None, timeout: float = 10.0) -> dict[str, str]:
        """Every thread's Python stack in the running cluster's node processes (``%tfos_stack``), by node.

        ``RuntimeError`` when no cluster runs now (not started yet, or ended); ``KeyError`` for an unknown node.
        """
        with self._lock:  # the attempt's cluster while it runs (``_live`` is only set once its shutdown returned)
            cluster, job = self._cluster, self._starting
        live = cluster is not None and not cluster.closed
        starting = cluster is None and job is not None and not job.closed  # its start has not returned yet
        if not (live or starting):
            msg = f"cluster {self.name} is {self.state}: no node process to show"
            raise RuntimeError(msg)
        try:
            if cluster is not None:
                return cluster.stacks(node, timeout)
            return stacks.collect(job.state, job.controller, node, timeout)
        except KeyError:
            raise KeyError(self._no_node(str(node))) from None

    def _node_logs(self, tail: int | None) -> dict[str, list[str]] | None:
        st = self._cstate
        return None if st is None else {n.label: st.logs(n.index, tail) for n in st.nodes}

    def _no_node(self, node: str) -> str:
        st = self._cstate
        return f"no node {node!r} in {self.name}; nodes: {', '.join(n.label for n in st.nodes) if st else ''}"

    @property
    def tensorboard_url(self) -> str | None:
        st = self._cstate
        return st.tensorboard() if st is not None else None  # the chief's address, not a snapshot of every node

    @property
    def result(self) -> dict[str, Any]:
        """state, per-node metrics and steps, last_feed, elapsed and error (final once the run ended)."""
        return self._result if self._result is not None else self._make_result(ended=False)

    @property
    def history(self) -> Any:
        """Every metric each node reported, one row per ``ctx.report`` (a pandas DataFrame).

        Columns ``node`` (``role:index``), ``role``, ``index``, ``attempt``, ``step``,
        ``time`` (seconds since the run started, by the node's clock), then one column
        per metric (NaN where a report lacks it), then where the node's time went over
        the last few seconds, as the panel showed it then: ``time_input``,
        ``time_compute``, ``time_peers``, ``time_other`` (fractions summing to 1; NaN
        before training began; while a node is stuck inside a step its clocks still arrive
        each second, so the next report's columns count that time).  Like Ray Train's
        ``Result.metrics_dataframe``; e.g.
        ``h.history.pivot_table(index="step", columns="node", values="loss").plot()``.
        Rows so far while the run goes on.  Kept: the chief's last 100,000 reports, and
        on a cluster of more than 4 nodes each other node's last share of 300,000 (512
        nodes: 587 each) but at least 500, so the history of 512 nodes stays near 260 MB
        and of 1,024 near 400 MB.
        """
        import pandas as pd

        with self._lock:
            states = list(self._states)
        rows, metric_names = [], {}
        fixed = ("node", "role", "index", "attempt", "step", "time")
        shares_columns = [f"time_{c}" for c in step_time.CATEGORIES]
        for attempt, st in states:
            windows: dict[int, step_time.Window] = {}
            for role, index, node, t, step, metrics, totals in st.history_with_times():
                shares = windows.setdefault(node, step_time.Window()).add(totals) if totals is not None else None
                if step is None and not metrics:
                    continue  # a node's clocks alone (state.record_tick): in the next report's time columns
                metric_names.update(dict.fromkeys(k for k in metrics if k not in shares_columns))
                row = {**metrics, "node": f"{role}:{index}", "role": role, "index": index, "attempt": attempt,
                       "step": step, "time": None if t is None else t - self.started_at}
                rows.append({**row, **{f"time_{c}": v for c, v in (shares or {}).items()}})
        columns = [*fixed, *(k for k in metric_names if k not in fixed), *shares_columns]
        frame = pd.DataFrame(rows, columns=columns)
        frame["step"] = frame["step"].astype("Int64")
        return frame.sort_values(["attempt", "node", "time"], kind="stable", ignore_index=True)

    @property
    def values(self) -> dict[str, Any]:
        """What each node's function returned, by ``role:index`` (plain data only; nodes that returned None left out)."""
        st = self._cstate
        return st.values() if st is not None else {}

    @property
    def value(self) -> Any:
        """What the chief's function returned (the cell's ``return``), once it finished; None before or if nothing.

        Only plain data comes back (numbers, strings, lists, dicts, numpy values, up to
        256 KiB) — as TorchDistributor returns rank 0's value; save models to files.
        """
        st = self._cstate
        if st is None:
            return None
        chief = next((n.label for n in st.nodes if n.job_name in ("chief", "master")), "worker:0")
        return st.values().get(chief)

    def _make_result(self, ended: bool) -> dict[str, Any]:
        view = self.status()
        nodes = view.nodes if view is not None else ()
        return {
            "name": self.name,
            "state": self._state_now(ended),
            "elapsed": view.elapsed if view is not None else self._clock() - self.started_at,
            "metrics": {n.label: dict(n.metrics) for n in nodes},
            "steps": {n.label: n.step for n in nodes},
            "last_feed": dict(self._cluster.last_feed) if self._cluster is not None else {},
            "stopped": self._stop_reason,
            "attempts": self.attempt,
            "failures": list(self.failures),
            "error": None if self._error is None else str(self._error).splitlines()[0],
            "value": self.value,
        }
