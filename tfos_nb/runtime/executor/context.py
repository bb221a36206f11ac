"""What a node's function sees: ``main_fun(args, ctx)``."""

from __future__ import annotations

import getpass
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import step_time
from ..protocol import pipes
from ..protocol.bodies import BeatReport
from ..protocol.pipes import jsonable as _jsonable
from .feed.data_feed import DataFeed
from .feed.hub import FeedHub

HADOOP_SCHEMES = ("adl://", "file://", "hdfs://", "oss://", "s3://", "s3a://", "s3n://", "swift://", "viewfs://",
                  "wasb://", "gs://", "abfs://", "abfss://")
#: Databricks' FUSE mounts on every node: local paths TensorFlow opens, never under the default FS
DATABRICKS_LOCAL = ("/Volumes/", "/dbfs/", "/Workspace/")


def hdfs_path(ctx: Any, path: str) -> str:
    """``path`` made absolute on ``ctx.defaultFS`` (TensorFlowOnSpark's ``TFNode.hdfs_path`` rule).

    ``ctx`` is any object with ``defaultFS`` and ``working_dir``.  A path with a
    scheme is kept; an absolute path gets the default file system's prefix; a
    relative one is under ``/user/<user>`` on HDFS/viewfs, under ``working_dir`` on
    a local file system.  One deliberate difference: on a local default file
    system (``file://...``) the result is a plain local path (``/foo/bar``, not
    ``file:///foo/bar``), which TensorFlow, Keras and Python's ``open`` all take.

    Databricks paths: ``dbfs:/x`` becomes ``/dbfs/x`` (DBFS is mounted there on every
    node; TensorFlow cannot open ``dbfs:`` URIs), and ``/Volumes/...``, ``/dbfs/...`` and
    ``/Workspace/...`` (local FUSE mounts) are kept as they are on any default file system.
    """
    fs = str(ctx.defaultFS)
    if path.startswith("dbfs:"):
        return "/dbfs/" + path[len("dbfs:"):].lstrip("/")
    if path.startswith(HADOOP_SCHEMES) or path.startswith(DATABRICKS_LOCAL):
        return path
    base = fs[:-1] if fs.endswith("/") and not fs.endswith("://") else fs
    local = fs.startswith("file:")
    if path.startswith("/"):
        return path if local else base + path
    if local:
        return os.path.join(str(ctx.working_dir), path)
    if fs.startswith(("hdfs://", "viewfs://")):
        return f"{base}/user/{getpass.getuser()}/{path}"
    return f"{base}/{path}"


class Reporter:
    """Sends progress and events to the process's owner (frames of :mod:`..protocol.pipes` on the report pipe).

    Progress reports are batched: at most ``max_rate`` writes per second, each
    the latest report plus every report since the previous write (``batch``:
    the driver's metric history), at most ``BATCH_KEPT`` of them.  A report held
    back is written when its interval is over (a timer), not only with the next
    report or at the end: a node that reports a burst and then goes quiet (an
    evaluator waiting for the next checkpoint, stopped by shutdown) loses none.
    """

    BATCH_KEPT = 2000  # reports per write; a function reporting faster than 20,000/s loses the oldest

    def __init__(self, stream: Any, max_rate: float = 10.0) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._min_dt = 1.0 / max_rate
        self._last = 0.0
        self._pending: dict[str, Any] | None = None
        self._batch: deque[dict[str, Any]] = deque(maxlen=self.BATCH_KEPT)
        self._timer: threading.Timer | None = None  # writes the held-back report at the end of its interval
        self.on_step: Callable[[Any], None] | None = None  # told of every report's step (the phase watcher)

    def send(self, msg: pipes.Frame) -> None:
        line = pipes.encode(msg).decode()
        with self._lock:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (OSError, ValueError):
                pass

    def progress(self, report: dict[str, Any]) -> None:
        if self.on_step is not None:
            self.on_step(report.get("step"))
        now = time.monotonic()
        with self._lock:
            self._pending = report
            self._batch.append({k: report.get(k) for k in ("step", "time", "metrics", "times") if k in report})
            wait = self._min_dt - (now - self._last)
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._flush_held)
                    self._timer.name, self._timer.daemon = "tfos-report-flush", True
                    self._timer.start()
                return
            self._last = now
        self.flush()

    def _flush_held(self) -> None:
        with self._lock:
            self._timer = None
            self._last = time.monotonic()
        self.flush()

    def flush(self) -> None:
        with self._lock:
            report, self._pending = self._pending, None
            batch = list(self._batch)
            self._batch.clear()
            timer, self._timer = self._timer, None
        if timer is not None:  # what it would have written goes now
            timer.cancel()
        if report is not None:
            self.send(pipes.Report(report=report, batch=batch))


