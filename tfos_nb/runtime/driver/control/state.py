"""The observable state of a cluster: what the driver knows about every node.

Who writes a ClusterState depends on where the cluster's control server runs.
Classic Spark: the :class:`~.controller.Controller` in the notebook's process
(its message handlers on the control server's thread; the transitions the job's
owner asks for -- start done, stop, kill, cancel, a new epoch, the final state --
are Controller methods too).  Spark Connect: the Controller in the coordinator
process on an executor writes the coordinator's state, and the notebook's copy
is written by :class:`~.connect.snapshot.Mirror` applying the coordinator's snapshots
(and by the few local transitions ``connect.RemoteController`` makes).  Every
writer takes the state's lock, and changes a node's or the cluster's state with :func:`.states.transition` only;
everybody else reads immutable snapshots.  The notebook layer (magics, panel)
only ever sees snapshots and change notifications; it never touches Spark or sockets.

``clock`` (default ``time.monotonic``) is injectable so tests can drive
heartbeat ages and elapsed times without sleeping.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ... import step_time
from ...executor.process import phases
from ...protocol.bodies import BeatReport
from . import stalls, states

# Node and cluster states: the members of states.Node and states.Cluster (the transitions between them are there).
PENDING, REGISTERED, STARTING, RUNNING = states.Node.PENDING, states.Node.REGISTERED, states.Node.STARTING, states.Node.RUNNING
FINISHED, FAILED, STOPPED = states.Node.FINISHED, states.Node.FAILED, states.Node.STOPPED
TERMINAL = frozenset(s for s in states.Node if s.terminal)
C_RESERVING, C_RUNNING = states.Cluster.RESERVING, states.Cluster.RUNNING
C_FINISHED, C_FAILED, C_STOPPED = states.Cluster.FINISHED, states.Cluster.FAILED, states.Cluster.STOPPED

LOG_LINES_KEPT = 2000
HISTORY_KEPT = 100_000  # reports kept in the chief's metric history (the oldest go first)
# Every node's history together: a row is about 600 bytes (a report with two metrics and its clocks), so a cluster
# keeps at most about 260 MB of it.  The chief keeps HISTORY_KEPT; the other nodes share the rest, HISTORY_KEPT
# each up to 4 nodes, fewer beyond (512 nodes: the last 587 reports of each worker), never under HISTORY_MIN.
HISTORY_TOTAL = 400_000
HISTORY_MIN = 500
TICK_GAP_S = 0.9  # a node's clocks with no report for this long are kept as a row of their own (record_tick)
CURVE_POINTS = 120  # at most this many points in a node's loss curve (the whole run, thinned)
# listeners (the panels) hear of changes at most this often; a change held back is told at the next change after
# the interval or at the control server's tick (twice a second), and a change of the cluster's state at once:
# 512 nodes heartbeating are 1,000 changes a second, each a snapshot of every node for whoever listens
LISTEN_INTERVAL_S = 0.1
# a waiter that reads every node (shutdown(), a reservation, train()'s end) looks at most this often: every
# heartbeat is a change, 1,000 a second from 512 nodes (ClusterState.wait_a_change)
LOOK_EVERY_S = 0.05
RATE_WINDOW_S = 5.0  # steps/s: measured over the reports of the last few seconds


def history_kept(roles: list[tuple[str, int]]) -> list[int]:
    """Reports kept in each node's history: :data:`HISTORY_KEPT` for the chief (the first chief or master, else the
    first worker, else the first node) and the rest of :data:`HISTORY_TOTAL` shared by the others."""
    jobs = [job for job, _ in roles]
    chief = next((i for i, job in enumerate(jobs) if job in ("chief", "master")),
                 next((i for i, job in enumerate(jobs) if job == "worker"), 0))
    share = max(HISTORY_MIN, min(HISTORY_KEPT, (HISTORY_TOTAL - HISTORY_KEPT) // max(1, len(roles) - 1)))
    return [HISTORY_KEPT if i == chief else share for i in range(len(roles))]


def window_rate(points: Any, window: float = RATE_WINDOW_S) -> float | None:
    """Steps per second over ``(time, step)`` points (oldest first) no older than ``window`` before the last.

    Time is the node's clock at each report, so nodes in lock-step show the same
    rate whatever the delays between the node and the driver.
    """
    pts = points if isinstance(points, (list, deque)) else list(points)  # a node's own deque: no copy a heartbeat
    if len(pts) < 2:
        return None
    t_end, s_end = pts[-1]
    first = next((p for p in pts if t_end - p[0] <= window), pts[-1])
    if first is pts[-1]:
        first = pts[-2]  # reports further apart than the window: the last two
    dt = t_end - first[0]
    if dt <= 0 or s_end < first[1]:
        return None
    rate: float = (s_end - first[1]) / dt
    return rate




@dataclasses.dataclass(frozen=True)
class Grant:
    """What Spark gave a node's launch task: ``cpus``, each resource's addresses, the stage's ResourceProfile id
    (None: the default profile)."""

    cpus: int | None = None
    resources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    profile_id: int | None = None

    @classmethod
    def of(cls, fields: dict[str, Any]) -> Grant:
        """A Grant from :meth:`to_dict`'s fields (the Connect coordinator's snapshot)."""
        resources = fields.get("resources") or {}
        return cls(fields.get("cpus"), tuple((str(k), tuple(str(a) for a in v)) for k, v in sorted(resources.items())),
                   fields.get("profile_id"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: ``{"cpus", "resources": {name: [addresses]}, "profile_id"}``."""
        return {"cpus": self.cpus, "resources": {k: list(v) for k, v in self.resources}, "profile_id": self.profile_id}

    def text(self) -> str:
        """``1 cpu · gpu 0 · profile 2``; "" when Spark said nothing."""
        parts = [] if self.cpus is None else [f"{self.cpus} cpu{'s' if self.cpus != 1 else ''}"]
        parts += [f"{name} {','.join(addresses) or '-'}" for name, addresses in self.resources]
        if self.profile_id is not None:
            parts.append(f"profile {self.profile_id}")
        return " · ".join(parts)


