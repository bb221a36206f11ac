"""One job on the driver, whatever it runs: a TensorFlow cluster or N parallel runs.

The lifecycle is the same for both: announce the job (its state to the start
listeners, e.g. the notebook's panel), make the secret, start the signed
control server (on the driver's host, and only there), build the
:class:`~..protocol.messages.LaunchMeta` that every task gets, run Spark jobs,
and tear everything down once.  :meth:`DriverJob.cancel` and
:meth:`DriverJob.close` are public, idempotent and thread-safe; the job's
state is written by its :class:`~.controller.Controller` only.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import logs
from ..protocol import messages
from ..protocol.channel import ControlServer
from ..protocol.remote import StreamCounts
from .control import state as cluster_state
from .control.controller import Controller
from .control.plane import ControlPlane
from .control.roles import all_finished
from .launch.slots import driver_host, wait_for_slots
from .launch.sparkjob import SparkJob

if TYPE_CHECKING:
    from .options import JobOptions

LIVE = (cluster_state.REGISTERED, cluster_state.STARTING, cluster_state.RUNNING)

_start_listeners: list[Callable[[DriverJob], None]] = []


def add_start_listener(fn: Callable[[DriverJob], None]) -> None:
    """Call ``fn(job)`` whenever a cluster or parallel runs start, on the starting thread, before anything launches.

    ``job.state`` is the :class:`~.state.ClusterState` (``fn`` may ``add_listener`` to it),
    ``job.cancel(reason)`` stops the job.  How the notebook layer shows a panel for jobs
    started by plain Python calls without the runtime knowing about notebooks; ``fn``'s
    errors are ignored.
    """
    if fn not in _start_listeners:
        _start_listeners.append(fn)


def remove_start_listener(fn: Callable[[DriverJob], None]) -> None:
    if fn in _start_listeners:
        _start_listeners.remove(fn)


class JobCancelled(RuntimeError):
    """The job was cancelled (``DriverJob.cancel``) before it was up."""


class DriverJob:
    """The control server, Spark jobs and teardown of one cluster or set of parallel runs.

    ``nodes_outlive_jobs``: cluster nodes are processes of their own that outlive the
    launch job (teardown cancels the feeding jobs first, then waits for the nodes to
    stop); parallel runs are the Spark job's tasks (teardown lets them report the kill
    first, then cancels the job).  ``finished(nodes)`` says whether the job ends
    FINISHED rather than STOPPED.
    """

    #: what the session offers (False on Spark Connect, see ConnectDriverJob): RDDs as ``train()``'s data
    rdds_available = True
    #: whether a training stream's ``foreachBatch`` runs away from the notebook (on the Spark Connect server): it
    #: then reports each micro-batch to the control plane, and the stream reads :meth:`stream_counts`
    streams_on_server = False
    #: whether a feeding job's stage can be counted while it runs (Spark's status tracker; not on Spark Connect)
    counts_tasks = True

    def __init__(self, sc: Any, state: cluster_state.ClusterState, controller: ControlPlane, *,
                 nodes_outlive_jobs: bool, linger_s: float, join_s: float,
                 finished: Callable[[list[Any]], bool] | None = None,
                 on_teardown: Callable[[], None] | None = None) -> None:
        self.sc = sc
        self.state = state
        self.controller = controller
        self.cluster_id = state.cluster_id
        self.name = state.name
        self.secret = messages.new_secret()
        self.nodes_outlive_jobs = nodes_outlive_jobs
        self.linger_s = linger_s
        self.join_s = join_s
        self._finished = finished or all_finished
        self.on_teardown = on_teardown
        self._server: ControlServer | None = None
        self.jobs: list[SparkJob] = []
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._up = False
        self._closed = False
        self.cancel_reason: str | None = None
        self._end_listeners: list[Callable[[DriverJob], None]] = []
        atexit.register(self._atexit)

    # -- start -----------------------------------------------------------------
    def announce(self, *, log_callback: Callable[[str, list[str]], None] | None = None,
                 on_state: Callable[[cluster_state.ClusterState], None] | None = None,
                 on_start: Callable[[DriverJob], None] | None = None) -> None:
        """Attach the caller's listeners, then tell ``on_start`` and every start listener (errors ignored)."""
        if log_callback is not None:
            self.state.add_log_listener(log_callback)
        if on_state is not None:
            self.state.add_listener(on_state)
        for fn in ([on_start] if on_start is not None else []) + list(_start_listeners):
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a UI bug must not stop a job from starting
                pass

    def add_end_listener(self, fn: Callable[[DriverJob], None]) -> None:
        """Call ``fn(job)`` once the job is torn down (its state final), on the closing thread; errors ignored.

        How experiment tracking (:mod:`.tracking`) learns that a job ended, whoever ended it.
        """
        self._end_listeners.append(fn)

    def open_control(self) -> tuple[str, int]:
        """Start the control server; returns the address tasks reach it at."""
        ctl = self.controller
        if not isinstance(ctl, Controller):  # a remote control plane has its server elsewhere (ConnectDriverJob)
            msg = f"{type(ctl).__name__} is no local Controller: its control server is not in this process (a bug)"
            raise TypeError(msg)
        host = driver_host(self.sc)
        self._server = ControlServer(messages.Codec(self.secret, self.cluster_id, "driver"), ctl.handle, host,
                                     on_tick=ctl.tick)
        try:
            ctl.address = self._server.start()
            return ctl.address
        except OSError as exc:  # never every interface instead: the port would be open to every network
            self._server = None
            msg = (f"{exc.strerror}; spark.driver.host must name an address of this machine "
                   "(tfos_nb's control server listens there, and only there)")
            raise OSError(exc.errno, msg) from exc

    def wait_for_slots(self, needed: int, timeout: float) -> None:
        """Return when ``needed`` tasks can run at once; raise when they never will (or return once cancelled)."""
        wait_for_slots(self.sc, needed, timeout, lambda: self.cancelled)

    def coordinator_section(self, kind: str, notebook_timeout: float) -> dict[str, Any]:
        """The launch meta's ``coordinator`` section: none here, where the control server is in this process."""
        return {}

    def launched(self, meta: dict[str, Any], statuses: list[messages.LaunchStatus]) -> None:
        """The launch stage of ``meta`` is over (its tasks' statuses): nothing to do here, the nodes registered
        with this process's control server as they started."""

    #: what a reservation timeout asks besides free slots (the executors must reach this process)
    reach_hint = ", and can executors reach the driver"

    def launch_meta(self, address: tuple[str, int], options: JobOptions, **kind: Any) -> messages.LaunchMeta:
        """What every node's launch is told: this job's control address and secret, ``options``' heartbeat timeout,
        node environment and Keras, and ``kind`` (``roles``, ``reservation_timeout``…)."""
        try:
            default_fs = self.sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
        except Exception:  # noqa: BLE001
            default_fs = "file:///"
        return messages.LaunchMeta(cluster_id=self.cluster_id, secret=self.secret.hex(), control=[address[0], address[1]],
                            hb_interval=0.5, driver_timeout=max(options.heartbeat_timeout, 10.0),
                            env={**logs.node_env(), **options.node_env()},
                            keras=options.keras, default_fs=default_fs, driver_pid=os.getpid(), **kind)

    def spark_job(self, suffix: str, description: str, action: Callable[[], Any]) -> SparkJob:
        """Start ``action`` as a Spark job of this job's group; teardown cancels it."""
        job = SparkJob(self.sc, f"{self.state.job_group}-{suffix}", description, action)
        self.jobs.append(job)
        job.start()
        return job

    def refresh(self, timeout: float = 30.0) -> None:
        """Bring ``state`` up to date with the cluster: it is the driver's own here (see ConnectDriverJob)."""

    def stream_counts(self, epoch: int) -> StreamCounts | None:
        """What the control plane counted for the training stream of ``epoch``: None here, where the stream's
        own feed counts (see ConnectDriverJob, where the coordinator does)."""
        return None

    def forget(self, job: SparkJob) -> None:
        if job in self.jobs and job.done:
            self.jobs.remove(job)

    def check_cancelled(self) -> None:
        if self.cancel_reason is not None:
            msg = f"{self.name} was cancelled ({self.cancel_reason})"
            raise JobCancelled(msg)

    def mark_up(self) -> None:
        """The start is over: a later cancel() tears down instead of failing the start.

        (A cluster's owner then asks its controller to ``set_running()``; parallel runs are
        running once the first one registers.)
        """
        with self._lock:
            self.check_cancelled()
            self._up = True

    # -- stop --------------------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self.cancel_reason is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def cancel(self, reason: str) -> None:
        """Stop the job, from any thread (idempotent).

        While it starts, the start fails with ``stopped (reason)`` and tears down on its
        own thread; once it is up, this tears down now (blocking, like :meth:`close`).
        """
        with self._lock:
            if self.cancel_reason is None:
                self.cancel_reason = reason
            up = self._up
        if up:
            self.close()
        else:
            self.controller.cancel(self.cancel_reason or reason)

    def close(self, wait: float | None = None) -> None:
        """Stop every node, cancel the Spark jobs, stop the control server; idempotent, never raises.

        A second caller waits for the teardown in progress.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._teardown(self.linger_s if wait is None else wait)
        for fn in list(self._end_listeners):
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a listener's bug must not break the teardown
                pass

    def _teardown(self, wait: float) -> None:
        """The one teardown, on either backend: kill the nodes, let them end (up to ``wait`` s), cancel the Spark
        jobs, release the control plane, write the final state.  A backend differs in the four hooks below."""
        try:
            self._send_kill()
            if self.nodes_outlive_jobs or self.cancel_jobs_first:
                self.cancel_jobs()  # feeding tasks free their slots
            if self._nodes_followed() and (self.nodes_outlive_jobs or self.cancel_jobs_first
                                           or any(not j.done for j in self.jobs)):
                self._wait_nodes_ended(wait)  # nodes get "kill" in their next heartbeat reply
            if self.on_teardown is not None:
                self.on_teardown()
            for job in list(self.jobs):
                job.cancel(join_timeout=self.join_s)  # also drops tasks still waiting for a slot
        finally:
            self._release_control()
            self.controller.finish(self._finished)
            atexit.unregister(self._atexit)

    def cancel_jobs(self) -> None:
        """Cancel this job's Spark jobs without waiting for them to end."""
        for job in list(self.jobs):
            job.cancel(join_timeout=0)

    #: cancel every Spark job before waiting for the nodes (Spark Connect: the mirror's snapshot jobs need the slots
    #: that feeding tasks or runs hold)
    cancel_jobs_first = False

    def _send_kill(self) -> None:
        """Tell every node to stop (with its next heartbeat reply)."""
        self.controller.request_kill()

    def _nodes_followed(self) -> bool:
        """Whether ``state`` follows the nodes as they end (here always: they heartbeat to this process)."""
        return True

    def _release_control(self) -> None:
        """Stop the control server (nodes still running stop ``driver_timeout`` s later on their own)."""
        if self._server is not None:
            self._server.stop()

    def _wait_nodes_ended(self, wait: float) -> None:
        """Wait up to ``wait`` s until no node of the state is live."""
        deadline = time.monotonic() + wait
        looked = 0.0
        while time.monotonic() < deadline:
            with self.state.lock:
                if not [n for n in self.state.nodes if n.state in LIVE]:
                    return
            looked = self.state.wait_a_change(0.1, looked)

    def _atexit(self) -> None:
        self.close(wait=5.0)
