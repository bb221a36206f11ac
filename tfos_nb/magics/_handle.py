"""The handle a ``%%tfos_cluster`` cell leaves in the notebook, and the thread it owns.

One cell's whole run (start the nodes, feed the data, wait for the end) happens
in one thread owned by the handle.  A blocking cell watches that thread from the
kernel's main thread (where KeyboardInterrupt lands and where output may be
printed); a ``--background`` cell just returns the handle.  Nothing here
imports IPython.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import deque
from typing import Any

from ..runtime.driver import state as S
from ..runtime.driver.cluster import InputMode, TFCluster, TFClusterError
from ..runtime.driver.start import run
from ._quiet import quiet_lines

__all__ = ["ClusterFailed", "ClusterHandle"]

LOG_LINES_KEPT = 5000


def marked_failed(view: Any, done: bool, error: BaseException | None) -> Any:
    """A finished run's view (cluster or parallel runs) marked failed with ``error``'s first line, if it failed."""
    if view is not None and done and error is not None and view.state != S.C_FAILED:
        first = (str(error).splitlines() or [type(error).__name__])[0]
        view = dataclasses.replace(view, state=S.C_FAILED, error=view.error or first)
    return view


class ClusterFailed(TFClusterError):
    """A cell's cluster failed and was torn down.

    IPython shows it as the node's error alone (role:index, host, the tail of its
    output), without the frames of the magic and the runtime, which would only
    bury the one part the user can act on.
    """

    @classmethod
    def wrap(cls, exc: BaseException, name: str) -> ClusterFailed:
        if isinstance(exc, ClusterFailed):
            return exc
        if isinstance(exc, TFClusterError):
            new = cls(str(exc))
            new.node, new.host, new.executor_id = exc.node, exc.host, exc.executor_id
            new.exit_code, new.tail = exc.exit_code, list(exc.tail)
        else:
            new = cls(f"cluster {name}: {type(exc).__name__}: {exc}")
        new.__cause__ = exc
        return new

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        # the node's last lines without TensorFlow's native start-up noise (str(self) keeps them all)
        return [f"\x1b[0;31mTFClusterError\x1b[0m: {lines[0]}", *quiet_lines(lines[1:])]


class ClusterHandle:
    """A cluster started by ``%%tfos_cluster``: watch it, wait for it, stop it.

    ``wait()`` blocks until the run ends and re-raises a node's error;
    ``shutdown()`` stops the cluster now; ``result`` is a dict (state, metrics
    and step per node, ``last_feed``, elapsed seconds, error, the chief's
    ``value``); ``value`` is what the chief's function returned, ``history``
    every reported metric (a pandas DataFrame); ``nodes``,
    ``metrics``, ``tensorboard_url`` and ``state`` show it live; ``logs()``
    (per node) and ``output`` (all nodes, interleaved) give the nodes' output.
    """

    def __init__(
        self,
        name: str,
        *,
        sc: Any,
        fn: Any,
        args: Any,
        workers: int,
        ps: int = 0,
        evaluator: bool = False,
        data: Any = None,
        epochs: int = 1,
        tensorboard: bool = False,
        log_dir: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        background: bool = False,
        retries: int = 0,
    ) -> None:
        self.name = name
        self.retries = retries
        self.attempt = 1  # 2, 3, … after a node failure started the cluster again (--retries)
        self.failures: list[str] = []  # first line of each failed attempt's error
        self.background = background
        self.num_nodes = workers + ps + (1 if evaluator else 0)
        self._run_kwargs = dict(
            num_ps=ps,
            tensorboard=tensorboard,
            input_mode=InputMode.SPARK if data is not None else InputMode.TENSORFLOW,
            log_dir=log_dir,
            master_node="chief",
            eval_node=evaluator,
            reservation_timeout=min(timeout, 600) if timeout else 600,
            name=name,
            env=env,
        )
        self._sc, self._fn, self._args, self._data, self._epochs = sc, fn, args, data, epochs
        self.timeout = timeout
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self._stopper: threading.Thread | None = None
        self._cluster: TFCluster | None = None
        self._cstate: S.ClusterState | None = None
        self._starting: Any = None  # the start in progress (its cancel(reason)), from run()'s on_start
        self._stop_reason: str | None = None
        self._error: BaseException | None = None
        self._result: dict[str, Any] | None = None
        self._log: deque[str] = deque(maxlen=LOG_LINES_KEPT)
        self.lines: queue.SimpleQueue[list[str]] | None = None if background else queue.SimpleQueue()
        self.started_at = time.time()
        self._observers: list[Any] = []
        self._states: list[tuple[int, S.ClusterState]] = []  # (attempt, its cluster state), for history

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> ClusterHandle:
        with self._lock:
            if self._thread is not None:
                return self
            self._thread = threading.Thread(target=self._main, name=f"tfos-cell-{self.name}", daemon=True)
        if self.timeout:
            self._timer = threading.Timer(self.timeout, self.stop, args=("timeout",))
            self._timer.daemon = True
            self._timer.start()
        self._thread.start()
        return self

    def _main(self) -> None:
        cluster = None
        try:
            while self._stop_reason is None:
                try:
                    cluster = self._attempt()
                    break
                except TFClusterError as exc:
                    if self._stop_reason is not None or self.attempt > self.retries:
                        raise
                    if cluster is not None:
                        cluster.close()
                        cluster = None
                    first = (str(exc).splitlines() or [type(exc).__name__])[0]
                    self.failures.append(first)
                    self.attempt += 1
                    self._on_log("tfos", [f"{first}; starting again (attempt {self.attempt} of {self.retries + 1})"])
        except BaseException as exc:  # noqa: BLE001 - handed to wait() / the cell
            if self._stop_reason is None:
                self._error = exc
        finally:
            if cluster is not None:
                cluster.close()
            with self._lock:
                stopper = self._stopper
            if stopper is not None:
                # close() returns at once while another thread is still tearing down
                stopper.join(30)
            if self._stop_reason == "timeout":
                self._error = TimeoutError(f"did not finish within {self.timeout:g} s and was torn down")
            if self._timer is not None:
                self._timer.cancel()
            self._result = self._make_result()
            # observers first (the panel's final state, the TensorBoard route withdrawn): once wait() or
            # shutdown() returns, they have run
            self._tell_observers(final=True)
            self._done.set()

    def _attempt(self) -> TFCluster:
        """One start → train → shutdown; the cluster is kept in ``_cluster`` for stop()."""
        kwargs = dict(self._run_kwargs)
        kwargs["env"] = dict(kwargs.get("env") or {}, TFOS_ATTEMPT=str(self.attempt))
        with self._lock:
            self._cluster = None
        cluster = run(self._sc, self._fn, self._args, self.num_nodes, log_callback=self._on_log,
                      on_state=self._on_state, on_start=self._on_start, **kwargs)
        with self._lock:
            self._cluster = cluster
            stopping = self._stop_reason is not None
        try:
            if not stopping:
                if self._data is not None:
                    cluster.train(self._data, self._epochs, feed_timeout=self.timeout or 600)
                cluster.shutdown(timeout=self.timeout or 259200)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _on_state(self, st: S.ClusterState) -> None:
        if self._cstate is None or (st is not self._cstate and self._cluster is None):
            self._cstate = st
            with self._lock:
                self._states.append((self.attempt, st))
        self._tell_observers(final=False)

    def add_observer(self, fn: Any) -> None:
        """Call ``fn(view, final)`` on every state change (control-server thread) and once at the end.

        For a --background cell's panel: observers must be quick and must not print
        (output from another thread lands in whatever cell runs then).
        """
        with self._lock:
            self._observers.append(fn)

    def _tell_observers(self, final: bool) -> None:
        with self._lock:
            observers = list(self._observers)
        if not observers:
            return
        view = marked_failed(self.status(), True, self._error) if final else self.status()
        if view is None:
            return
        for fn in observers:
            try:
                fn(view, final)
            except Exception:  # noqa: BLE001 - a UI bug must not break the run
                pass

    def _on_start(self, job: Any) -> None:
        """run()'s start hook: ``job.cancel(reason)`` stops a start in progress (from stop(), any thread)."""
        with self._lock:
            self._starting = job
            reason = self._stop_reason
        if reason is not None:
            job.cancel(reason)

    def _on_log(self, label: str, lines: list[str]) -> None:
        tagged = [f"[{label}] {line}" for line in lines]
        self._log.extend(tagged)
        if self.lines is not None:
            self.lines.put(tagged)

    def stop(self, reason: str = "shut down") -> None:
        """Stop the cluster now (kill its nodes), from any thread; returns at once."""
        with self._lock:
            if self._done.is_set():
                return
            if self._stop_reason is None:
                self._stop_reason = reason
            cluster, starting = self._cluster, self._starting
            if cluster is not None and self._stopper is None:
                self._stopper = threading.Thread(target=cluster.close, name=f"tfos-stop-{self.name}", daemon=True)
                self._stopper.start()
        if cluster is None and starting is not None:
            starting.cancel(self._stop_reason or reason)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the run's thread to end; True if it did."""
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the cluster has finished; returns ``result``, re-raises a node's error."""
        if not self._done.wait(timeout):
            msg = f"cluster {self.name} is still {self.state} after {timeout:g} s"
            raise TimeoutError(msg)
        if self._error is not None:
            raise ClusterFailed.wrap(self._error, self.name) from None
        assert self._result is not None
        return self._result

    def shutdown(self, timeout: float = 30.0) -> dict[str, Any] | None:
        """Stop the cluster now and wait (up to ``timeout`` s) until its nodes are gone."""
        if self._thread is None:
            return None
        self.stop("shut down")
        self._done.wait(timeout)
        return self._result

    # -- information -------------------------------------------------------------
    @property
    def error(self) -> BaseException | None:
        """What ended the run, if it failed."""
        return self._error

    @property
    def sc(self) -> Any:
        """The SparkContext the cluster runs on."""
        return self._sc

    @property
    def cluster(self) -> TFCluster | None:
        """The runtime's TFCluster, once its nodes run."""
        return self._cluster

    def status(self) -> S.ClusterView | None:
        st = self._cstate
        return st.snapshot() if st is not None else None

    def final_status(self) -> S.ClusterView | None:
        """``status()``, marked failed when the run ended in an error the nodes' states do not show."""
        return marked_failed(self.status(), self._done.is_set(), self._error)

    @property
    def state(self) -> str:
        """starting, reserving, running, finished, failed or stopped."""
        if self._done.is_set():
            assert self._result is not None
            return self._result["state"]
        view = self.status()
        return view.state if view is not None else "starting"

    @property
    def nodes(self) -> tuple[S.NodeView, ...]:
        view = self.status()
        return view.nodes if view is not None else ()

    @property
    def metrics(self) -> dict[str, dict[str, Any]]:
        """The last metrics each node reported, by ``role:index``."""
        return {n.label: dict(n.metrics) for n in self.nodes}

    @property
    def tensorboard_url(self) -> str | None:
        view = self.status()
        return view.tensorboard if view is not None else None

    @property
    def result(self) -> dict[str, Any]:
        """state, per-node metrics and steps, last_feed, elapsed and error (final once the run ended)."""
        return self._result if self._result is not None else self._make_result()

    @property
    def history(self) -> Any:
        """Every metric each node reported, one row per ``ctx.report`` (a pandas DataFrame).

        Columns ``node`` (``role:index``), ``role``, ``index``, ``attempt``, ``step``,
        ``time`` (seconds since the run started, by the node's clock), then one column
        per metric (NaN where a report lacks it).  Like Ray Train's
        ``Result.metrics_dataframe``; e.g. ``h.history.pivot_table(index="step",
        columns="node", values="loss").plot()``.  Rows so far while the run goes on.
        """
        import pandas as pd

        with self._lock:
            states = list(self._states)
        rows, metric_names = [], {}
        for attempt, st in states:
            for role, index, _node, t, step, metrics in st.history():
                metric_names.update(dict.fromkeys(metrics))
                rows.append({**metrics, "node": f"{role}:{index}", "role": role, "index": index, "attempt": attempt,
                             "step": step, "time": None if t is None else t - self.started_at})
        columns = ["node", "role", "index", "attempt", "step", "time",
                   *(k for k in metric_names if k not in ("node", "role", "index", "attempt", "step", "time"))]
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

    @property
    def output(self) -> list[str]:
        """Every node's output lines so far, ``[role:index] line``, in arrival order (the last 5,000)."""
        return list(self._log)

    def logs(self, node: str | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """Output lines of one node (``"worker:0"``) or of every node."""
        st = self._cstate
        if st is None:
            return {}
        out = {n.label: st.logs(n.index, tail) for n in st.nodes if node in (None, n.label)}
        if node is not None and not out:
            msg = f"no node {node!r} in {self.name}; nodes: {', '.join(n.label for n in st.nodes)}"
            raise KeyError(msg)
        return out

    def _make_result(self) -> dict[str, Any]:
        view = self.status()
        if view is None:
            cluster_state = "starting" if not self._done.is_set() else ("failed" if self._error else "stopped")
        else:
            cluster_state = view.state
            if self._done.is_set() and self._error is not None:
                cluster_state = S.C_FAILED
        nodes = view.nodes if view is not None else ()
        return {
            "name": self.name,
            "state": cluster_state,
            "elapsed": view.elapsed if view is not None else time.time() - self.started_at,
            "metrics": {n.label: dict(n.metrics) for n in nodes},
            "steps": {n.label: n.step for n in nodes},
            "last_feed": dict(self._cluster.last_feed) if self._cluster is not None else {},
            "stopped": self._stop_reason,
            "attempts": self.attempt,
            "failures": list(self.failures),
            "error": None if self._error is None else str(self._error).splitlines()[0],
            "value": self.value,
        }

    def __repr__(self) -> str:
        view = self.status()
        extra = f", {view.elapsed:.1f} s" if view is not None else ""
        return f"<tfos_nb cluster {self.name!r}: {self.state}, {self.num_nodes} node(s){extra}>"