@dataclasses.dataclass(frozen=True)
class NodeView:
    """An immutable snapshot of one node."""

    index: int
    job_name: str
    task_index: int
    state: str
    host: str = ""
    port: int = 0
    executor_id: str = ""
    pid: int = 0
    child_pid: int | None = None
    device: str = "CPU"
    gpus: tuple[dict[str, Any], ...] = ()
    step: int | None = None
    total_steps: int | None = None
    total_epochs: int | None = None
    steps_per_sec: float | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    last_heartbeat_age: float | None = None
    rows_fed: int = 0
    error: str | None = None
    failed_at: float | None = None  # when it failed (the state's clock)
    exit_code: int | None = None
    tail: tuple[str, ...] = ()
    tensorboard: str | None = None
    tensorboard_error: str | None = None
    curve: tuple[float, ...] = ()  # the reported loss (or first metric), thinned to CURVE_POINTS
    curve_metric: str | None = None
    phase: str | None = None  # where a live node is (executor.process.phases); None once it ended
    still_for: float | None = None  # seconds since it last moved (phase, progress or stack changed)
    stall: str | None = None  # why it counts as stalled (driver.control.stalls), else None
    where: str = ""  # its main thread's place in the user's code, when it is there (executor.process.phases.where)
    feeders: tuple[tuple[int, str, float], ...] = ()  # feeding tasks open to it: (partition, executor, seconds open)
    grant: Grant = Grant()  # what Spark gave its launch task (cpus, resource addresses, profile)
    time_shares: dict[str, float] | None = None  # where its time went, the last few seconds (step_time.shares)
    time_sentence: str = ""  # the largest share in words: "waits for input 62%" (step_time.sentence)

    @property
    def label(self) -> str:
        return f"{self.job_name}:{self.task_index}"


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """An immutable snapshot of the whole cluster."""

    cluster_id: str
    name: str
    state: str
    started_at: float
    elapsed: float
    nodes: tuple[NodeView, ...]
    error: str | None = None
    tensorboard: str | None = None
    tensorboard_error: str | None = None  # why the chief has no TensorBoard (it failed), with its last lines
    rows_fed: int = 0
    feed_epoch: int = 0
    job_group: str = ""
    tracking_url: str | None = None  # the job's MLflow run in the tracking UI (experiment tracking)
    stalls: tuple[str, ...] = ()  # one line per stalled node (driver.control.stalls)


