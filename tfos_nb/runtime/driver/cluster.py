"""TFCluster: start a TensorFlow cluster on Spark executors, feed it, shut it down.

The API is TensorFlowOnSpark's (``TFCluster.run`` / ``train`` / ``inference`` /
``shutdown``), so a TensorFlowOnSpark 2.x program migrates by changing its
import line.  What differs is underneath: gang-scheduled launch with a fast
"not enough executors" check, signed JSON control messages, heartbeats that
turn a dead node into an error within seconds, Arrow batches instead of one
RPC per row, and a teardown that leaves no process behind.
"""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..executor.feeding.infer import make_arrow_inferer, make_rdd_inferer
from .control import stacks, state
from .control.plane import ControlPlane
from .control.roles import awaited, awaited_nodes
from .errors import TAIL_IN_ERRORS, TFClusterError, error_for
from .feeding.batch import BatchFeed, refuse_dstream, require_batch_rows, require_default_queue
from .feeding.named_sets import feed_set, named_sets, warn_unread_sets
from .feeding.streaming import StreamingFeed, is_streaming, require_stream
from .feeding.streams import ClusterStreams, require_sink
from .job import DriverJob
from .launch.awaiting import waited_for

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_EPOCHS", "TAIL_IN_ERRORS", "InputMode", "TFCluster", "TFClusterError", "awaited"]

DEFAULT_EPOCHS = 10  # train(..., num_epochs=0): TensorFlowOnSpark feeds the data 10 times


class InputMode:
    """Where a cluster's data comes from."""

    TENSORFLOW = 0  #: the node function reads its own data (files, TFRecords)
    SPARK = 1  #: the driver feeds RDD/DataFrame partitions with ``train()`` / ``inference()``


