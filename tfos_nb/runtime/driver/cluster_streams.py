"""The streaming half of :class:`~tfos_nb.runtime.driver.cluster.TFCluster`: feeding it from Structured Streaming.

``train_stream`` / ``inference_stream`` start a query that feeds the cluster
(see :mod:`.streaming` for the :class:`StreamingFeed` that owns it);
``request_stop`` / ``stop_streams`` end them.

On Spark Connect a training stream's ``foreachBatch`` function runs on the
Connect server: it is the self-contained feeder of
:mod:`..executor.stream_feeder` there, and the feed's counts and errors come
from the coordinator through the notebook's mirror (see :mod:`.streaming`).
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..protocol.remote import StreamCounts
    from . import state as S
    from .control_plane import ControlPlane
    from .job import DriverJob

from ..executor.feeder import make_arrow_feeder, make_rdd_feeder
from ..executor.stream_feeder import make_batch_feeder
from .streaming import StreamingFeed, apply_writer_options, checkpoint_dir, require_stream, sink_writer

__all__ = ["ClusterStreams", "feeding_action", "refuse_dstream", "require_batch_rows"]


def feeding_action(data: Any, meta: dict[str, Any], epoch: int, feed_timeout: float,
                   batch_rows: int, name: str = "input",
                   skip: Mapping[int, list[tuple[int, int]]] | None = None) -> Callable[[], list[dict[str, int]]]:
    """The Spark action that feeds a DataFrame's (``mapInArrow``) or an RDD's partitions to the nodes as epoch
    ``epoch`` (a ``train()`` epoch or a stream's micro-batch), or as version ``epoch`` of the named feed ``name``;
    it returns each partition's counts.  ``skip``: partition -> row ranges not fed (a resumed epoch's)."""
    from pyspark.sql import DataFrame

    if not isinstance(data, DataFrame):
        rdd_fn = make_rdd_feeder(meta, epoch, feed_timeout, batch_rows, name, skip)
        return lambda: [json.loads(s) for s in data.mapPartitionsWithIndex(rdd_fn).collect()]
    fn = make_arrow_feeder(meta, epoch, feed_timeout, batch_rows, name, skip)
    return lambda: [r.asDict() for r in data.mapInArrow(fn, "partition int, rows long, skipped long").collect()]


def refuse_dstream(data: Any, what: str) -> None:
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


def require_batch_rows(batch_rows: Any) -> None:
    """``batch_rows`` (rows per Arrow batch a feeding task sends) is a positive integer: a ValueError up front,
    not a feeding task's error on an executor."""
    if not isinstance(batch_rows, numbers.Integral) or isinstance(batch_rows, bool) or batch_rows < 1:
        raise ValueError(f"batch_rows must be a positive integer, got {batch_rows!r}")


def require_default_queue(qname: Any, what: str) -> None:
    """TensorFlowOnSpark's ``qname`` names the node queue a feed goes to; inference answers rows of one,
    ``"input"``: any other name is a ValueError up front, not rows arriving mixed into it."""
    if qname != "input":
        raise ValueError(f"{what}(qname={qname!r}): inference feeds the nodes' 'input' feed (named feeds are sets "
                         "for training: train(..., validation=df) or train(df, qname=...)); leave qname at its default")