class NodeRecord:
    """What the driver knows of one node, updated under the state's lock; :class:`NodeView` is its snapshot."""

    state: states.Node  # written by states.transition only

    def __init__(self, index: int, job_name: str, task_index: int, history_kept: int = HISTORY_KEPT) -> None:
        self.index = index
        self.job_name = job_name
        self.task_index = task_index
        states.transition(self, PENDING, why="asked for")
        self.host = ""
        self.port = 0
        self.executor_id = ""
        self.pid = 0
        self.child_pid: int | None = None
        self.data_port: int | None = None
        self.gpus: list[dict[str, Any]] = []
        self.spark_gpus: list[str] = []  # the addresses Spark gave the node's task (registration)
        self.grant = Grant()  # everything Spark gave the node's task (registration)
        self.step: int | None = None
        self.total_steps: int | None = None
        self.total_epochs: int | None = None
        self.rate: float | None = None
        self._rate_points: deque[tuple[float, int]] = deque(maxlen=256)
        # (node's time, step, metrics, step_time totals or None)
        self.history: deque[tuple[float | None, int | None, dict[str, Any], dict[str, float] | None]] = \
            deque(maxlen=history_kept)
        self.history_dropped = 0  # rows gone from the front of a full history (the Connect mirror counts on it)
        self._time_window = step_time.Window()
        self._last_clock: tuple[float, dict[str, float]] | None = None  # (node's time, totals) of the last kept
        self.time_shares: dict[str, float] | None = None  # where its time went, the last few seconds (step_time)
        self.curve: list[float] = []
        self._curve_stride = 1
        self._curve_seen = 0
        self._curve_last: float | None = None
        self.curve_metric: str | None = None
        self.value: Any = None
        self.metrics: dict[str, Any] = {}
        self.last_heartbeat: float | None = None
        self.rows_fed = 0
        self.feed_closed = False  # its function called terminate() or returned: it reads no more data
        self.error: str | None = None
        self.failed_at: float | None = None  # (state clock) when it was marked failed: the first is the cause
        self.exit_code: int | None = None
        self.tail: list[str] = []
        self.logs: deque[str] = deque(maxlen=LOG_LINES_KEPT)
        self.tensorboard: str | None = None
        self.tensorboard_error: str | None = None
        self.working_dir = ""
        self.phase: str | None = None  # the node process's own phase (executor.process.phases), from its heartbeats
        self.moved_at: float | None = None  # (state clock) when it last moved; None: when the cluster started
        self.where = ""  # its main thread's place in the user's code (executor.process.phases.where), from its heartbeats
        self.phase_log: deque[str] = deque(maxlen=100)  # the node process's phases, in the order it went through them
        self.stacks_asked = 0  # the last stack dump asked of it (Controller.request_stacks)
        self.sample_seen = 0  # the feed sample its supervisor relayed to it (ClusterState.feed_sample_id)
        self.stacks: tuple[int, str] = (0, "")  # the last dump it sent: (id, text)
        # the "time" of the last report kept: every heartbeat carries the latest one, kept again only if new (a
        # clock row of record_tick may stand last in the history)
        self.last_report_time: object = None

    @property
    def label(self) -> str:
        return f"{self.job_name}:{self.task_index}"

    def keep(self, row: tuple[float | None, int | None, dict[str, Any], dict[str, float] | None]) -> None:
        """Append ``row`` to the history; a full one drops its oldest row (counted in ``history_dropped``)."""
        if len(self.history) == self.history.maxlen:
            self.history_dropped += 1
        self.history.append(row)

    def add_curve_point(self, value: float) -> None:
        """One reported value; the curve keeps every ``stride``-th, halved (stride doubled) when it gets long."""
        self._curve_seen += 1
        if (self._curve_seen - 1) % self._curve_stride:
            self._curve_last = value  # not kept, but shown at the curve's end until the next kept one
            return
        self._curve_last = None
        self.curve.append(value)
        if len(self.curve) > CURVE_POINTS:
            self.curve = self.curve[::2]
            self._curve_stride *= 2
            self._curve_seen = (len(self.curve) - 1) * self._curve_stride + 1

    def current_phase(self) -> str | None:
        """Where the node is: what the driver knows (not registered, waiting for the spec), else its own phase."""
        if self.state in TERMINAL:
            return None
        if self.state == PENDING:
            return phases.REGISTERING
        if self.state == REGISTERED:
            return phases.WAITING_FOR_SPEC
        if self.state == STARTING:
            return self.phase or phases.STARTING
        return self.phase  # None: a peer that does not say (a parallel run's)

    def view(self, now: float, t0: float = 0.0, feeders: tuple[tuple[int, str, float], ...] = ()) -> NodeView:
        gpus = tuple(self.gpus)
        if gpus:
            device = ", ".join(
                f"{g.get('name', 'GPU')} ({g.get('memory_used', '?')}/{g.get('memory_total', '?')} MiB)"
                for g in gpus
            )
        else:
            device = "CPU"
        return NodeView(
            index=self.index,
            job_name=self.job_name,
            task_index=self.task_index,
            state=self.state,
            host=self.host,
            port=self.port,
            executor_id=self.executor_id,
            pid=self.pid,
            child_pid=self.child_pid,
            device=device,
            gpus=gpus,
            step=self.step,
            total_steps=self.total_steps,
            total_epochs=self.total_epochs,
            steps_per_sec=self.rate,
            metrics=dict(self.metrics),
            last_heartbeat_age=None if self.last_heartbeat is None else now - self.last_heartbeat,
            rows_fed=self.rows_fed,
            error=self.error,
            failed_at=self.failed_at,
            exit_code=self.exit_code,
            tail=tuple(self.tail),
            tensorboard=self.tensorboard,
            tensorboard_error=self.tensorboard_error,
            curve=(*self.curve, self._curve_last) if self._curve_last is not None else tuple(self.curve),
            curve_metric=self.curve_metric,
            phase=self.current_phase(),
            still_for=None if self.state in TERMINAL else now - (t0 if self.moved_at is None else self.moved_at),
            where=self.where if self.state not in TERMINAL else "",
            feeders=feeders,
            grant=self.grant,
            time_shares=dict(self.time_shares) if self.time_shares else None,
            time_sentence=step_time.sentence(self.time_shares) if self.time_shares else "",
        )