class TFCluster:
    """A running TensorFlow cluster on Spark executors (made by :func:`run`).

    Its Spark jobs that feed the nodes are a :class:`.feeding.batch.BatchFeed`'s; its streaming feeds are
    held by a :class:`.feeding.streams.ClusterStreams`; both reach the cluster through its job only.
    """

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
        self._feed = BatchFeed(job, meta)
        self._streams = ClusterStreams(job, self._feed)
        self.last_feed: dict[str, int] = {}
        self.last_sets: dict[str, dict[str, int]] = {}  # named sets (validation=, feeds=): rows fed per set
        self.tracking: Any = None  # the job's MLflow run (tracking.run.JobRun), when tracked
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
    def nodes(self) -> tuple[state.NodeView, ...]:
        """Every node: role, host, executor, device, state, step, metrics…"""
        return self.state.snapshot().nodes

    def status(self) -> state.ClusterView:
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
        once, before the first epoch, as the named set ``"validation"``: each node
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
        self._feed.require_alive()
        for name, data in sets.items():
            passes = (int(num_epochs) or DEFAULT_EPOCHS) if qname != "input" else 1
            self.last_sets[name] = feed_set(self._feed, name, data, passes, feed_timeout, batch_rows, self.tracking)
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
        self._streams.require_no_training()
        total = self._feed.feed_epochs(dataRDD, int(num_epochs) or DEFAULT_EPOCHS, feed_timeout, batch_rows,
                                       skip_rows, self.tracking)
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
        self._feed.require_alive()
        from pyspark.sql import DataFrame

        if not isinstance(dataRDD, DataFrame) or schema is None:
            self._feed.refuse_rdd_on_connect("inference")
        if isinstance(dataRDD, DataFrame):
            if schema is not None:
                from pyspark.sql.types import StructType

                if not isinstance(schema, StructType):
                    schema = StructType.fromDDL(str(schema))
                return dataRDD.mapInArrow(make_arrow_inferer(self._meta, feed_timeout, batch_rows, schema), schema)
            dataRDD = dataRDD.rdd  # noqa: N806 - the TFoS argument, as an RDD
        return dataRDD.mapPartitionsWithIndex(make_rdd_inferer(self._meta, feed_timeout, batch_rows))

    # -- streams -----------------------------------------------------------------
    def train_stream(self, stream_df: Any, *, feed_timeout: float = 600, batch_rows: int = 1024,
                     checkpoint_location: str | None = None, query_name: str | None = None,
                     trigger: dict[str, Any] | None = None) -> StreamingFeed:
        """Feed a streaming DataFrame to the chief/worker nodes until the query is stopped; returns at once.

        Each micro-batch is fed like one ``train()`` epoch's partitions (through
        ``writeStream.foreachBatch``); the whole stream is one epoch, so nodes read
        with ``next_batch``/``should_stop`` (or one ``as_dataset()`` iteration).
        The returned :class:`StreamingFeed` owns the query: ``process_all_available()``,
        ``stop()``, ``wait()``, ``rows``.  ``shutdown()`` stops it first.
        ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g.
        ``{"availableNow": True}``); without ``checkpoint_location`` a temporary one
        is used and removed at stop.  On Spark Connect the micro-batches are fed
        from the Connect server (its ``foreachBatch`` process), with the feeder
        ``train(df)`` uses.
        """
        require_batch_rows(batch_rows)
        self._require_spark_mode("train_stream")
        self._feed.require_alive()
        require_stream(stream_df, "train_stream")
        return self._streams.train(stream_df, feed_timeout=feed_timeout, batch_rows=batch_rows,
                                   checkpoint_location=checkpoint_location, query_name=query_name, trigger=trigger)

    def inference_stream(self, stream_df: Any, schema: Any, sink: str | Callable[[Any, int], None] = "memory", *,
                         path: str | None = None, query_name: str | None = None,
                         options: dict[str, Any] | None = None, output_mode: str = "append",
                         checkpoint_location: str | None = None, trigger: dict[str, Any] | None = None,
                         feed_timeout: float = 600, batch_rows: int = 1024) -> StreamingFeed:
        """Run a streaming DataFrame through the nodes' ``batch_results`` and write the results to ``sink``.

        ``schema`` (DDL string or StructType) names the result columns, as in
        ``inference(df, schema=...)``; ``sink`` is a streaming format (``"memory"``
        with ``query_name``, ``"parquet"``/``"json"`` with ``path``, ``"kafka"`` with
        ``options``…) or a function ``(predictions_df, batch_id)`` for
        ``foreachBatch``.  Returns the query's :class:`StreamingFeed` at once;
        ``shutdown()`` stops it first.
        """
        require_batch_rows(batch_rows)
        self._require_spark_mode("inference_stream")
        self._feed.require_alive()
        require_stream(stream_df, "inference_stream")
        require_sink(schema, sink, path=path, query_name=query_name, options=options)
        preds = self.inference(stream_df, feed_timeout, schema=schema, batch_rows=batch_rows)
        return self._streams.inference(preds, sink, path=path, query_name=query_name, options=options,
                                       output_mode=output_mode, checkpoint_location=checkpoint_location,
                                       trigger=trigger, feed_timeout=feed_timeout, batch_rows=batch_rows)

    @property
    def streams(self) -> tuple[StreamingFeed, ...]:
        """The streaming feeds still running on this cluster."""
        return self._streams.running

    def stop_streams(self) -> None:
        """Stop every streaming feed of this cluster (the micro-batches in flight are fed first), from any thread.

        A training stream's epoch ends with it: nodes iterating ``as_dataset()`` see
        the end of their data, their ``model.fit`` returns, a blocked ``train(stream_df)``
        returns, and ``shutdown()`` or a ``%%tfos_cluster --data STREAM`` cell goes on to
        wait for the nodes.
        """
        self._streams.stop_feeds()

    #: The same method under TensorFlowOnSpark's name (``reservation.Client(...).request_stop()``),
    #: for programs ported from it (docs/migrating.md).
    request_stop = stop_streams

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
        self._streams.stop_feeds(ssc)
        if self.closed:
            return
        try:
            self._controller.request_stop()
            deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
            looked = 0.0
            while True:  # the nodes' states are read, no snapshot is made
                with self.state.lock:
                    failed = self.state.state == state.C_FAILED
                    waiting = [n for n in awaited_nodes(self.state.nodes) if n.state not in state.TERMINAL]
                if failed:
                    raise error_for(self.state.snapshot())
                if not waiting:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    with self.state.lock:
                        named = waited_for(waiting)
                    msg = f"shutdown timed out after {timeout:.0f} s waiting for {named} to finish"
                    raise TimeoutError(msg)
                looked = self.state.wait_a_change(0.2, looked)
            end = time.monotonic() + (grace_secs or 0)
            while time.monotonic() < end:  # the evaluator's grace: until it returned, failed, or the grace is over
                with self.state.lock:
                    over = self.state.state == state.C_FAILED or all(
                        n.state in state.TERMINAL for n in self.state.nodes if n.job_name == "evaluator")
                if over:
                    break
                looked = self.state.wait_a_change(min(0.2, max(0.0, end - time.monotonic())), looked)
            self.close()
            view = self.state.snapshot()
            if view.state == state.C_FAILED:
                raise error_for(view)
            warn_unread_sets(self._controller)
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
    def _require_spark_mode(self, what: str) -> None:
        if self.input_mode != InputMode.SPARK:
            msg = f"{what}() needs a cluster started with input_mode=InputMode.SPARK"
            raise ValueError(msg)
