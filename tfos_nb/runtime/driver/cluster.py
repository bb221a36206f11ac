"""TFCluster: start a TensorFlow cluster on Spark executors, feed it, shut it down.

The API is TensorFlowOnSpark's (``TFCluster.run`` / ``train`` / ``inference`` /
``shutdown``), so a TensorFlowOnSpark 2.x program migrates by changing its
import line.  What differs is underneath: gang-scheduled launch with a fast
"not enough executors" check, signed JSON control messages, heartbeats that
turn a dead node into an error within seconds, Arrow batches instead of one
RPC per row, and a teardown that leaves no process behind.
"""

from __future__ import annotations

import collections
import logging
import numbers
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..executor.feeder import (
    feed_totals,
    make_arrow_inferer,
    make_rdd_inferer,
)
from . import stacks
from . import state as S
from .cluster_sets import ClusterSets, named_sets
from .cluster_streams import (
    ClusterStreams,
    feeding_action,
    refuse_dstream,
    require_batch_rows,
    require_default_queue,
)
from .control_plane import ControlPlane
from .errors import TAIL_IN_ERRORS, TFClusterError, error_for, python_error_line
from .job import DriverJob
from .mlflow_inputs import log_train_input
from .roles import awaited
from .streaming import StreamingFeed, is_streaming

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_EPOCHS", "TAIL_IN_ERRORS", "InputMode", "TFCluster", "TFClusterError", "awaited"]

DEFAULT_EPOCHS = 10  # train(..., num_epochs=0): TensorFlowOnSpark feeds the data 10 times


class InputMode:
    """Where a cluster's data comes from."""

    TENSORFLOW = 0  #: the node function reads its own data (files, TFRecords)
    SPARK = 1  #: the driver feeds RDD/DataFrame partitions with ``train()`` / ``inference()``