class ClusterState:
    """Thread-safe model of a cluster.  Listeners get ``(ClusterState)`` on change."""

    state: states.Cluster  # written by states.transition only

    def __init__(self, cluster_id: str, name: str, roles: list[tuple[str, int]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.cluster_id = cluster_id
        self.name = name
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        kept = history_kept(roles)
        self.nodes = [NodeRecord(i, job, idx, kept[i]) for i, (job, idx) in enumerate(roles)]
        states.transition(self, C_RESERVING, why="asked for")
        self.error: str | None = None
        self.started_at = time.time()
        self._t0 = clock()
        self.ended_at: float | None = None
        self.feed_epoch = 0  # the last epoch opened for feeding
        self.epoch_done = 0  # the last epoch fed in full (nodes see its end)
        self.feed_plan: tuple[int, int] | None = None  # (first, last) epoch the running train() feeds
        self.feed_sample: dict[str, Any] = {}  # its data's shape, from the first feeding task: {"schema", "shapes"}
        self.feed_sample_id = 0  # which call's sample (nodes confirm the one they have)
        self.stop_requested = False
        self.kill_requested = False
        self.job_group = ""
        self.tracking_url: str | None = None  # set once, before the job starts (tracking.JobRun.attach)
        self.stall_after: float | None = stalls.DEFAULT_STALL_AFTER  # seconds without moving that flag a node
        # feeding tasks connected to a node now: (feed, gen, partition) -> (node index, executor id, since (clock))
        self.feeding: dict[tuple[str, int, int], tuple[int, str, float]] = {}
        self._feed_pending: tuple[int, ...] = ()  # see feed_pending
        self._pending_source: Callable[[], Iterable[int]] | None = None
        self._listeners: list[Callable[[ClusterState], None]] = []
        self._log_listeners: list[Callable[[str, list[str]], None]] = []
        self._told: tuple[str, float] | None = None  # the cluster state and time (monotonic) listeners last heard
        self._untold = False  # a change notify() held back from them

    @property
    def feed_pending(self) -> tuple[int, ...]:
        """The partitions of the open epochs no feeding task has asked a node for (the stall lines name them): the
        controller's count, read when asked (a snapshot), not at each of an epoch's thousands of hand-outs."""
        with self.lock:
            return tuple(self._pending_source()) if self._pending_source is not None else self._feed_pending

    @feed_pending.setter
    def feed_pending(self, value: Iterable[int]) -> None:  # the Spark Connect mirror's, from a snapshot
        self._feed_pending, self._pending_source = tuple(value), None

    def pending_from(self, source: Callable[[], Iterable[int]]) -> None:
        """Where :attr:`feed_pending` comes from (the controller's epoch shares; called with the lock held)."""
        self._pending_source = source

    # -- listeners -------------------------------------------------------
    def add_listener(self, fn: Callable[[ClusterState], None]) -> None:
        with self.lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[ClusterState], None]) -> None:
        with self.lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def add_log_listener(self, fn: Callable[[str, list[str]], None]) -> None:
        with self.lock:
            self._log_listeners.append(fn)

    def notify(self, *, hold: bool = True) -> None:
        """Wake waiters and tell listeners (at most every :data:`LISTEN_INTERVAL_S` while the cluster's state
        stays the same, unless ``hold`` is False); listener errors never break the runtime."""
        with self.lock:
            self.changed.notify_all()
            now = time.monotonic()
            if hold and self._told is not None and self._told[0] == self.state and now - self._told[1] < LISTEN_INTERVAL_S:
                self._untold = True
                return
            self._told, self._untold = (self.state, now), False
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a UI bug must not kill training
                pass

    def wait_a_change(self, timeout: float, looked: float) -> float:
        """Wait until the state changes or ``timeout`` s pass -- after what is left of :data:`LOOK_EVERY_S` since
        ``looked`` (when the caller last read the state, monotonic), so that it reads at most that often; returns
        the time to pass as ``looked`` next (now)."""
        rest = min(timeout, looked + LOOK_EVERY_S - time.monotonic())
        if rest > 0:
            time.sleep(rest)  # the nodes changed since: the caller reads them all now, not at each heartbeat
        else:
            with self.changed:
                self.changed.wait(timeout)
        return time.monotonic()

    def tell_held(self) -> None:
        """Tell listeners of a change :meth:`notify` held back (the control server's tick, twice a second)."""
        with self.lock:
            if not self._untold:
                return
        self.notify(hold=False)

    def emit_logs(self, label: str, lines: list[str]) -> None:
        with self.lock:
            listeners = list(self._log_listeners)
        for fn in listeners:
            try:
                fn(label, lines)
            except Exception:  # noqa: BLE001
                pass

    # -- queries -----------------------------------------------------------
    def node(self, index: int) -> NodeRecord | None:
        """Node ``index`` (a message's ``node`` field), None when the cluster has no such node."""
        return self.nodes[index] if 0 <= index < len(self.nodes) else None

    @property
    def ended(self) -> bool:
        return self.state in (C_FAILED, C_STOPPED, C_FINISHED)

    def tensorboard(self) -> str | None:
        """The address of the TensorBoard a node started (the chief's), None before."""
        with self.lock:
            return next((n.tensorboard for n in self.nodes if n.tensorboard), None)

    def snapshot(self) -> ClusterView:
        now = self.clock()
        with self.lock:
            end = self.ended_at if self.ended_at is not None else now
            tb = self.tensorboard()
            tb_error = next((n.tensorboard_error for n in self.nodes if n.tensorboard_error), None)
            live = self.state in (C_RESERVING, C_RUNNING)
            open_to: dict[int, list[tuple[int, str, float]]] = {}
            for (_, _, partition), (node, executor, since) in sorted(self.feeding.items()):
                open_to.setdefault(node, []).append((partition, executor, now - since))
            views = tuple(n.view(now, self._t0, tuple(open_to.get(n.index, ()))) for n in self.nodes)
            nodes, stall_lines = stalls.with_stalls(views, self.stall_after if live else None, self.feed_pending)
            return ClusterView(
                cluster_id=self.cluster_id,
                name=self.name,
                state=self.state,
                started_at=self.started_at,
                elapsed=end - self._t0,
                nodes=nodes,
                error=self.error,
                tensorboard=tb,
                tensorboard_error=tb_error,
                rows_fed=sum(n.rows_fed for n in self.nodes),
                feed_epoch=self.feed_epoch,
                job_group=self.job_group,
                tracking_url=self.tracking_url,
                stalls=stall_lines,
            )

    def logs(self, index: int, tail: int | None = None) -> list[str]:
        with self.lock:
            lines = list(self.nodes[index].logs)
        return lines if tail is None else lines[-tail:]

    def logs_by_label(self, node: str | int | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """The ``logs()`` of a cluster and of parallel runs: the last ``tail`` lines (None: all kept) of one node,
        named by label (``"worker:1"``, ``"run:2"``) or index, or of every node; ``KeyError`` naming the
        nodes for an unknown one."""
        out = {n.label: self.logs(n.index, tail) for n in self.nodes if node is None or node in (n.index, n.label)}
        if node is not None and not out:
            msg = f"no node {node!r}; nodes are {[n.label for n in self.nodes]}"
            raise KeyError(msg)
        return out

    def update_progress(self, node: NodeRecord, report: BeatReport) -> None:
        """Apply a node's latest ``ctx.report(...)`` (called with the lock held): its step, totals and metrics."""
        if report.step is not None:
            node.step = report.step
        if report.total_steps is not None:
            node.total_steps = report.total_steps
        if report.total_epochs is not None:
            node.total_epochs = report.total_epochs
        node.metrics.update(report.metrics)

    def record_reports(self, node: NodeRecord, reports: Iterable[BeatReport]) -> None:
        """Every report since the node's last heartbeat, oldest first (lock held): history, rate, curve."""
        now = time.time()
        for r in reports:
            step, metrics = r.step, r.metrics
            t = float(r.time) if r.time is not None else now
            totals = step_time.valid(r.times)
            node.keep((t, step, metrics, totals))
            node.last_report_time = r.time
            if totals is not None:
                node.time_shares = node._time_window.add(totals) or node.time_shares
                node._last_clock = (t, totals)
            if step is not None:
                if node._rate_points and step < node._rate_points[-1][1]:
                    node._rate_points.clear()  # a new run (retry) or a reset counter
                node._rate_points.append((t, step))
            if node.curve_metric is None:
                scalars = [k for k, v in metrics.items() if k not in ("epoch", "step") and isinstance(v, (int, float))
                           and not isinstance(v, bool)]
                if scalars:
                    node.curve_metric = "loss" if "loss" in scalars else scalars[0]
            value = metrics.get(node.curve_metric) if node.curve_metric else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                node.add_curve_point(float(value))
        # the points of the window and the one before it: window_rate's scan ends at the first point
        while len(node._rate_points) > 2 and node._rate_points[-1][0] - node._rate_points[1][0] > RATE_WINDOW_S:
            node._rate_points.popleft()
        rate = window_rate(node._rate_points)
        if rate is not None:
            node.rate = rate

    def record_tick(self, node: NodeRecord, times: object) -> None:
        """The node process's clocks from its phase frame (each second, lock held): kept as a history row of their
        own (no step, no metrics) when no report carried clocks for :data:`TICK_GAP_S`, as while a step is stuck on
        its input or its peers: the panel's and the history's shares then say where that time goes."""
        totals = step_time.valid(times)
        if totals is None or node._last_clock is None:
            return
        t, last = node._last_clock
        if totals["wall"] - last["wall"] < TICK_GAP_S:
            return  # the reports are as fresh (an older tick arriving after them is ignored)
        node._last_clock = (t + totals["wall"] - last["wall"], totals)  # the node's clock, as its reports' times
        node.keep((node._last_clock[0], None, {}, totals))
        node.time_shares = node._time_window.add(totals) or node.time_shares

    def history(self) -> list[tuple[str, int, int, float | None, int | None, dict[str, Any]]]:
        """Every recorded report: ``(role, task_index, node index, time, step, metrics)``, node by node (the clocks'
        rows of :meth:`record_tick` left out)."""
        return [h[:6] for h in self.history_with_times() if h[4] is not None or h[5]]

    def history_with_times(self) -> list[tuple[str, int, int, float | None, int | None, dict[str, Any],
                                               dict[str, float] | None]]:
        """:meth:`history`'s rows with each report's :mod:`..step_time` totals (None where it carried none)."""
        with self.lock:
            return [(n.job_name, n.task_index, n.index, t, step, dict(metrics), totals)
                    for n in self.nodes for t, step, metrics, totals in n.history]

    def values(self) -> dict[str, Any]:
        """What each node's function returned (plain data), by ``role:index``; nodes that returned nothing left out."""
        with self.lock:
            return {n.label: n.value for n in self.nodes if n.value is not None}
