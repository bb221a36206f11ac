"""TFCluster: start a TensorFlow cluster on Spark executors, feed it, shut it down.

The API is TensorFlowOnSpark's (``TFCluster.run`` / ``train`` / ``inference`` /
``shutdown``), so a TensorFlowOnSpark 2.x program migrates by changing its
import line.  What differs is underneath: gang-scheduled launch with a fast
"not enough executors" check, signed JSON control messages, heartbeats that
turn a dead node into an error within seconds, Arrow batches instead of one
RPC per row, and a teardown that leaves no process behind.
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
from collections.abc import Callable
from typing import Any

from . import messages as m
from . import state as S
from .controller import FEEDABLE, Controller
from .launch import (
    make_arrow_feeder,
    make_arrow_inferer,
    make_launcher,
    make_rdd_feeder,
    make_rdd_inferer,
    start_supervisor,
)
from .procs import kill_tree
from .reservation import ControlServer
from .sparkjob import SparkJob

log = logging.getLogger(__name__)

TAIL_IN_ERRORS = 20
EXECUTOR_SETTLE_S = 5.0


class InputMode:
    """Where a cluster's data comes from."""

    TENSORFLOW = 0  #: the node function reads its own data (files, TFRecords)
    SPARK = 1  #: the driver feeds RDD/DataFrame partitions with ``train()`` / ``inference()``


class TFClusterError(RuntimeError):
    """A node failed (or was lost); the cluster has been torn down.

    ``node`` is the failed node's label (``worker:1``), with ``host``,
    ``executor_id``, ``exit_code`` and ``tail`` (its last output lines).
    """

    def __init__(self, message: str, node: S.NodeView | None = None) -> None:
        super().__init__(message)
        self.node = node.label if node else None
        self.host = node.host if node else None
        self.executor_id = node.executor_id if node else None
        self.exit_code = node.exit_code if node else None
        self.tail = list(node.tail) if node else []


def _error_for(view: S.ClusterView) -> TFClusterError:
    failed = [n for n in view.nodes if n.state == S.FAILED]
    # The first node that failed on its own is the cause; later ones followed it.
    failed.sort(key=lambda n: (n.error is None or "no heartbeat" in (n.error or ""), n.index))
    if not failed:
        return TFClusterError(f"cluster {view.name} failed: {view.error or 'unknown error'}")
    n = failed[0]
    where = f"on host {n.host or '?'} (executor {n.executor_id or '?'})"
    msg = f"{n.label} failed {where}: {n.error or 'unknown error'}"
    tail = [line for line in n.tail if line.strip()][-TAIL_IN_ERRORS:]
    if tail:
        msg += f"\n--- last {len(tail)} lines of {n.label}'s output ---\n" + "\n".join(tail)
    others = [o.label for o in failed[1:]]
    if others:
        msg += f"\n(also failed or stopped after it: {', '.join(others)})"
    return TFClusterError(msg, n)


def _python_error_line(exc: BaseException) -> str:
    """The last Python exception line inside a Py4J/Spark error, else its first line."""
    text = str(exc)
    hits = re.findall(r"^\s*((?:[\w.]+)(?:Error|Exception|Interrupt)): (.+)$", text, flags=re.M)
    hits = [h for h in hits if not h[0].startswith(("org.", "java.", "py4j."))]
    if hits:
        name, msg = hits[-1]
        return f"{name.rsplit('.', 1)[-1]}: {msg}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def available_slots(sc: Any) -> tuple[int, int]:
    """(task slots, executors) the application has right now."""
    jsc = sc._jsc.sc()
    try:
        slots = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - older or newer Spark: fall back to the core count
        slots = int(sc.defaultParallelism)
    executors = max(0, len(sc.statusTracker().getExecutorInfos()) - 1)
    if sc.master.startswith("local") and not sc.master.startswith("local-cluster"):
        executors = 1
    return slots, executors


def _wait_for_slots(sc: Any, needed: int, timeout: float) -> None:
    """Return when ``needed`` tasks can run at once; fail fast when they never will."""
    deadline = time.monotonic() + timeout
    last = None
    stable_since = time.monotonic()
    while True:
        slots, executors = available_slots(sc)
        if slots >= needed:
            return
        if (slots, executors) != last:
            last, stable_since = (slots, executors), time.monotonic()
        now = time.monotonic()
        settled = executors > 0 and now - stable_since > EXECUTOR_SETTLE_S
        if settled or now > deadline:
            msg = (
                f"not enough executors: asked for {needed} nodes, {slots} task slot(s) available "
                f"on {executors} executor(s). Start Spark with at least {needed} executor slots "
                "(e.g. --num-executors/--total-executor-cores, or master local-cluster[N,1,MB])."
            )
            raise RuntimeError(msg)
        time.sleep(0.2)


