"""Finding the notebook's Spark (never a second one), or starting an embedded local one."""

from __future__ import annotations

import atexit
import os
import re
import secrets
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ..runtime.driver.launch.start import expected_slots
from ..runtime.sessions import is_connect

__all__ = ["CONNECT_ENV", "LOOPBACK", "before_embedded_stop", "connect_refusal", "embedded_host", "embedded_notice",
           "expected_slots", "find_spark_context", "is_connect", "job_groups", "job_progress", "spark_for_cell",
           "spark_session", "start_embedded", "stop_embedded"]

CONNECT_ENV = "TFOS_NB_SPARK_CONNECT"  # "1": the embedded Spark is a local Spark Connect server (quickstart.sh --connect)
_CONNECT_AUTH_VAR = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # where pyspark's Connect client (and server, as a fallback) read it
# Settings that must never be on a command line (every local user reads /proc/PID/cmdline): they reach the JVM's
# SparkConf through pyspark's gateway instead.
_SECRET_CONF = ("spark.authenticate.secret", "spark.connect.authenticate.token")


def _context_of(obj: Any) -> Any:
    """The SparkContext behind a classic session/context object, the session itself on Spark Connect, else None."""
    if obj is None:
        return None
    if is_connect(obj):
        return obj
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    if isinstance(obj, SparkSession):
        return obj.sparkContext
    if isinstance(obj, SparkContext):
        return obj
    return None


def _usable(sc: Any) -> bool:
    return sc is not None and (is_connect(sc) or getattr(sc, "_jsc", None) is not None)


def find_spark_context(namespace: Mapping[str, Any]) -> Any:
    """The notebook's SparkContext (``spark``, ``sc``, the active session), its Spark Connect session, or None."""
    for name in ("spark", "sc"):
        sc = _context_of(namespace.get(name))
        if _usable(sc):
            return sc
    if _embedded_connect and not _embedded_connect[0].is_stopped:
        return _embedded_connect[0]
    if "pyspark" not in sys.modules:
        return None  # nobody started Spark in this process
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    try:
        active = SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001 - a half-configured Connect client
        active = None
    sc = _context_of(active)
    if _usable(sc):
        return sc
    sc = SparkContext._active_spark_context
    if sc is not None and getattr(sc, "_jsc", None) is not None:
        return sc
    return None


LOOPBACK = "127.0.0.1"


def embedded_host() -> str:
    """The address the embedded Spark binds to: loopback, unless ``SPARK_LOCAL_IP`` names another."""
    return os.environ.get("SPARK_LOCAL_IP") or LOOPBACK


def _wants_connect(connect: bool | None) -> bool:
    return os.environ.get(CONNECT_ENV) == "1" if connect is None else connect


def connect_refusal(pyspark_version: str) -> str | None:
    """Why the embedded Spark cannot be a Spark Connect server on ``pyspark_version``; None where it can.

    Before Spark 4.0 a local Spark Connect server authenticates no one (no token) and listens on every
    interface (no ``spark.connect.grpc.binding.address``): whoever reaches its port runs code as this user.
    """
    match = re.match(r"(\d+)\.(\d+)", pyspark_version)
    if match and (int(match[1]), int(match[2])) >= (4, 0):
        return None
    return (f"tfos_nb: the embedded Spark Connect server needs pyspark >= 4.0 (its authentication token and "
            f"loopback binding); pyspark {pyspark_version} is installed: upgrade pyspark, or use the classic "
            f"embedded Spark (no {CONNECT_ENV} / connect=False)")


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


NO_PYSPARK = ("tfos_nb: no Spark session in this kernel, and no pyspark to start an embedded one: pip install "
              "'tfos_nb[spark]', or run the notebook where your platform's Spark is (Databricks, EMR, Dataproc)")


def _refusal(connect: bool | None) -> str | None:
    """Why the embedded Spark cannot start, or None: no pyspark (the ``spark`` extra), or :func:`connect_refusal`
    for the installed pyspark where the embedded Spark is to be a Connect server."""
    try:
        import pyspark  # noqa: F401 - a platform's own, or the extra's
    except ImportError:
        return NO_PYSPARK
    return connect_refusal(_pyspark_version()) if _wants_connect(connect) else None


