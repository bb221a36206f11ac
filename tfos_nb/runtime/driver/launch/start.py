"""Starting a cluster: ``run()`` — check the slots, start the control server, launch the nodes.

``run`` returns a :class:`~tfos_nb.runtime.driver.cluster.TFCluster` once every node runs
its function; any failure on the way tears down what was started and raises.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ...executor.process.launch import start_supervisor
from ...procs import kill_tree
from ...protocol import messages
from ...sessions import is_connect
from ..cluster import InputMode, TFCluster
from ..control.controller import new_cluster
from ..control.roles import trainers_finished
from ..job import DriverJob, add_start_listener, remove_start_listener
from ..keywords import ClusterKeywords, OptionKeywords, job_groups
from ..node_output import with_stderr
from ..options import ClusterShape, JobOptions, StartOptions
from ..tracking import tracked_start
from .awaiting import await_running
from .backends import new_job
from .slots import available_slots, dynamic_allocation, expected_slots, spark_context
from .stages import Launch
from .stages import stages as launch_stages

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is Python 3.11+; only annotations use it

__all__ = ["add_start_listener", "available_slots", "expected_slots", "remove_start_listener", "run", "start_cluster"]


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
    options: JobOptions | None = None,
    **given: Unpack[OptionKeywords],
) -> TFCluster:
    """Start ``num_executors`` TensorFlow nodes on Spark executors running ``map_fun(tf_args, ctx)``.

    ``sc``: the SparkContext, as in TensorFlowOnSpark, or a SparkSession.  The positional parameters are
    TensorFlowOnSpark's.  Roles are assigned in order ps → chief (``master_node``) → workers →
    evaluator (``eval_node``).  Returns once every node runs its function.

    Keyword options are :class:`~tfos_nb.runtime.driver.options.JobOptions`' fields (``name``, ``env``,
    ``num_gpus``, ``keras``, ``heartbeat_timeout``, ``notebook_timeout``, ``node_output``, ``stall_after``,
    ``seed``, ``deterministic``, ``preflight``, ``mlflow``, ``log_callback``, ``on_state``, ``on_start``), or
    ``options=`` a whole ``JobOptions`` (keywords given beside it win).  Among them:
    ``keras="tf_keras"`` (the default) sets ``TF_USE_LEGACY_KERAS=1`` on the
    nodes, so ``tf.keras`` is Keras 2, which works with MultiWorkerMirroredStrategy
    across processes; ``keras="keras3"`` leaves Keras 3.  ``on_start(job)`` is called
    before anything launches with the :class:`DriverJob` (``job.cancel(reason)`` stops the
    start from another thread).  ``notebook_timeout`` (Spark Connect only): the in-cluster
    coordinator stops the cluster when the notebook was not heard of for this many seconds
    (its process died, or a long job of its own held every slot the status jobs need); on a
    classic session the nodes stop ``heartbeat_timeout`` s after the driver is gone.

    ``node_output``: write every node's output lines to the driver's stderr as they
    arrive, as ``[role:index] line`` (e.g. ``[chief:0] Epoch 1/3``), TensorFlow's native
    log noise left out (``cluster.logs()`` and the nodes' log files keep every line).
    ``None`` (the default): on outside a notebook (a ``spark-submit`` job, a script), off
    in a notebook kernel, whose cell shows the nodes; the environment variable
    ``TFOS_NB_NODE_OUTPUT=0`` (or ``1``) decides instead when set.  ``log_callback(label,
    lines)`` gets the same lines, unfiltered, either way.

    ``stall_after``: a chief/worker that has not moved (no new phase, progress or stack) for this
    many seconds is flagged in ``status().stalls`` and the panel, naming its phase and the nodes
    that have not reached it (None or 0: never); ``cluster.stacks()`` then shows where it waits.

    ``mlflow``: experiment tracking, one MLflow run for the cluster, logged from here
    and ended when the cluster is shut down or closed (see :mod:`~tfos_nb.runtime.driver.tracking`):
    ``True`` (MLflow's current experiment), an experiment name, or a dict (``experiment``,
    ``all_nodes``, ``run_name``); ``None`` (the default) tracks only inside an active MLflow run
    (``with mlflow.start_run():``), ``False`` never.  ``args["export_dir"]`` is logged as the model.

    ``preflight=True`` runs :func:`tfos_nb.doctor` for these nodes first (a few seconds, no
    TensorFlow cluster) and raises its FAILs as one ``DoctorFailed`` error before anything
    starts; a dict passes options to it (``{"export_dir": ..., "feeders": ...}``).

    ``seed``: every node seeds Python, NumPy, TensorFlow and Keras with it before its function runs.
    ``deterministic=True`` (``seed`` 0 when not given) also turns on TensorFlow's op determinism on the
    nodes and feeds partition ``p`` of each epoch to the ``p mod n``-th chief/worker, each node's partitions
    in order, so that two runs train the same rows in the same steps (see :mod:`~tfos_nb.runtime.determinism`).
    """
    tfos: ClusterKeywords = {"num_ps": num_ps, "tensorboard": tensorboard, "input_mode": input_mode, "log_dir": log_dir,
                             "driver_ps_nodes": driver_ps_nodes, "master_node": master_node,
                             "reservation_timeout": reservation_timeout, "eval_node": eval_node,
                             "release_port": release_port}  # queues: TensorFlowOnSpark's, of no use here
    groups = job_groups(num_executors, options, {**tfos, **given}, ClusterKeywords)
    return start_cluster(sc, map_fun, tf_args, groups.shape, groups.options, launch=groups.launch)


def start_cluster(sc: Any, map_fun: Callable[[Any, Any], Any], tf_args: Any, shape: ClusterShape, options: JobOptions,
                  *, launch: StartOptions | None = None) -> TFCluster:
    """:func:`run` for a cluster of ``shape`` with ``options``, started as ``launch`` says (tracked as
    ``options.mlflow`` asks)."""
    how = StartOptions() if launch is None else launch
    facts = {"sc": sc, "tf_args": tf_args, "shape": shape, "input_mode": how.input_mode, "log_dir": how.log_dir}
    return tracked_start("cluster", facts, options, lambda opts: _start(sc, map_fun, tf_args, shape, opts, how))


def _start(sc: Any, map_fun: Callable[[Any, Any], Any], tf_args: Any, shape: ClusterShape, options: JobOptions,
           how: StartOptions) -> TFCluster:
    import cloudpickle

    input_mode, reservation_timeout, driver_ps_nodes = how.input_mode, how.reservation_timeout, how.driver_ps_nodes

    log_callback = with_stderr(options.log_callback, options.node_output)
    sc = spark_context(sc)
    roles = shape.roles()
    num_ps = shape.ps
    if options.preflight:
        _preflight(sc, len(roles) - (num_ps if driver_ps_nodes else 0), options)
    if driver_ps_nodes and is_connect(sc):
        msg = "driver_ps_nodes=True cannot work on Spark Connect: executors cannot reach the notebook's machine"
        raise ValueError(msg)
    on_executors = len(roles) - (num_ps if driver_ps_nodes else 0)
    first_node = num_ps if driver_ps_nodes else 0
    stages = launch_stages(sc, options.resources, roles, first_node)  # checks the resources= against the session

    controller = new_cluster(roles, tf_args, options, input_mode_spark=input_mode == InputMode.SPARK,
                             tensorboard=how.tensorboard, log_dir=how.log_dir)
    state = controller.state
    job = new_job(sc, state, controller, nodes_outlive_jobs=True, linger_s=10.0, join_s=5.0,
                  finished=trainers_finished, profiles=options.resources is not None)
    job.announce(log_callback=log_callback, on_state=options.on_state, on_start=options.on_start)
    try:
        meta = job.launch_meta(job.open_control(), options, roles=roles, reservation_timeout=float(reservation_timeout),
                               first_node=first_node, release_port=bool(how.release_port),
                               coordinator=job.coordinator_section("cluster", options.notebook_timeout)).to_dict()
        cluster = TFCluster(job, meta, input_mode, shape.num_nodes)
        blob = cloudpickle.dumps((map_fun, tf_args))
        dynamic = dynamic_allocation(sc)
        if not dynamic:  # with dynamic allocation the stages bring their executors
            job.wait_for_slots(on_executors, min(reservation_timeout, 120))
        if driver_ps_nodes:
            _start_driver_ps_nodes(job, meta, blob, num_ps)
        job.check_cancelled()
        launch = Launch(job, meta, blob, stages, barrier=not dynamic, labels=[n.label for n in state.nodes]).start()
        await_running(job, meta, launch, reservation_timeout)
        launch.forget()
        job.mark_up()
        job.controller.set_running()
        return cluster
    except BaseException:
        job.close()
        raise


def _start_driver_ps_nodes(job: DriverJob, meta: dict[str, Any], blob: bytes, num_ps: int) -> None:
    """TensorFlowOnSpark's ``driver_ps_nodes``: the ps nodes run on the driver; the job's teardown ends them."""
    local_nodes: list[Any] = []
    log_folders: list[str] = []

    def kill_local_nodes() -> None:
        for proc in local_nodes:
            kill_tree(proc, grace=1)
        for folder in log_folders:  # the supervisors' own output (their nodes' reached the driver's state): ended
            shutil.rmtree(folder, ignore_errors=True)

    job.on_teardown = kill_local_nodes
    for i in range(num_ps):
        job.check_cancelled()
        local = dataclasses.replace(messages.LaunchMeta.parse(meta), node=i, executor_id="driver", working_dir=os.getcwd(),
                                    watch_jvm=False)
        log_path = driver_log_path(job.cluster_id, i)
        log_folders.append(os.path.dirname(log_path))
        status, proc = start_supervisor(local, blob, log_path)
        local_nodes.append(proc)
        if not status.get("ok"):
            raise RuntimeError(f"ps:{i} on the driver did not start: {status.get('error')}")


def _preflight(sc: Any, nodes: int, options: JobOptions) -> None:
    from ...doctor.job import doctor

    opts = dict(options.preflight) if isinstance(options.preflight, Mapping) else {}
    opts.setdefault("num_gpus", options.num_gpus)
    opts.setdefault("resources", options.resources)
    doctor(sc, max(1, nodes), **opts).raise_for_failures()


def driver_log_path(cluster_id: str, i: int) -> str:
    """Where a node started on the driver logs: a fresh private directory (0700) in the temporary one.

    Not ``/tmp/tfos_nb-<cluster>-node<i>.log`` itself: the cluster id is no secret (it is on every node's
    command line), so another local user could plant a symlink or a file of theirs at that name first.
    """
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix=f"tfos_nb-{cluster_id}-"), f"node{i}.log")