def _driver_host(sc: Any) -> str:
    from .net import resolve

    host = sc.getConf().get("spark.driver.host", None) or "127.0.0.1"
    return resolve(host)


class TFCluster:
    """A running TensorFlow cluster on Spark executors (made by :func:`run`)."""

    def __init__(self, sc: Any, state: S.ClusterState, controller: Controller, server: ControlServer,
                 meta: dict[str, Any], input_mode: int, num_executors: int) -> None:
        self.sc = sc
        self.state = state
        self._controller = controller
        self._server = server
        self._meta = meta
        self.input_mode = input_mode
        self.num_executors = num_executors
        self.cluster_id = state.cluster_id
        self.name = state.name
        self._jobs: list[SparkJob] = []
        self._local: list[Any] = []  # supervisors of driver-side ps nodes
        self._closed = False
        self._close_lock = threading.Lock()
        self.last_feed: dict[str, int] = {}
        self.cluster_meta = {"id": self.cluster_id, "num_executors": num_executors}
        atexit.register(self._atexit)

    # -- information -------------------------------------------------------------
    @property
    def nodes(self) -> tuple[S.NodeView, ...]:
        """Every node: role, host, executor, device, state, step, metrics…"""
        return self.state.snapshot().nodes

    def status(self) -> S.ClusterView:
        """A snapshot of the whole cluster."""
        return self.state.snapshot()

    def logs(self, node: str | int | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """Output lines of one node (``"worker:1"`` or its index) or of all."""
        out = {}
        for n in self.state.nodes:
            if node is None or node in (n.index, n.label):
                out[n.label] = self.state.logs(n.index, tail)
        if node is not None and not out:
            msg = f"no node {node!r}; nodes are {[n.label for n in self.state.nodes]}"
            raise KeyError(msg)
        return out

    def tensorboard_url(self) -> str | None:
        """TensorBoard's URL on the chief, when started with ``tensorboard=True``."""
        return self.state.snapshot().tensorboard

    # -- data ------------------------------------------------------------------
    def train(self, dataRDD: Any, num_epochs: int = 0, feed_timeout: float = 600, qname: str = "input",
              *, batch_rows: int = 1024) -> None:
        """Feed an RDD or DataFrame to the chief/worker nodes, ``num_epochs`` times.

        Partitions go to nodes as Arrow batches; each epoch is one Spark job, and
        nodes reading with ``as_dataset()`` see one dataset iteration per epoch.
        Returns when every row was taken by a node (or skipped because its
        function had already returned: see ``last_feed``).
        """
        self._require_spark_mode("train")
        self._require_alive()
        from pyspark.sql import DataFrame

        is_df = isinstance(dataRDD, DataFrame)
        total = {"rows": 0, "skipped": 0, "partitions": 0}
        for _ in range(max(1, int(num_epochs))):
            with self.state.lock:
                self.state.feed_gen += 1
                gen = self.state.feed_gen
            meta = self._meta
            if is_df:
                fn = make_arrow_feeder(meta, gen, feed_timeout, batch_rows)

                def action(fn: Callable = fn) -> list:
                    return [r.asDict() for r in dataRDD.mapInArrow(fn, "partition int, rows long, skipped long").collect()]
            else:
                fn = make_rdd_feeder(meta, gen, feed_timeout, batch_rows)

                def action(fn: Callable = fn) -> list:
                    return [json.loads(s) for s in dataRDD.mapPartitionsWithIndex(fn).collect()]

            job = SparkJob(self.sc, f"tfos-{self.cluster_id}-feed-{gen}", f"tfos_nb {self.name}: feed epoch {gen}",
                           action)
            stats = self._watch(job, "feeding")
            for s in stats:
                total["rows"] += s["rows"]
                total["skipped"] += s["skipped"]
                total["partitions"] += 1
            with self.state.lock:
                self.state.gen_done = gen
            self.state.notify()
        self.last_feed = total
        if total["skipped"]:
            log.warning("tfos_nb: %d row(s) were not read: the nodes' functions returned first", total["skipped"])

    def inference(self, dataRDD: Any, feed_timeout: float = 600, qname: str = "input", *,
                  schema: Any = None, batch_rows: int = 1024) -> Any:
        """Results of the nodes' ``batch_results``, one per input row, in order (lazy).

        An RDD gives an RDD; a DataFrame with ``schema`` (a DDL string or
        StructType for the result columns) gives a DataFrame through Arrow.
        """
        self._require_spark_mode("inference")
        self._require_alive()
        from pyspark.sql import DataFrame

        if isinstance(dataRDD, DataFrame):
            if schema is not None:
                from pyspark.sql.types import StructType

                names = schema.names if isinstance(schema, StructType) else [
                    f.strip().split()[0] for f in str(schema).split(",")
                ]
                return dataRDD.mapInArrow(make_arrow_inferer(self._meta, feed_timeout, batch_rows, names), schema)
            dataRDD = dataRDD.rdd
        return dataRDD.mapPartitionsWithIndex(make_rdd_inferer(self._meta, feed_timeout, batch_rows))

    # -- lifecycle ----------------------------------------------------------------
    def shutdown(self, ssc: Any = None, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Stop the cluster: end the feeds, wait for chief/workers, then stop ps/evaluator.

        Idempotent.  Raises :class:`TFClusterError` when a node failed, and
        ``TimeoutError`` when the workers did not finish within ``timeout`` s (the
        cluster is torn down either way).
        """
        if self._closed:
            return
        try:
            with self.state.lock:
                self.state.stop_requested = True
            self.state.notify()
            deadline = time.monotonic() + timeout
            while True:
                view = self.state.snapshot()
                if view.state == S.C_FAILED:
                    raise _error_for(view)
                trainers = [n for n in view.nodes if self._waits_for(n)]
                if all(n.state in S.TERMINAL for n in trainers):
                    break
                if time.monotonic() > deadline:
                    waiting = [n.label for n in trainers if n.state not in S.TERMINAL]
                    msg = f"shutdown timed out after {timeout:.0f} s waiting for {', '.join(waiting)} to finish"
                    raise TimeoutError(msg)
                with self.state.changed:
                    self.state.changed.wait(0.2)
            if grace_secs:
                end = time.monotonic() + grace_secs
                while time.monotonic() < end and self.state.snapshot().state != S.C_FAILED:
                    with self.state.changed:
                        self.state.changed.wait(min(0.2, max(0.0, end - time.monotonic())))
            self._teardown()
            view = self.state.snapshot()
            if view.state == S.C_FAILED:
                raise _error_for(view)
        finally:
            self._teardown()

    def __enter__(self) -> TFCluster:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.shutdown()
        else:
            self._teardown()

    # -- internals ----------------------------------------------------------------
    def _waits_for(self, node: Any) -> bool:
        """Whether shutdown waits for ``node``'s function to return.

        With parameter servers and a chief, the chief coordinates and workers only
        serve (``server.join()``): shutdown waits for the chief.  Otherwise it waits
        for every chief/worker.  ps and evaluator nodes are stopped, never awaited.
        """
        roles = {n.job_name for n in self.state.nodes}
        if "ps" in roles and roles & {"chief", "master"}:
            return node.job_name in ("chief", "master")
        return node.job_name in FEEDABLE

    def _require_spark_mode(self, what: str) -> None:
        if self.input_mode != InputMode.SPARK:
            msg = f"{what}() needs a cluster started with input_mode=InputMode.SPARK"
            raise ValueError(msg)

    def _require_alive(self) -> None:
        view = self.state.snapshot()
        if view.state == S.C_FAILED:
            self._teardown()
            raise _error_for(view)
        if self._closed or view.state in (S.C_STOPPED, S.C_FINISHED):
            msg = f"cluster {self.name} is shut down"
            raise RuntimeError(msg)

    def _watch(self, job: SparkJob, what: str) -> Any:
        """Wait for a Spark job while watching the nodes; tear down on any failure."""
        self._jobs.append(job)
        self._controller.feed_errors.clear()
        job.start()
        try:
            while not job.wait(0.2):
                if self.state.snapshot().state == S.C_FAILED or self._controller.feed_errors:
                    job.cancel(join_timeout=0)  # a node or a feeding task failed: retries would not help
                    break
            view = self.state.snapshot()
            if view.state == S.C_FAILED:
                self._teardown()
                raise _error_for(view)
            if job.error is not None or self._controller.feed_errors:
                errors = self._controller.feed_errors
                cause = errors[0] if errors else _python_error_line(job.error)  # type: ignore[arg-type]
                self._teardown()
                view = self.state.snapshot()
                if view.state == S.C_FAILED and view.nodes and any(n.state == S.FAILED for n in view.nodes):
                    raise _error_for(view) from None
                msg = f"{what} failed: {cause}"
                raise RuntimeError(msg) from None
            return job.result()
        except KeyboardInterrupt:
            job.cancel()
            self._teardown()
            raise
        finally:
            if job in self._jobs and job.done:
                self._jobs.remove(job)

    def _teardown(self, wait: float = 10.0) -> None:
        """Stop every node and the control server; idempotent; never raises."""
        with self._close_lock:  # a second caller waits for the teardown in progress
            if self._closed:
                return
            self._closed = True
            self._teardown_locked(wait)

    def _teardown_locked(self, wait: float) -> None:
        try:
            with self.state.lock:
                self.state.kill_requested = True
                self.state.stop_requested = True
            for job in list(self._jobs):
                job.cancel(join_timeout=0)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                view = self.state.snapshot()
                live = [n for n in view.nodes if n.state not in S.TERMINAL and n.state != S.PENDING]
                if not live:
                    break
                with self.state.changed:
                    self.state.changed.wait(0.1)
            for proc in self._local:
                kill_tree(proc, grace=1)
            for job in list(self._jobs):
                job.cancel(join_timeout=5)
        finally:
            self._server.stop()
            with self.state.lock:
                for n in self.state.nodes:
                    if n.state not in S.TERMINAL:
                        n.state = S.STOPPED
                trainers = [n for n in self.state.nodes if self._waits_for(n)]
                final = S.C_FINISHED if trainers and all(n.state == S.FINISHED for n in trainers) else S.C_STOPPED
            self.state.set_cluster_state(final)
            atexit.unregister(self._atexit)

    def _atexit(self) -> None:
        self._teardown(wait=5.0)


def run(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    num_ps: int = 0,
    tensorboard: bool = False,
    input_mode: int = InputMode.TENSORFLOW,
    log_dir: str | None = None,
    driver_ps_nodes: bool = False,
    master_node: str | None = None,
    reservation_timeout: float = 600,
    queues: Any = None,
    eval_node: bool = False,
    release_port: bool = True,
    *,
    name: str | None = None,
    env: dict[str, str] | None = None,
    num_gpus: int | None = None,
    keras: str = "tf_keras",
    heartbeat_timeout: float = 10.0,
    log_callback: Callable[[str, list[str]], None] | None = None,
    on_state: Callable[[S.ClusterState], None] | None = None,
) -> TFCluster:
    """Start ``num_executors`` TensorFlow nodes on Spark executors running ``map_fun(tf_args, ctx)``.

    Roles are assigned in order ps → chief (``master_node``) → workers →
    evaluator (``eval_node``).  Returns once every node runs its function.
    ``keras="tf_keras"`` (the default) sets ``TF_USE_LEGACY_KERAS=1`` on the
    nodes, so ``tf.keras`` is Keras 2, which works with MultiWorkerMirroredStrategy
    across processes; ``keras="keras3"`` leaves Keras 3.
    """
    import cloudpickle

    if getattr(sc, "_jsc", None) is None:
        msg = (
            "tfos_nb needs a classic SparkContext (RDDs, barrier tasks); this session has none "
            "(Spark Connect?). Use a cluster with a full Spark driver."
        )
        raise TypeError(msg)
    for label, value in (("num_executors", num_executors), ("num_ps", num_ps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            msg = f"{label} must be a non-negative integer, got {value!r}"
            raise ValueError(msg)
    if master_node not in (None, "chief", "master"):
        msg = f"master_node must be None, 'chief' or 'master', got {master_node!r}"
        raise ValueError(msg)
    if keras not in ("tf_keras", "keras3"):
        msg = f"keras must be 'tf_keras' or 'keras3', got {keras!r}"
        raise ValueError(msg)
    n_train = num_executors - num_ps - (1 if eval_node else 0)
    if n_train < 1:
        msg = (
            f"num_executors={num_executors} leaves no chief/worker node "
            f"(num_ps={num_ps}, eval_node={eval_node})"
        )
        raise ValueError(msg)
    if str(sc.getConf().get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        msg = "tfos_nb needs a fixed set of executors: set spark.dynamicAllocation.enabled=false"
        raise ValueError(msg)

    roles: list[tuple[str, int]] = [("ps", i) for i in range(num_ps)]
    if master_node:
        roles.append((master_node, 0))
        n_train -= 1
    roles += [("worker", i) for i in range(n_train)]
    if eval_node:
        roles.append(("evaluator", 0))
    on_executors = len(roles) - (num_ps if driver_ps_nodes else 0)

    cluster_id = uuid.uuid4().hex[:12]
    state = S.ClusterState(cluster_id, name or f"tfos-{cluster_id}", roles)
    state.job_group = f"tfos-{cluster_id}"
    if log_callback is not None:
        state.add_log_listener(log_callback)
    if on_state is not None:
        state.add_listener(on_state)
    if num_gpus is None:
        num_gpus = int(getattr(tf_args, "num_gpus", 1) if not isinstance(tf_args, dict) else tf_args.get("num_gpus", 1))

    secret = m.new_secret()
    controller = Controller(
        state,
        input_mode_spark=input_mode == InputMode.SPARK,
        tensorboard=tensorboard,
        log_dir=log_dir,
        num_gpus=num_gpus,
        heartbeat_timeout=heartbeat_timeout,
    )
    host = _driver_host(sc)
    server = ControlServer(m.Codec(secret, cluster_id, "driver"), controller.handle, host, on_tick=controller.tick)
    try:
        address = server.start()
    except OSError:
        server = ControlServer(m.Codec(secret, cluster_id, "driver"), controller.handle, "0.0.0.0",
                               on_tick=controller.tick)
        address = server.start()
        address = (host, address[1])
    default_fs = "file:///"
    try:
        default_fs = sc._jsc.hadoopConfiguration().get("fs.defaultFS") or default_fs
    except Exception:  # noqa: BLE001
        pass
    meta = {
        "cluster_id": cluster_id,
        "secret": secret.hex(),
        "control": [address[0], address[1]],
        "roles": roles,
        "hb_interval": 0.5,
        "driver_timeout": max(heartbeat_timeout, 10.0),
        "reservation_timeout": reservation_timeout,
        "env": dict(env or {}),
        "keras": keras,
        "default_fs": default_fs,
        "first_node": num_ps if driver_ps_nodes else 0,
        "driver_pid": os.getpid(),
    }
    blob = cloudpickle.dumps((map_fun, tf_args))
    cluster = TFCluster(sc, state, controller, server, meta, input_mode, num_executors)
    try:
        _wait_for_slots(sc, on_executors, min(reservation_timeout, 120))
        if driver_ps_nodes:
            for i in range(num_ps):
                local = dict(meta, node=i, executor_id="driver", working_dir=os.getcwd(), watch_jvm=False)
                status, proc = _start_local_supervisor(local, blob, cluster_id, i)
                cluster._local.append(proc)
                if not status.get("ok"):
                    raise RuntimeError(f"ps:{i} on the driver did not start: {status.get('error')}")
        launcher = make_launcher(meta, blob)

        def launch() -> list:
            rdd = sc.parallelize(range(on_executors), on_executors)
            return [json.loads(s) for s in rdd.barrier().mapPartitions(launcher).collect()]

        job = SparkJob(sc, f"{state.job_group}-launch", f"tfos_nb {state.name}: start {on_executors} nodes", launch)
        cluster._jobs.append(job)
        job.start()
        _await_running(cluster, job, reservation_timeout)
        cluster._jobs.remove(job)
        state.set_cluster_state(S.C_RUNNING)
        return cluster
    except BaseException:
        cluster._teardown()
        raise


def _start_local_supervisor(meta: dict[str, Any], blob: bytes, cluster_id: str, i: int) -> tuple[dict, Any]:
    """A ps node on the driver (TensorFlowOnSpark's ``driver_ps_nodes``)."""
    import tempfile

    log_path = os.path.join(tempfile.gettempdir(), f"tfos_nb-{cluster_id}-node{i}.log")
    return start_supervisor(meta, blob, log_path)


def _await_running(cluster: TFCluster, job: SparkJob, timeout: float) -> None:
    state = cluster.state
    deadline = time.monotonic() + timeout
    statuses_checked = False
    while True:
        view = state.snapshot()
        if view.state == S.C_FAILED:
            raise _error_for(view)
        if job.done and not statuses_checked:
            statuses_checked = True
            if job.error is not None:
                msg = f"starting the nodes failed: {_python_error_line(job.error)}"
                raise RuntimeError(msg)
            bad = [s for s in job.result() if not s.get("ok")]
            if bad:
                roles = state.nodes
                lines = [f"{roles[s['node']].label}: {s.get('error')}" for s in bad]
                msg = "nodes did not start:\n" + "\n".join(lines)
                raise RuntimeError(msg)
        ready = all(n.state in (S.RUNNING, S.FINISHED, S.STOPPED) for n in view.nodes)
        if ready and job.done:
            return
        if time.monotonic() > deadline:
            missing = [f"{n.label} ({n.state})" for n in view.nodes if n.state not in (S.RUNNING, S.FINISHED)]
            msg = (
                f"reservation timed out after {timeout:.0f} s: waiting for {', '.join(missing)}. "
                "Are there enough free executors, and can executors reach the driver?"
            )
            raise TimeoutError(msg)
        with state.changed:
            state.changed.wait(0.1)
