"""What every magic's handle shares: one thread runs the job, the cell watches it.

A cell's whole run (start the job, wait for its end, close it) happens in one
thread owned by the handle.  A blocking cell watches that thread from the
kernel's main thread (where KeyboardInterrupt lands and where output may be
printed); a ``--background`` cell just returns the handle.

``RunHandle`` holds the part that is the same for a ``%%tfos_cluster``
cluster (:mod:`._cluster_handle`) and the runs of a ``%%tfos_parallel`` cell
(:mod:`._parallel_handle`): the thread, stop/shutdown/wait/join, the
observers (a --background panel), the nodes' output, the snapshot queries.
A subclass supplies the job: ``_run_job()`` (start it with ``_start_job()`` and
wait for its end, in the handle's thread), ``_stop_job(reason)`` (stop it from
any thread; a cluster still starting is cancelled), ``_close_job()`` (tear it
down), ``status()`` and ``_node_logs()``.  Every call that starts, cancels,
stops or closes the driver's job is in those few methods of the subclass.

``RunFailed`` is the magics' error family: a job's error shown as the node's
error alone (role:index, host, the tail of its output), without the frames of
the magic and the runtime.  Nothing here imports IPython.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from ..runtime.driver.cluster import TFClusterError
from ..runtime.driver.control import state as cluster_state
from ._quiet import quiet_lines

__all__ = ["LOG_LINES_KEPT", "RunFailed", "RunHandle", "first_line", "marked_failed"]

LOG_LINES_KEPT = 5000
# what a node's error carries (TFClusterError; TFParallelError adds run and run_args)
_ERROR_FIELDS = ("node", "host", "executor_id", "exit_code", "tail", "run", "run_args")


def first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def marked_failed(view: Any, done: bool, error: BaseException | None) -> Any:
    """A finished run's view (cluster or parallel runs) marked failed with ``error``'s first line, if it failed."""
    if view is not None and done and error is not None and view.state != cluster_state.C_FAILED:
        view = dataclasses.replace(view, state=cluster_state.C_FAILED, error=view.error or first_line(error))
    return view


class RunFailed(TFClusterError):
    """A cell's job failed and was torn down; IPython shows the node's error alone.

    Subclasses name the runtime error they wrap (``wraps``), how the traceback's
    head reads (``shown_as``) and how a non-node error is prefixed (``prefix``).
    """

    wraps: ClassVar[type[BaseException]] = TFClusterError
    shown_as: ClassVar[str] = "TFClusterError"
    prefix: ClassVar[str] = "{name}"
    quiet: ClassVar[bool] = True  # leave TensorFlow's native start-up noise out of the shown tail

    @classmethod
    def wrap(cls, exc: BaseException, name: str) -> RunFailed:
        """``exc`` as this type, once: a RunFailed of this type comes back as it is."""
        if isinstance(exc, cls):
            return exc
        if isinstance(exc, cls.wraps):
            new = cls(str(exc))
            for field in _ERROR_FIELDS:
                if hasattr(exc, field):
                    value = getattr(exc, field)
                    setattr(new, field, list(value) if field == "tail" else value)
        else:
            new = cls(f"{cls.prefix.format(name=name)}: {type(exc).__name__}: {exc}")
        new.__cause__ = exc
        return new

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        rest = quiet_lines(lines[1:]) if self.quiet else lines[1:]
        return [f"\x1b[0;31m{self.shown_as}\x1b[0m: {lines[0]}", *rest]


class RunHandle:
    """A job started by a cell: watch it, wait for it, stop it (the part clusters and parallel runs share)."""

    error_type: ClassVar[type[RunFailed]] = RunFailed
    _STILL: ClassVar[str] = "{name} is still {state} after {timeout:g} s"
    _STOPPED: ClassVar[str] = "{name} was stopped ({reason})"
    _REPR: ClassVar[str] = "<tfos_nb run {name!r}: {state}, {n} node(s)>"

    def __init__(self, name: str, *, sc: Any, num_nodes: int, timeout: float | None = None,
                 background: bool = False, clock: Callable[[], float] = time.time, tracking: Any = None) -> None:
        self.name = name
        self.tracking = tracking  # the job's MLflow run (runtime.driver.tracking.JobRun), ended with the job
        self.num_nodes = num_nodes
        self.timeout = timeout
        self.background = background
        self._sc = sc
        self._clock = clock
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop_reason: str | None = None
        self._error: BaseException | None = None
        self._result: Any = None  # what wait() returns; set by the subclass (None: stopped)
        self._final_state: str | None = None
        self._log: deque[str] = deque(maxlen=LOG_LINES_KEPT)
        self.lines: queue.SimpleQueue[list[str]] | None = None if background else queue.SimpleQueue()
        self._observers: list[Callable[[Any, bool], Any]] = []
        self.started_at = clock()

    # -- what a subclass supplies ------------------------------------------------------
    def _run_job(self) -> None:
        """Start the job and wait for its end (the handle's thread); errors propagate."""
        raise NotImplementedError

    def _stop_job(self, reason: str) -> None:
        """Stop the job now, from any thread; returns at once.  ``_stop_reason`` is already set."""
        raise NotImplementedError

    def _close_job(self) -> None:
        """Tear the job down (the handle's thread, once the run ended or failed)."""

    def _finished(self) -> None:
        """The run ended (after ``_close_job``, before the observers' final call)."""

    def status(self) -> Any:
        """A snapshot of the job (a ClusterView or ParallelView), None before it exists."""
        raise NotImplementedError

    def _node_logs(self, tail: int | None) -> dict[str, list[str]] | None:
        """Output lines by node label, None before the job exists."""
        raise NotImplementedError

    def stalled_now(self) -> str:
        """``"; stalled then: LINE; LINE"`` from the job's stall flags now (who waits for whom), else ""; for the
        message of a job stopped by ■ or its timeout."""
        try:
            lines = getattr(self.status(), "stalls", ()) or ()
        except Exception:  # noqa: BLE001 - a view for a message: never in the way of the stop
            return ""
        return "; stalled then: " + "; ".join(lines) if lines else ""

    def _no_node(self, node: str) -> str:
        return f"no node {node!r} in {self.name}"

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> RunHandle:
        with self._lock:
            if self._thread is not None:
                return self
            self._thread = threading.Thread(target=self._main, name=f"tfos-cell-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            self._run_job()
        except BaseException as exc:  # noqa: BLE001 - handed to wait() / the cell
            if self._stop_reason is None:
                self._error = exc
        finally:
            try:
                self._close_job()
            finally:
                self._finished()
                self._final_state = self._state_now(ended=True)
                self._end_tracking()
                # observers first (the panel's final state, the TensorBoard route withdrawn): once wait() or
                # shutdown() returns, they have run
                self._tell_observers(final=True)
                self._done.set()

    def _end_tracking(self) -> None:
        """End the job's MLflow run as the job ended: stopped (■, shutdown, timeout), failed or finished."""
        if self.tracking is None:
            return
        stopped = self._stop_reason is not None
        try:
            self.tracking.finish(cluster_state.C_STOPPED if stopped else self._final_state or cluster_state.C_STOPPED,
                                 error=None if stopped else self._error)
        except Exception:  # noqa: BLE001 - tracking never fails the cell
            pass

    @property
    def tracking_url(self) -> str | None:
        """The job's run in the MLflow tracking UI, when the job is tracked and the server has a UI."""
        return None if self.tracking is None else self.tracking.url

    def stop(self, reason: str = "shut down") -> None:
        """Stop the job now (kill its nodes), from any thread; returns at once."""
        with self._lock:
            if self._done.is_set():
                return
            if self._stop_reason is None:
                self._stop_reason = reason
        self._stop_job(reason)

    def shutdown(self, timeout: float = 30.0) -> Any:
        """Stop the job now and wait (up to ``timeout`` s) until its nodes are gone."""
        if self._thread is None:
            return None
        self.stop("shut down")
        self._done.wait(timeout)
        return self._result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the run's thread to end; True if it did."""
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the run has ended; returns its result, re-raises a node's error (as ``error_type``)."""
        if not self._done.wait(timeout):
            raise TimeoutError(self._STILL.format(name=self.name, state=self.state, timeout=timeout))
        if self._error is not None:
            raise self.error_type.wrap(self._error, self.name) from None
        if self._result is None:
            raise RuntimeError(self._STOPPED.format(name=self.name, reason=self._stop_reason))
        return self._result

    # -- observers (a --background panel, the TensorBoard route) ----------------------------
    def add_observer(self, fn: Callable[[Any, bool], Any]) -> None:
        """Call ``fn(view, final)`` on every state change (control-server thread) and once at the end.

        For a --background cell's panel: observers must be quick and must not print
        (output from another thread lands in whatever cell runs then).
        """
        with self._lock:
            self._observers.append(fn)

    def _on_state(self, st: cluster_state.ClusterState) -> None:
        self._tell_observers(final=False)

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

    def _on_log(self, label: str, lines: list[str]) -> None:
        tagged = [f"[{label}] {line}" for line in lines]
        self._log.extend(tagged)
        if self.lines is not None:
            self.lines.put(tagged)

    # -- information ---------------------------------------------------------------------
    @property
    def error(self) -> BaseException | None:
        """What ended the run, if it failed."""
        return self._error

    @property
    def sc(self) -> Any:
        """The SparkContext the job runs on."""
        return self._sc

    def final_status(self) -> Any:
        """``status()``, marked failed when the run ended in an error the nodes' states do not show."""
        return marked_failed(self.status(), self._done.is_set(), self._error)

    def _state_now(self, ended: bool) -> str:
        view = self.status()
        if ended:
            if self._error is not None:
                return cluster_state.C_FAILED
            return view.state if view is not None else cluster_state.C_STOPPED
        return view.state if view is not None else "starting"

    @property
    def state(self) -> str:
        """starting, reserving, running, finished, failed or stopped."""
        if self._done.is_set() and self._final_state is not None:
            return self._final_state
        return self._state_now(ended=False)

    @property
    def nodes(self) -> tuple[cluster_state.NodeView, ...]:
        view = self.status()
        return view.nodes if view is not None else ()

    @property
    def metrics(self) -> dict[str, dict[str, Any]]:
        """The last metrics each node reported, by ``role:index`` (``run:i`` for parallel runs)."""
        return {n.label: dict(n.metrics) for n in self.nodes}

    @property
    def output(self) -> list[str]:
        """Every node's output lines so far, ``[role:index] line``, in arrival order (the last 5,000)."""
        return list(self._log)

    def logs(self, node: str | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """Output lines of one node (``"worker:0"``, ``"run:2"``) or of every node."""
        logs = self._node_logs(tail)
        if logs is None:
            return {}
        out = {label: lines for label, lines in logs.items() if node in (None, label)}
        if node is not None and not out:
            raise KeyError(self._no_node(node))
        return out

    def __repr__(self) -> str:
        view = self.status()
        extra = f", {view.elapsed:.1f} s" if view is not None else ""
        return self._REPR.format(name=self.name, state=self.state, n=self.num_nodes, extra=extra)