class NodeContext:
    """TensorFlowOnSpark's ``TFNodeContext``, plus progress reporting.

    Attributes: ``job_name`` (chief | worker | ps | evaluator), ``task_index``,
    ``worker_num`` (this node's index in the cluster), ``num_workers`` (chief +
    workers), ``cluster_spec`` (role → list of ``host:port``), ``executor_id`` (the
    node's index, TensorFlowOnSpark's meaning; Spark's executor id is
    ``spark_executor_id``), ``tmp_socket`` (the reserved port, see
    :meth:`release_port`), ``defaultFS``, ``working_dir``, ``log_dir`` (TensorBoard's,
    when on), ``gpus``, ``resources`` (what Spark gave the node's task, by resource name).
    """

    def __init__(self, info: dict[str, Any], hub: FeedHub | None, reporter: Reporter | None,
                 tmp_socket: Any = None) -> None:
        self.job_name: str = info["job_name"]
        self.task_index: int = info["task_index"]
        self.worker_num: int = info["node"]
        #: the node's index, as in TensorFlowOnSpark (its ``executor_id`` is ``worker_num``)
        self.executor_id: int = self.worker_num
        #: the Spark executor the node runs on ("driver" for a ps node on the driver)
        self.spark_executor_id: str = str(info.get("executor_id", ""))
        #: the socket holding this node's TensorFlow port until :meth:`release_port` (None once released)
        self.tmp_socket: Any = tmp_socket
        self.cluster_spec: dict[str, list[str]] = info["cluster_spec"]
        self.num_workers: int = len(self.cluster_spec.get("chief", [])) + len(self.cluster_spec.get("worker", []))
        self.defaultFS: str = info.get("default_fs", "file:///")
        self.working_dir: str = info.get("working_dir") or os.getcwd()
        self.log_dir: str | None = info.get("log_dir")
        self.gpus: list[dict[str, Any]] = info.get("gpus", [])
        #: what Spark gave this node's task, by resource name (``{"gpu": ["0"]}``): its ``TaskContext.resources()``
        self.resources: dict[str, list[str]] = dict(info.get("resources") or {})
        self.num_gpus = len(self.gpus)
        self.cluster_id: str = info.get("cluster_id", "")
        #: 1 for a first run; 2, 3, … when ``run_job(retries=…)`` / ``--retries`` started the cluster again
        self.attempt: int = int(os.environ.get("TFOS_ATTEMPT", "1") or 1)
        #: a job with retries: its backup folder, which every attempt's nodes reach (``progress_callback()`` keeps
        #: Keras' backup there; a custom loop's ``tf.train.CheckpointManager`` may too); None without retries
        self.checkpoint_dir: str | None = os.environ.get("TFOS_BACKUP_DIR") or None
        #: the job's MLflow run when it is tracked (a sweep's trial: its own run), else None; see executor.tracking.node
        self.mlflow_run_id: str | None = None
        self.mgr = hub  # what TFNode.DataFeed(ctx.mgr, ...) takes
        self._reporter = reporter
        self._total_steps: int | None = None
        self._total_epochs: int | None = None

    @property
    def is_chief(self) -> bool:
        """The chief, or worker 0 when the cluster has no chief."""
        if "chief" in self.cluster_spec or "master" in self.cluster_spec:
            return self.job_name in ("chief", "master")
        return self.job_name == "worker" and self.task_index == 0

    def absolute_path(self, path: str) -> str:
        """``path`` made absolute on the cluster's default file system: :func:`hdfs_path`."""
        return hdfs_path(self, path)

    def release_port(self) -> None:
        """Free the port reserved for this node's TensorFlow server (``ctx.tmp_socket``).

        Done before the function runs unless ``TFCluster.run(..., release_port=False)``;
        then the function calls it before starting its own server on that port.
        """
        sock, self.tmp_socket = self.tmp_socket, None
        if sock is not None:
            sock.close()

    tf_path = absolute_path

    def start_cluster_server(self, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
        """``TFNode.start_cluster_server(ctx, ...)`` (TensorFlowOnSpark's ``ctx`` method)."""
        return start_cluster_server(self, num_gpus, rdma)

    def get_data_feed(
        self,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: dict[str, str] | list[str] | None = None,
        *,
        numpy_rows: bool = True,
    ) -> DataFeed:
        """The feed of InputMode.SPARK data for this node (``numpy_rows``: see ``DataFeed``)."""
        if self.mgr is None:
            msg = (
                f"{self.job_name}:{self.task_index} has no data feed: only chief/worker nodes of a "
                "cluster started with input_mode=InputMode.SPARK are fed"
            )
            raise RuntimeError(msg)
        return DataFeed(self.mgr, train_mode, qname_in, qname_out, input_mapping, numpy_rows=numpy_rows)

    def report(self, step: int | None = None, total_steps: int | None = None, total_epochs: int | None = None,
               **metrics: Any) -> None:
        """Send progress to the driver (shown by ``cluster.nodes`` and the notebook panel)."""
        if self._reporter is None:
            return
        if total_steps is not None:
            self._total_steps = int(total_steps)
        if total_epochs is not None:  # with an ``epoch`` metric: the panel's progress when steps are unknown
            self._total_epochs = int(total_epochs)
        clean = {k: _jsonable(v) if not isinstance(v, (int, float, str)) else v for k, v in metrics.items()}
        # NaN/inf (a diverging loss) would make the supervisor's heartbeat unencodable (strict JSON): None
        clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in clean.items()}
        times = step_time.CLOCK.totals()  # once training began (the progress callback's steps)
        report = BeatReport(step=None if step is None else int(step), total_steps=self._total_steps,
                            total_epochs=self._total_epochs, metrics=clean, time=time.time(), times=times or {})
        self._reporter.progress(report.to_dict())  # the heartbeat's body, as the report pipe carries it

    def progress_callback(self, every_n_steps: int = 1) -> Any:
        """A Keras callback that reports the global step and the batch's logs."""
        from .keras_node.progress import progress_callback

        return progress_callback(self, every_n_steps)


def start_cluster_server(ctx: NodeContext, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
    """Start this node's ``tf.distribute.Server`` (TensorFlow 1 style programs)."""
    import tensorflow as tf

    if rdma:
        msg = "TensorFlow 2 has no RDMA verbs transport; use protocol 'grpc'"
        raise ValueError(msg)
    cluster = tf.train.ClusterSpec({k: v for k, v in ctx.cluster_spec.items() if k != "evaluator"})
    server = tf.distribute.Server(cluster, job_name=ctx.job_name, task_index=ctx.task_index, start=True)
    return cluster, server