class ClusterStreams:
    """Mixed into TFCluster: its streaming feeds."""

    _streams: list[StreamingFeed]
    state: S.ClusterState
    cluster_id: str
    name: str
    sc: Any
    _meta: dict[str, Any]
    _controller: ControlPlane
    _job: DriverJob

    if TYPE_CHECKING:  # provided by TFCluster
        def _require_spark_mode(self, what: str) -> None: ...
        def _require_alive(self) -> None: ...
        @property
        def closed(self) -> bool: ...
        def _waits_for(self, node: Any) -> bool: ...
        def close(self, wait: float | None = None) -> None: ...
        def _watch(self, suffix: str, description: str, action: Callable[[], Any], what: str) -> Any: ...
        def inference(self, dataRDD: Any, feed_timeout: float = 600, qname: str = "input", *,  # noqa: N803 - TFoS name
                      schema: Any = None, batch_rows: int = 1024) -> Any: ...

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
        self._require_alive()
        require_stream(stream_df, "train_stream")
        self._require_no_training_stream()
        on_server = self._job.streams_on_server
        location, owned = checkpoint_dir(checkpoint_location)
        if on_server:
            self._controller.reset_feed_errors()  # the stream's feeding errors are those after this
        epoch = self._controller.open_epoch()
        feed = StreamingFeed(_StreamPort(self), "train", epoch, owned, feed_timeout=feed_timeout, batch_rows=batch_rows,
                             on_server=on_server)
        on_batch = make_batch_feeder(self._meta, epoch, feed_timeout, batch_rows) if on_server else feed._on_batch
        writer = apply_writer_options(stream_df.writeStream.foreachBatch(on_batch), query_name=query_name,
                                      trigger=trigger, checkpoint=location)
        feed._start(writer)
        self._streams.append(feed)
        return feed

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
        self._require_alive()
        require_stream(stream_df, "inference_stream")
        if schema is None:
            msg = "inference_stream() needs schema= (a DDL string or StructType for the result columns)"
            raise ValueError(msg)
        if sink == "memory" and not query_name:
            msg = "a memory sink needs query_name= (the table the predictions appear in)"
            raise ValueError(msg)
        if isinstance(sink, str) and sink in ("parquet", "json", "csv", "orc", "text") and not (
            path or (options or {}).get("path")
        ):
            msg = f"a {sink} sink needs path= (the directory the predictions are written to)"
            raise ValueError(msg)
        location, owned = checkpoint_dir(checkpoint_location)
        preds = self.inference(stream_df, feed_timeout, schema=schema, batch_rows=batch_rows)
        writer = apply_writer_options(sink_writer(preds, sink, path, output_mode), query_name=query_name,
                                      trigger=trigger, checkpoint=location, options=options)
        feed = StreamingFeed(_StreamPort(self), "inference", 0, owned, feed_timeout=feed_timeout, batch_rows=batch_rows)
        feed._start(writer)
        self._streams.append(feed)
        return feed

    @property
    def streams(self) -> tuple[StreamingFeed, ...]:
        """The streaming feeds still running on this cluster."""
        return tuple(self._streams)

    def stop_streams(self) -> None:
        """Stop every streaming feed of this cluster (the micro-batches in flight are fed first), from any thread.

        A training stream's epoch ends with it: nodes iterating ``as_dataset()`` see
        the end of their data, their ``model.fit`` returns, a blocked ``train(stream_df)``
        returns, and ``shutdown()`` or a ``%%tfos_cluster --data STREAM`` cell goes on to
        wait for the nodes.
        """
        self._stop_feeds(None)

    #: The same method under TensorFlowOnSpark's name (``reservation.Client(...).request_stop()``),
    #: for programs ported from it (docs/migrating.md).
    request_stop = stop_streams

    def _require_no_training_stream(self) -> None:
        for feed in [f for f in self._streams if f.kind == "train"]:
            if feed.is_active:
                msg = "a training stream feeds this cluster: stop it (feed.stop()) before feeding other data"
                raise RuntimeError(msg)
            feed.stop()  # its query ended by itself (availableNow trigger, error): close its epoch

    def _stop_feeds(self, ssc: Any = None) -> None:
        """Stop what feeds the cluster before the cluster: streaming feeds, a query or StreamingContext."""
        for feed in list(self._streams):
            feed.stop()
        if ssc is None:
            return
        if isinstance(ssc, StreamingFeed):
            ssc.stop()
        elif hasattr(ssc, "awaitTermination") and hasattr(ssc, "isActive"):  # a StreamingQuery
            try:
                ssc.stop()
            except Exception:  # noqa: BLE001 - the session may be stopping already
                pass
        elif hasattr(ssc, "stop"):  # a DStream StreamingContext (TensorFlowOnSpark's shutdown(ssc))
            try:
                ssc.stop(stopSparkContext=False, stopGraceFully=True)
            except Exception:  # noqa: BLE001
                pass


class _StreamPort:
    """What a :class:`StreamingFeed` asks of its cluster (``streaming.FeedOwner``): feeding a micro-batch,
    the coordinator's counts, the end of the feed.  TFCluster's own members stay those a user calls."""

    def __init__(self, cluster: ClusterStreams) -> None:
        self._cluster = cluster
        self.state = cluster.state
        self.controller = cluster._controller

    @property
    def closed(self) -> bool:
        return self._cluster.closed

    def waits_for(self, node: Any) -> bool:
        return self._cluster._waits_for(node)

    def close(self, wait: float | None = None) -> None:
        self._cluster.close(wait)

    def stop_feeds(self) -> None:
        self._cluster._stop_feeds(None)

    def stream_ended(self, feed: StreamingFeed) -> None:
        if feed in self._cluster._streams:
            self._cluster._streams.remove(feed)

    def feed_micro_batch(self, batch_df: Any, epoch: int, batch_id: int, feed_timeout: float,
                         batch_rows: int) -> list[dict[str, int]]:
        """One micro-batch of a training stream: one Spark job, watched like a train() epoch."""
        cluster = self._cluster
        cluster._require_alive()
        action = feeding_action(batch_df, cluster._meta, epoch, feed_timeout, batch_rows)
        counts: list[dict[str, int]] = cluster._watch(f"feed-{epoch}",
                                                      f"tfos_nb {cluster.name}: stream micro-batch {batch_id}",
                                                      action, f"feeding micro-batch {batch_id}")
        return counts

    def refresh_state(self) -> None:
        """Spark Connect: wait for a fresh snapshot of the coordinator (a no-op on a classic session)."""
        self._cluster._job.refresh()

    def stream_counts(self, epoch: int) -> StreamCounts | None:
        """Spark Connect: what the coordinator counted for the training stream of ``epoch`` (None on classic)."""
        return self._cluster._job.stream_counts(epoch)
