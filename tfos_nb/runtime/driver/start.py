"""Starting a cluster: ``run()`` — check the slots, start the control server, launch the nodes.

``run`` returns a :class:`~tfos_nb.runtime.driver.cluster.TFCluster` once every node runs
its function; any failure on the way tears down what was started and raises.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..executor.launch import make_launcher, start_supervisor
from ..protocol import messages as m
from ..protocol.channel import ControlServer
from . import state as S
from .cluster import InputMode, TFCluster, _error_for, _python_error_line
from .controller import Controller
from .sparkjob import SparkJob

EXECUTOR_SETTLE_S = 5.0

_start_listeners: list[Callable[[S.ClusterState], None]] = []


def add_start_listener(fn: Callable[[S.ClusterState], None]) -> None:
    """Call ``fn(state)`` whenever :func:`run` starts a cluster, on run()'s thread, before its nodes launch.

    How the notebook layer shows a panel for clusters started by plain Python
    calls (``TFCluster.run``, ``TFEstimator.fit``) without the runtime knowing
    about notebooks.  ``fn`` may ``state.add_listener(...)``; its errors are ignored.
    """
    if fn not in _start_listeners:
        _start_listeners.append(fn)


def remove_start_listener(fn: Callable[[S.ClusterState], None]) -> None:
    if fn in _start_listeners:
        _start_listeners.remove(fn)


def available_slots(sc: Any) -> tuple[int, int]:
    """(task slots, executors) the application has right now."""
    jsc = sc._jsc.sc()
    try:
        slots = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - older or newer Spark: fall back to the core count
        slots = int(sc.defaultParallelism)
    executors = max(0, len(jsc.statusTracker().getExecutorInfos()) - 1)  # the JVM's: pyspark < 4 has no Python one
    if sc.master.startswith("local") and not sc.master.startswith("local-cluster"):
        executors = 1
    return slots, executors


def expected_slots(sc: Any) -> int | None:
    """Task slots this application will have once its executors are up, if the configuration says."""
    master = str(getattr(sc, "master", ""))
    match = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if match:
        return int(match.group(1)) * int(match.group(2))
    match = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    if match:
        return int(match.group(1))
    if master == "local":
        return 1
    conf = sc.getConf()
    instances, cores = conf.get("spark.executor.instances", None), conf.get("spark.executor.cores", None)
    if instances and cores and str(instances).isdigit() and str(cores).isdigit():
        return int(instances) * int(cores) // max(1, int(conf.get("spark.task.cpus", "1") or 1))
    return None



def _wait_for_slots(sc: Any, needed: int, timeout: float) -> None:
    """Return when ``needed`` tasks can run at once; fail fast when they never will.

    Executors register one by one, seconds apart on a busy machine: when the configuration
    says how many slots will come, wait for all of them (up to ``timeout``) before deciding;
    otherwise give up once their number has stopped changing for a few seconds.
    """
    expected = expected_slots(sc)
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
        if expected is not None:
            settled = slots >= expected  # every promised executor is up, and they are too few
        else:
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
    from ..net import resolve

    host = sc.getConf().get("spark.driver.host", None) or "127.0.0.1"
    return resolve(host)


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
    for listener in list(_start_listeners):
        try:
            listener(state)
        except Exception:  # noqa: BLE001 - a UI bug must not stop a cluster from starting
            pass
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
        "release_port": bool(release_port),
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