def start_embedded(nodes: int, master_template: str, connect: bool | None = None) -> Any:
    """A SparkSession on an embedded ``local-cluster`` with one executor slot per node.

    ``connect`` (default: the ``TFOS_NB_SPARK_CONNECT`` environment variable is "1"): a local
    Spark Connect server on that cluster and a Spark Connect session to it — what a hosted
    notebook (Databricks serverless, standard access mode) gives — its gRPC port on loopback only.

    Everything it starts listens on loopback (``embedded_host()``): the driver
    (``spark.driver.host``/``bindAddress``), the local-cluster's master, workers and
    executors (``SPARK_LOCAL_IP`` in the JVM's environment, inherited by the executors),
    and so tfos_nb's control server and the nodes' data servers and TensorBoard, which
    take the driver's address.  A notebook's own Spark session keeps its own settings.

    Raises ``RuntimeError`` without pyspark, and for a Connect server on pyspark < 4.0 (:func:`connect_refusal`),
    before anything starts.
    """
    refusal = _refusal(connect)
    if refusal:
        raise RuntimeError(refusal)
    connect = _wants_connect(connect)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors must import TensorFlow from this environment

    host = embedded_host()
    master = master_template.format(n=max(1, nodes))
    # Spark's RPC authenticated with a secret of this session's (local-cluster needs it set explicitly):
    # without it, any local user could join the embedded master, workers or driver and run code as this
    # user.  It never goes on a command line (every user reads /proc/PID/cmdline): see _launch_jvm.
    secret = secrets.token_hex(32)
    saved = os.environ.get("SPARK_LOCAL_IP")
    os.environ["SPARK_LOCAL_IP"] = host  # read by the JVM that getOrCreate launches, then put back
    conf = {"spark.app.name": "tfos_nb", "spark.driver.host": host, "spark.driver.bindAddress": host,
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.authenticate": "true", "spark.authenticate.secret": secret}
    try:
        if connect:
            spark = _start_local_connect(master, conf)
        else:
            spark = _start_local_cluster(master, conf)
    finally:
        if saved is None:
            os.environ.pop("SPARK_LOCAL_IP", None)
        else:
            os.environ["SPARK_LOCAL_IP"] = saved
    if not connect:
        spark.sparkContext.setLogLevel("ERROR")
    _embedded_sessions.append(spark)
    if not _atexit_registered:
        atexit.register(stop_embedded)
        _atexit_registered.append(True)
    return spark


def _launch_jvm(master: str, conf: Mapping[str, str], *, own_session: bool) -> None:
    """Start pyspark's JVM (its gateway), unless this process has one already.

    ``own_session``: in a process session of its own.  A kernel asked to shut down (ipykernel) first
    sends SIGTERM to every process of its own process group, before any ``atexit`` handler: the JVM, its
    master and workers then die under a running application, whose workers try to relaunch its executors
    during the JVM's shutdown (dozens of ERROR lines and Java stacks after a run that succeeded).  In a
    session of its own the JVM is left to :func:`stop_embedded`; it still exits on its own if this process
    dies (pyspark's gateway ends at the end of its standard input).

    pyspark starts the JVM with ``spark-submit --conf k=v`` for each setting it is given: the secrets
    (:data:`_SECRET_CONF`) are left out there, and the SparkContext made next in that JVM gets them through
    the gateway.  Spark hands the RPC secret to its executors in their environment (readable by this user
    only), not on their command lines.  A JVM an earlier Spark of this process started outlives its
    SparkContext: pyspark makes the next one there, so it is used as it is.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    public = {k: v for k, v in conf.items() if k not in _SECRET_CONF}
    gateway = launch_gateway(SparkConf().setMaster(master).setAll(list(public.items())),
                             popen_kwargs={"start_new_session": own_session})
    SparkContext._ensure_initialized(gateway=gateway)


def _start_local_cluster(master: str, conf: dict[str, str]) -> Any:
    """A classic session on ``master``, in a JVM whose command line holds no secret (:func:`_launch_jvm`)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    _launch_jvm(master, conf, own_session=True)
    SparkContext(conf=SparkConf().setMaster(master).setAll(list(conf.items())))
    return SparkSession.builder.getOrCreate()  # the session of that context


_embedded_sessions: list[Any] = []  # what start_embedded started: this module owns it and stops it
_before_stop: list[Callable[[], None]] = []  # run first: the clusters still using the embedded Spark
_atexit_registered: list[bool] = []


def before_embedded_stop(hook: Callable[[], None]) -> Callable[[], None]:
    """Run ``hook`` before :func:`stop_embedded` stops the embedded Spark; returns what unregisters it.

    The magics register their ``shutdown_all`` here: at kernel exit their clusters end while Spark
    still runs, whatever order ``atexit`` runs its handlers in.
    """
    if hook not in _before_stop:
        _before_stop.append(hook)

    def unregister() -> None:
        if hook in _before_stop:
            _before_stop.remove(hook)

    return unregister


def stop_embedded() -> None:
    """Stop the Spark this module started (at kernel exit too), in order.

    The clusters first (:func:`before_embedded_stop`), then the application (``spark.stop()``), which in
    ``local-cluster`` mode stops its master and workers after the application has ended.  Left to the
    JVM's own shutdown (the kernel's process ending), the workers saw their executors die and tried to
    relaunch them during the JVM's shutdown: dozens of Java ERROR lines and stack traces after a run that
    had succeeded.  Idempotent.
    """
    for hook in list(_before_stop):
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - the Spark below must still stop
            print(f"tfos_nb: stopping clusters before the embedded Spark: {exc}", file=sys.stderr)
    while _embedded_sessions:
        spark = _embedded_sessions.pop()
        try:
            spark.stop()
        except Exception as exc:  # noqa: BLE001 - at exit: say it, stop the rest
            print(f"tfos_nb: stopping the embedded Spark: {exc}", file=sys.stderr)
    _embedded_connect.clear()


_embedded_connect: list[Any] = []  # the local Spark Connect session start_embedded made (its server's own
# classic SparkContext lives in this process too, and must not be mistaken for the notebook's Spark)


def _start_local_connect(master: str, conf: dict[str, str]) -> Any:
    """A local Spark Connect server on ``master``, its gRPC port a free one on loopback, and a session to it.

    ``SparkSession.builder.remote("local-cluster[...]")`` does the same on the fixed port 15002 of every
    interface (a second notebook on the machine cannot have one); this is that path with the port chosen
    here: pyspark's own server start (``_start_connect_server``, also used by pyspark's tests) and its
    markers, so ``spark.stop()`` stops the server as it does for pyspark's local mode.

    pyspark would start the JVM itself, every setting on its command line: the JVM is started first
    (:func:`_launch_jvm`, no secret on its command line), and pyspark's server start makes its SparkContext
    there, the secrets through the gateway.  The server takes a random token, which the session sends:
    in this process's environment (``SPARK_CONNECT_AUTHENTICATE_TOKEN``, where pyspark's client reads it,
    inherited by the JVM; a process's environment is readable by its own user only) and in the server's
    SparkConf (so a JVM started earlier without it in its environment still requires it).
    """
    import socket

    from pyspark.sql.connect.session import SparkSession as ConnectSession

    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    token = os.environ.setdefault(_CONNECT_AUTH_VAR, secrets.token_hex(32))  # one this process was given is kept
    opts = dict(conf, **{"spark.connect.grpc.binding.address": LOOPBACK, "spark.connect.grpc.binding.port": str(port),
                         "spark.connect.authenticate.token": token})
    os.environ["SPARK_LOCAL_REMOTE"] = "1"
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    # In a session of its own, as the classic path's: a kernel asked to shut down sends SIGTERM to its own process
    # group before its atexit handlers run, which killed the server's executors under its running application
    # (13 ERROR lines and stacks after a quickstart that succeeded); stop_embedded stops it in order instead.
    _launch_jvm(master, opts, own_session=True)
    ConnectSession._start_connect_server(master, opts)
    spark = ConnectSession.builder.remote(f"sc://localhost:{port}").getOrCreate()
    _embedded_connect[:] = [spark]
    return spark


def spark_session(nodes: int = 2, master_template: str = "local-cluster[{n},1,1024]",
                  connect: bool | None = None) -> Any:
    """The active SparkSession, or an embedded local one with ``nodes`` executor slots.

    This is what ``%%tfos_cluster`` does when no Spark session exists; call it
    first when the notebook needs Spark itself (to build the DataFrame to feed).
    ``connect`` (default: ``TFOS_NB_SPARK_CONNECT=1`` in the environment) makes the embedded
    one a local Spark Connect server and session (see :func:`start_embedded`; ``RuntimeError`` on pyspark < 4.0).
    """
    sc = find_spark_context({})
    if sc is not None:
        if is_connect(sc):
            return sc
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()  # reuses sc
    refusal = _refusal(connect)
    if refusal:
        raise RuntimeError(refusal)
    print(embedded_notice(master_template.format(n=max(1, nodes)), connect))
    return start_embedded(nodes, master_template, connect)


def embedded_notice(master: str, connect: bool | None = None) -> str:
    kind = "a local Spark Connect server and session" if _wants_connect(connect) else "an embedded one"
    # TensorFlow binds its tf.distribute gRPC server to every interface (hard-coded, no authentication):
    # say so plainly rather than promise a loopback-only cluster.
    return (f"tfos_nb: no Spark session in this kernel; starting {kind} ({master}; Spark and tfos_nb listen on "
            f"{embedded_host()} only, but TensorFlow's own gRPC ports listen on all interfaces, unauthenticated: "
            f"firewall them on a shared network; executors run {sys.executable})")


def job_groups(job_group: str, feed_epochs: int) -> list[str]:
    """The Spark job groups a cluster's runtime uses: its launch job and one feeding job per generation."""
    if not job_group:
        return []
    return [f"{job_group}-launch", *(f"{job_group}-feed-{gen}" for gen in range(1, feed_epochs + 1))]


def job_progress(sc: Any, groups: list[str]) -> tuple[int, int, int] | None:
    """(tasks done, tasks in all, tasks failed) of the jobs in ``groups``, from ``sc.statusTracker()``.

    Plain numbers for the panel, which never talks to Spark; None when Spark cannot tell.
    """
    if sc is None or not groups:
        return None
    try:
        tracker = sc.statusTracker()
        done = total = failed = 0
        for group in groups:
            for job_id in tracker.getJobIdsForGroup(group):
                job = tracker.getJobInfo(job_id)
                if job is None:
                    continue
                succeeded = str(job.status).upper() == "SUCCEEDED"
                for stage_id in job.stageIds:
                    stage = tracker.getStageInfo(stage_id)
                    if stage is None:
                        continue
                    if succeeded and not (stage.numCompletedTasks or stage.numActiveTasks or stage.numFailedTasks):
                        continue  # a stage the finished job skipped (its output was cached): it never runs
                    done += stage.numCompletedTasks
                    total += stage.numTasks
                    failed += stage.numFailedTasks
    except Exception:  # noqa: BLE001 - progress is decoration; a stopping SparkContext must not break the cell
        return None
    return done, total, failed


def spark_for_cell(ns: dict[str, Any], master_template: str, nodes: int, embedded_slots: int | None = None) -> Any:
    """A cell magic's SparkContext: the notebook's, or an embedded local-cluster (its session left as ``spark``).

    ``nodes`` task slots are checked against what the notebook's Spark application
    will have (0: no check); an embedded Spark gets ``embedded_slots`` (default ``nodes``).
    An embedded Spark Connect server on pyspark < 4.0 is a ``UsageError`` (:func:`connect_refusal`).
    """
    from IPython.core.error import UsageError

    from ..runtime.driver.launch.start import available_slots

    sc = find_spark_context(ns)
    if sc is None:
        refusal = _refusal(None)
        if refusal:
            raise UsageError(refusal)
        n = nodes if embedded_slots is None else embedded_slots
        print(embedded_notice(master_template.format(n=n)))
        spark = start_embedded(n, master_template)
        ns.setdefault("spark", spark)
        return spark if is_connect(spark) else spark.sparkContext
    if is_connect(sc):
        return sc  # the barrier launch itself fails at once, naming the slots, when there are too few
    if nodes:
        slots, _executors = available_slots(sc)
        if slots < nodes:
            expected = expected_slots(sc)
            if expected is not None and expected < nodes:
                raise UsageError(
                    f"{nodes} nodes need {nodes} Spark task slots; this Spark application has {expected} "
                    f"({sc.master}): lower --workers/--ps, or give Spark more executors"
                )
    return sc
