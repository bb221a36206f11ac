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
import numbers
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from ..executor.feeder import (
    make_arrow_feeder,
    make_arrow_inferer,
    make_rdd_feeder,
    make_rdd_inferer,
)
from ..procs import kill_tree
from ..protocol.channel import ControlServer
from . import state as S
from .cluster_streams import ClusterStreams
from .controller import FEEDABLE, Controller
from .sparkjob import SparkJob
from .streaming import StreamingFeed, is_streaming

log = logging.getLogger(__name__)

TAIL_IN_ERRORS = 20
DEFAULT_EPOCHS = 10  # train(..., num_epochs=0): TensorFlowOnSpark feeds the data 10 times


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


def _refuse_dstream(data: Any, what: str) -> None:
    """Spark Streaming DStreams are not fed: say so up front, with the Structured Streaming equivalent."""
    try:
        from pyspark.streaming import DStream
    except ImportError:  # pragma: no cover - a PySpark without DStreams
        return
    if isinstance(data, DStream):
        stream = "train_stream" if what == "train" else "inference_stream"
        msg = (
            f"{what}() does not feed Spark Streaming DStreams (a legacy API, deprecated since Spark 3.4): "
            f"read the same source as a streaming DataFrame and use {stream}(), e.g.\n"
            "    stream_df = spark.readStream.text(input_dir)   # was ssc.textFileStream(input_dir)\n"
            + ("    feed = cluster.train_stream(stream_df, feed_timeout=600)   # returns at once; feed.stop() or "
               "cluster.request_stop() ends it\n    cluster.shutdown()"
               if what == "train" else
               "    feed = cluster.inference_stream(stream_df, schema, 'memory', query_name='preds')")
        )
        raise TypeError(msg)


def _python_error_line(exc: BaseException) -> str:
    """The last Python exception line inside a Py4J/Spark error, else its first line."""
    text = str(exc)
    hits = re.findall(r"^\s*((?:[\w.]+)(?:Error|Exception|Interrupt)): (.+)$", text, flags=re.M)
    hits = [h for h in hits if not h[0].startswith(("org.", "java.", "py4j."))]
    if hits:
        name, msg = hits[-1]
        return f"{name.rsplit('.', 1)[-1]}: {msg}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


class TFCluster(ClusterStreams):
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
        self._streams: list[StreamingFeed] = []  # active Structured Streaming feeds
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
        """Feed an RDD or DataFrame to the chief/worker nodes, ``num_epochs`` times (0, the default: 10 times,
        as TensorFlowOnSpark does).

        Partitions go to nodes as Arrow batches; each epoch is one Spark job, and
        nodes reading with ``as_dataset()`` see one dataset iteration per epoch.
        Returns when every row was taken by a node, or skipped because the node it
        went to stopped reading (its function called ``terminate()`` or returned);
        ``last_feed`` counts both.  A node that failed is an error.
        """
        _refuse_dstream(dataRDD, "train")
        if not isinstance(num_epochs, numbers.Integral) or isinstance(num_epochs, bool) or num_epochs < 0:
            msg = f"num_epochs must be a non-negative integer (0: 10 epochs), got {num_epochs!r}"
            raise ValueError(msg)
        self._require_spark_mode("train")
        self._require_alive()
        if is_streaming(dataRDD):  # one unbounded epoch, until the query or the nodes end
            if int(num_epochs) > 1:
                msg = "num_epochs does not apply to a streaming DataFrame: a stream is one unbounded epoch"
                raise ValueError(msg)
            feed = self.train_stream(dataRDD, feed_timeout=feed_timeout, batch_rows=batch_rows)
            try:
                feed.wait()
            finally:
                feed.stop()
                self.last_feed = feed.stats
            return
        self._require_no_training_stream()
        from pyspark.sql import DataFrame

        is_df = isinstance(dataRDD, DataFrame)
        total = {"rows": 0, "skipped": 0, "partitions": 0}
        for _ in range(int(num_epochs) or DEFAULT_EPOCHS):
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
        _refuse_dstream(dataRDD, "inference")
        self._require_spark_mode("inference")
        self._require_alive()
        from pyspark.sql import DataFrame

        if isinstance(dataRDD, DataFrame):
            if schema is not None:
                from pyspark.sql.types import StructType

                if not isinstance(schema, StructType):
                    schema = StructType.fromDDL(str(schema))
                return dataRDD.mapInArrow(make_arrow_inferer(self._meta, feed_timeout, batch_rows, schema), schema)
            dataRDD = dataRDD.rdd
        return dataRDD.mapPartitionsWithIndex(make_rdd_inferer(self._meta, feed_timeout, batch_rows))

    # -- lifecycle ----------------------------------------------------------------
    def shutdown(self, ssc: Any = None, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Stop the cluster: end the feeds, wait for chief/workers, then stop ps/evaluator.

        Idempotent.  Raises :class:`TFClusterError` when a node failed, and
        ``TimeoutError`` when the workers did not finish within ``timeout`` s
        (a negative ``timeout`` waits for ever, as in TensorFlowOnSpark; the
        cluster is torn down either way).  Streaming feeds are stopped first (the
        micro-batch in flight is fed), and so is ``ssc``: a ``StreamingQuery``,
        a :class:`StreamingFeed` or a DStream ``StreamingContext``.
        """
        self._stop_streams(ssc)
        if self._closed:
            return
        try:
            with self.state.lock:
                self.state.stop_requested = True
            self.state.notify()
            deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
            while True:
                view = self.state.snapshot()
                if view.state == S.C_FAILED:
                    raise _error_for(view)
                trainers = [n for n in view.nodes if self._waits_for(n)]
                if all(n.state in S.TERMINAL for n in trainers):
                    break
                if deadline is not None and time.monotonic() > deadline:
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
        self._controller.lost_feeds = 0
        job.start()
        try:
            while not job.wait(0.2):
                if self.state.snapshot().state == S.C_FAILED or self._controller.feed_errors:
                    job.cancel(join_timeout=0)  # a node or a feeding task failed: retries would not help
                    break
            view = self.state.snapshot()
            if view.state != S.C_FAILED and self._controller.lost_feeds:
                # A feeding task lost its node before the node's supervisor said why: wait for its report (a dead
                # node process is reported at once, a dead supervisor after the heartbeat timeout), so the error
                # names the node and its cause rather than a broken connection.
                deadline = time.monotonic() + self._controller.heartbeat_timeout + 2
                while view.state != S.C_FAILED and time.monotonic() < deadline:
                    with self.state.changed:
                        self.state.changed.wait(0.2)
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