class TFCluster(ClusterSets, ClusterStreams):
    """A running TensorFlow cluster on Spark executors (made by :func:`run`)."""

    def __init__(self, job: DriverJob, meta: dict[str, Any], input_mode: int, num_executors: int) -> None:
        self._job = job
        self.sc = job.sc
        self.state = job.state
        self._controller: ControlPlane = job.controller
        self._meta = meta
        self.input_mode = input_mode
        self.num_executors = num_executors
        self.cluster_id = job.cluster_id
        self.name = job.name
        self._streams: list[StreamingFeed] = []  # active Structured Streaming feeds
        self.last_feed: dict[str, int] = {}
        self.last_sets: dict[str, dict[str, int]] = {}  # named sets (validation=, feeds=): rows fed per set
        self.tracking: Any = None  # the job's MLflow run (mlflow_run.JobRun), when tracked
        self.cluster_meta = {"id": self.cluster_id, "num_executors": num_executors}

    @property
    def closed(self) -> bool:
        """Whether the cluster is torn down (``shutdown()`` or ``close()`` returned, or it failed)."""
        return self._job.closed

    def close(self, wait: float | None = None) -> None:
        """Tear the cluster down now: kill its nodes, cancel its Spark jobs (idempotent, thread-safe, never raises)."""
        self._job.close(wait)

    def cancel(self, reason: str) -> None:
        """Stop the cluster from any thread: see :meth:`DriverJob.cancel`."""
        self._job.cancel(reason)

    # -- information -------------------------------------------------------------
    @property
    def nodes(self) -> tuple[S.NodeView, ...]:
        """Every node: role, host, executor, device, state, step, metrics…"""
        return self.state.snapshot().nodes

    def status(self) -> S.ClusterView:
        """A snapshot of the whole cluster."""
        return self.state.snapshot()

    def logs(self, node: str | int | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """Output lines of one node (``"worker:1"`` or its index) or of all; ``KeyError`` for an unknown node."""
        return self.state.logs_by_label(node, tail)

    def stacks(self, node: str | int | None = None, timeout: float = 10.0) -> dict[str, str]:
        """Every thread's Python stack in the node processes (one node: ``"worker:1"`` or its index), by node:
        what each is doing now, e.g. which call a stalled node waits in (``status().stalls``)."""
        return stacks.collect(self.state, self._controller, node, timeout)

    def tensorboard_url(self) -> str | None:
        """TensorBoard's URL on the chief, when started with ``tensorboard=True``."""
        return self.state.snapshot().tensorboard

    # -- data ------------------------------------------------------------------
    def train(self, dataRDD: Any, num_epochs: int = 0, feed_timeout: float = 600, qname: str = "input",  # noqa: N803 - TFoS name
              *, batch_rows: int = 1024, validation: Any = None, feeds: dict[str, Any] | None = None,
              skip_rows: Mapping[int, list[tuple[int, int]]] | None = None) -> None:
        """Feed an RDD or DataFrame to the chief/worker nodes, ``num_epochs`` times (0, the default: 10 times,
        as TensorFlowOnSpark does).

        Partitions go to nodes as Arrow batches; each epoch is one Spark job, and
        nodes reading with ``as_dataset()`` see one dataset iteration per epoch.
        Returns when every row was taken by a node, or skipped because the node it
        went to stopped reading (its function called ``terminate()`` or returned);
        ``last_feed`` counts both.  A node that failed is an error.

        ``validation`` (a DataFrame or RDD with the training data's columns) is fed
        once, before the first epoch, as the named feed ``"validation"``: each node
        keeps its share and reads it whole at every iteration of
        ``ctx.get_data_feed(qname_in="validation").as_dataset(...)``, for
        ``model.fit(ds, validation_data=val_ds)``.  ``feeds`` adds sets under other
        names (e.g. ``{"test": test_df}``).  ``qname`` other than ``"input"``
        (TensorFlowOnSpark's named queue) feeds ``dataRDD`` itself as that named
        set, read ``num_epochs`` times by ``next_batch`` (``last_sets`` counts each set).
        ``skip_rows`` (partition -> ``[start, end)`` row ranges) leaves those rows out of the
        first epoch: a retried job's resumed epoch, without the rows its backup had trained on.
        """
        refuse_dstream(dataRDD, "train")
        require_batch_rows(batch_rows)
        if not isinstance(num_epochs, numbers.Integral) or isinstance(num_epochs, bool) or num_epochs < 0:
            msg = f"num_epochs must be a non-negative integer (0: 10 epochs), got {num_epochs!r}"
            raise ValueError(msg)
        sets = named_sets(dataRDD, qname, validation, feeds)
        self._require_spark_mode("train")
        self._require_alive()
        for name, data in sets.items():
            self._feed_set(name, data, (int(num_epochs) or DEFAULT_EPOCHS) if qname != "input" else 1, feed_timeout,
                           batch_rows)
        if qname != "input":  # TensorFlowOnSpark's named queue: the data was this set
            return
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
        if not is_df:
            self._refuse_rdd_on_connect("train")
        total = {"rows": 0, "skipped": 0, "partitions": 0}
        # Two epochs' jobs in flight: the next one is submitted once this one's feeding stage runs and all its
        # tasks started (so the next one's tasks cannot take a slot this one still needs); its rows wait in their
        # own queue on the nodes. Not on Spark Connect, where end_epoch is itself a Spark job that would queue
        # behind the next epoch's tasks.
        pipelined = self._controller.pipelines_epochs and os.environ.get("TFOS_FEED_PIPELINE", "1") != "0"
        inflight: collections.deque[tuple[int, Any]] = collections.deque()

        told: set[int] = set()
        told_tracking: list[int] = []  # the epoch whose rows went to MLflow with the DataFrame (the first)

        def learn_shares() -> None:
            """Tell the controller each running epoch's number of feeding tasks, so that once all of them went to
            nodes each node can end its read at its share's end (nodes with unequal shares under
            MultiWorkerMirroredStrategy step together: waiting for the whole epoch's end would deadlock)."""
            for epoch, job in inflight:
                if epoch not in told and not job.done and self._controller.feeding_started(epoch):
                    tasks = job.feeding_tasks()
                    if tasks is not None:
                        self._controller.set_feed_tasks(epoch, tasks)
                        told.add(epoch)

        def finish_oldest() -> None:
            epoch, job = inflight[0]
            stats = feed_totals(self._await(job, "feeding", tick=learn_shares))
            inflight.popleft()
            if is_df and self.tracking is not None and not told_tracking:  # the first epoch: its exact rows
                told_tracking.append(epoch)
                log_train_input(self.tracking, dataRDD, stats["rows"] + stats["skipped"])
            for key, n in stats.items():
                total[key] += n
            self._controller.end_epoch(epoch)

        self._controller.reset_feed_errors()
        epochs = int(num_epochs) or DEFAULT_EPOCHS
        for i in range(epochs):
            while len(inflight) >= (2 if pipelined else 1):
                finish_oldest()
            if inflight:  # feeding_started: a DataFrame's job may first run its shuffle as a job of its own
                last_epoch, last = inflight[-1]
                self._await(last, "feeding", tick=learn_shares,
                            until=lambda: self._controller.feeding_started(last_epoch) and last.tasks_launched())
            epoch = self._controller.open_epoch(remaining=epochs - 1 - i)
            action = feeding_action(dataRDD, self._meta, epoch, feed_timeout, batch_rows,
                                    skip=skip_rows if i == 0 else None)
            inflight.append((epoch, self._job.spark_job(f"feed-{epoch}", f"tfos_nb {self.name}: feed epoch {epoch}",
                                                       action)))
        while inflight:
            finish_oldest()
        self.last_feed = total
        if total["skipped"]:
            log.warning("tfos_nb: %d row(s) were not read: the nodes' functions returned first", total["skipped"])

    def inference(self, dataRDD: Any, feed_timeout: float = 600, qname: str = "input", *,  # noqa: N803 - TFoS name
                  schema: Any = None, batch_rows: int = 1024) -> Any:
        """Results of the nodes' ``batch_results``, one per input row, in order (lazy).

        An RDD gives an RDD; a DataFrame with ``schema`` (a DDL string or
        StructType for the result columns) gives a DataFrame through Arrow.
        """
        refuse_dstream(dataRDD, "inference")
        require_default_queue(qname, "inference")
        require_batch_rows(batch_rows)
        self._require_spark_mode("inference")
        self._require_alive()
        from pyspark.sql import DataFrame

        if not isinstance(dataRDD, DataFrame) or schema is None:
            self._refuse_rdd_on_connect("inference")
        if isinstance(dataRDD, DataFrame):
            if schema is not None:
                from pyspark.sql.types import StructType

                if not isinstance(schema, StructType):
                    schema = StructType.fromDDL(str(schema))
                return dataRDD.mapInArrow(make_arrow_inferer(self._meta, feed_timeout, batch_rows, schema), schema)
            dataRDD = dataRDD.rdd  # noqa: N806 - the TFoS argument, as an RDD
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

        The evaluator (``run(..., eval_node=True)``) is not waited for: once every
        chief/worker returned, it has ``grace_secs`` more seconds to evaluate the last
        checkpoint, and the wait ends as soon as its function returns (e.g. Keras'
        ``SidecarEvaluator(..., max_evaluations=epochs)`` returns after the last epoch's
        checkpoint).  Still running then, it is stopped (SIGTERM to its process tree,
        SIGKILL 2 s later) and shows as ``stopped``; either way the cluster ends
        ``finished``, and an evaluator that raised fails it like any node.  ps nodes
        serve until the end and are stopped; without an evaluator ``grace_secs`` waits
        for nothing (the chief/workers returned already).
        """
        self._stop_feeds(ssc)
        if self.closed:
            return
        try:
            self._controller.request_stop()
            deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
            while True:
                view = self.state.snapshot()
                if view.state == S.C_FAILED:
                    raise error_for(view)
                trainers = [n for n in view.nodes if self._waits_for(n)]
                if all(n.state in S.TERMINAL for n in trainers):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    waiting = [n.label for n in trainers if n.state not in S.TERMINAL]
                    msg = f"shutdown timed out after {timeout:.0f} s waiting for {', '.join(waiting)} to finish"
                    raise TimeoutError(msg)
                with self.state.changed:
                    self.state.changed.wait(0.2)
            end = time.monotonic() + (grace_secs or 0)
            while time.monotonic() < end:  # the evaluator's grace: until it returned, failed, or the grace is over
                view = self.state.snapshot()
                if view.state == S.C_FAILED or all(n.state in S.TERMINAL for n in view.nodes if n.job_name == "evaluator"):
                    break
                with self.state.changed:
                    self.state.changed.wait(min(0.2, max(0.0, end - time.monotonic())))
            self.close()
            view = self.state.snapshot()
            if view.state == S.C_FAILED:
                raise error_for(view)
            self._warn_unread_sets()
        finally:
            self.close()

    def __enter__(self) -> TFCluster:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.shutdown()
        else:
            self.close()

    # -- internals ----------------------------------------------------------------
    def _waits_for(self, node: Any) -> bool:
        """Whether shutdown waits for ``node``'s function to return (see :func:`awaited`)."""
        return awaited(self.state.nodes, node)

    def _require_spark_mode(self, what: str) -> None:
        if self.input_mode != InputMode.SPARK:
            msg = f"{what}() needs a cluster started with input_mode=InputMode.SPARK"
            raise ValueError(msg)

    def _refuse_rdd_on_connect(self, what: str) -> None:
        if not self._job.rdds_available:
            msg = (f"{what}() on Spark Connect takes a DataFrame"
                   + (" and the result schema (inference(df, schema='...'))" if what == "inference" else "")
                   + ": a Spark Connect session has no RDDs")
            raise ValueError(msg)

    def _require_alive(self) -> None:
        view = self.state.snapshot()
        if view.state == S.C_FAILED:
            self.close()
            raise error_for(view)
        if self.closed or view.state in (S.C_STOPPED, S.C_FINISHED):
            msg = f"cluster {self.name} is shut down"
            raise RuntimeError(msg)

    def _watch(self, suffix: str, description: str, action: Callable[[], Any], what: str) -> Any:
        """Run ``action`` as a Spark job while watching the nodes; tear down on any failure."""
        self._controller.reset_feed_errors()
        return self._await(self._job.spark_job(suffix, description, action), what)

    def _await(self, job: Any, what: str, until: Callable[[], bool] | None = None,
               tick: Callable[[], None] | None = None) -> Any:
        """Wait for ``job`` to end (or for ``until()``, leaving it running) while watching the nodes and the
        feeding tasks, calling ``tick()`` every slice; tear down on any failure."""
        ctl = self._controller
        try:
            while not job.wait(0.2):
                if tick is not None:
                    tick()
                if until is not None and until():
                    return None
                if self.state.snapshot().state == S.C_FAILED or ctl.feed_errors:
                    job.cancel(join_timeout=0)  # a node or a feeding task failed: retries would not help
                    break
            view = self.state.snapshot()
            if view.state != S.C_FAILED and ctl.lost_feeds:
                # A feeding task lost its node before the node's supervisor said why: wait for its report (a dead
                # node process is reported at once, a dead supervisor after the heartbeat timeout), so the error
                # names the node and its cause rather than a broken connection.
                deadline = time.monotonic() + ctl.heartbeat_timeout + 2
                while view.state != S.C_FAILED and time.monotonic() < deadline:
                    with self.state.changed:
                        self.state.changed.wait(0.2)
                    view = self.state.snapshot()
            if view.state == S.C_FAILED:
                self.close()
                raise error_for(view)
            if job.error is not None or ctl.feed_errors:
                errors = ctl.feed_errors
                cause = errors[0] if errors else python_error_line(job.error)
                self.close()
                view = self.state.snapshot()
                if view.state == S.C_FAILED and view.nodes and any(n.state == S.FAILED for n in view.nodes):
                    raise error_for(view) from None
                msg = f"{what} failed: {cause}"
                raise RuntimeError(msg) from None
            return job.result()
        except KeyboardInterrupt:
            job.cancel()
            self.close()
            raise
        finally:
            self._job.forget(job)
