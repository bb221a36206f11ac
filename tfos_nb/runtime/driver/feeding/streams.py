"""The streaming feeds of :class:`~tfos_nb.runtime.driver.cluster.TFCluster`: feeding it from Structured Streaming.

``TFCluster.train_stream`` / ``inference_stream`` check the cluster and start a query here
(see :mod:`.streaming` for the :class:`StreamingFeed` that owns it); ``request_stop`` /
``stop_streams`` and ``shutdown`` end them.  :class:`ClusterStreams` holds a cluster's feeds and is
the owner they report to (``streaming.FeedOwner``); it reaches the cluster through its job and its
:class:`.batch.BatchFeed` only: a training stream's micro-batch is fed like a ``train()``
epoch's partitions.

On Spark Connect a training stream's ``foreachBatch`` function runs on the
Connect server: it is the self-contained feeder of
:mod:`tfos_nb.runtime.executor.feeding.stream` there, and the feed's counts and errors come
from the coordinator through the notebook's mirror (see :mod:`.streaming`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...protocol.remote import StreamCounts

from ...executor.feeding.stream import make_batch_feeder
from ..job import DriverJob
from .batch import BatchFeed
from .streaming import StreamingFeed, apply_writer_options, checkpoint_dir, sink_writer

__all__ = ["ClusterStreams", "require_sink"]

_FILE_SINKS = ("parquet", "json", "csv", "orc", "text")


def require_sink(schema: Any, sink: Any, *, path: str | None, query_name: str | None,
                 options: dict[str, Any] | None) -> None:
    """What ``inference_stream()`` writes to: a ValueError up front for a sink that lacks what it needs."""
    if schema is None:
        msg = "inference_stream() needs schema= (a DDL string or StructType for the result columns)"
        raise ValueError(msg)
    if sink == "memory" and not query_name:
        msg = "a memory sink needs query_name= (the table the predictions appear in)"
        raise ValueError(msg)
    if isinstance(sink, str) and sink in _FILE_SINKS and not (path or (options or {}).get("path")):
        msg = f"a {sink} sink needs path= (the directory the predictions are written to)"
        raise ValueError(msg)


class ClusterStreams:
    """One cluster's streaming feeds (``job``'s, fed through ``feed``), and the owner they report to."""

    def __init__(self, job: DriverJob, feed: BatchFeed) -> None:
        self._job = job
        self._feed = feed
        self.state = job.state
        self.controller = job.controller
        self._feeds: list[StreamingFeed] = []

    @property
    def running(self) -> tuple[StreamingFeed, ...]:
        """The feeds not stopped yet."""
        return tuple(self._feeds)

    def train(self, stream_df: Any, *, feed_timeout: float, batch_rows: int, checkpoint_location: str | None,
              query_name: str | None, trigger: dict[str, Any] | None) -> StreamingFeed:
        """Start feeding ``stream_df`` (checked by the cluster) to the nodes as one unbounded epoch."""
        self.require_no_training()
        on_server = self._job.streams_on_server
        location, owned = checkpoint_dir(checkpoint_location)
        if on_server:
            self.controller.reset_feed_errors()  # the stream's feeding errors are those after this
        epoch = self.controller.open_epoch()
        feed = StreamingFeed(self, "train", epoch, owned, feed_timeout=feed_timeout, batch_rows=batch_rows,
                             on_server=on_server)
        on_batch = make_batch_feeder(self._feed.meta, epoch, feed_timeout, batch_rows) if on_server else feed._on_batch
        writer = apply_writer_options(stream_df.writeStream.foreachBatch(on_batch), query_name=query_name,
                                      trigger=trigger, checkpoint=location)
        feed._start(writer)
        self._feeds.append(feed)
        return feed

    def inference(self, preds: Any, sink: str | Callable[[Any, int], None], *, path: str | None,
                  query_name: str | None, options: dict[str, Any] | None, output_mode: str,
                  checkpoint_location: str | None, trigger: dict[str, Any] | None, feed_timeout: float,
                  batch_rows: int) -> StreamingFeed:
        """Start writing ``preds`` (the nodes' results for a streaming DataFrame) to ``sink``."""
        location, owned = checkpoint_dir(checkpoint_location)
        writer = apply_writer_options(sink_writer(preds, sink, path, output_mode), query_name=query_name,
                                      trigger=trigger, checkpoint=location, options=options)
        feed = StreamingFeed(self, "inference", 0, owned, feed_timeout=feed_timeout, batch_rows=batch_rows)
        feed._start(writer)
        self._feeds.append(feed)
        return feed

    def require_no_training(self) -> None:
        """A RuntimeError while a training stream feeds the cluster (other data would mix into its epoch)."""
        for feed in [f for f in self._feeds if f.kind == "train"]:
            if feed.is_active:
                msg = "a training stream feeds this cluster: stop it (feed.stop()) before feeding other data"
                raise RuntimeError(msg)
            feed.stop()  # its query ended by itself (availableNow trigger, error): close its epoch

    def stop_feeds(self, ssc: Any = None) -> None:
        """Stop what feeds the cluster before the cluster: streaming feeds, a query or StreamingContext."""
        for feed in list(self._feeds):
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

    # -- what a StreamingFeed asks of its owner (streaming.FeedOwner) --------------------
    @property
    def closed(self) -> bool:
        """Whether the cluster is torn down."""
        return self._job.closed

    def close(self, wait: float | None = None) -> None:
        """Tear the cluster down (a feed saw it fail, or was interrupted)."""
        self._job.close(wait)

    def stream_ended(self, feed: StreamingFeed) -> None:
        if feed in self._feeds:
            self._feeds.remove(feed)

    def feed_micro_batch(self, batch_df: Any, epoch: int, batch_id: int, feed_timeout: float,
                         batch_rows: int) -> list[dict[str, int]]:
        """One micro-batch of a training stream: one Spark job, watched like a train() epoch."""
        self._feed.require_alive()
        action = self._feed.action(batch_df, epoch, feed_timeout, batch_rows)
        counts: list[dict[str, int]] = self._feed.watch(
            f"feed-{epoch}", f"tfos_nb {self._feed.cluster_name}: stream micro-batch {batch_id}", action,
            f"feeding micro-batch {batch_id}")
        return counts

    def refresh_state(self) -> None:
        """Spark Connect: wait for a fresh snapshot of the coordinator (a no-op on a classic session)."""
        self._job.refresh()

    def stream_counts(self, epoch: int) -> StreamCounts | None:
        """Spark Connect: what the coordinator counted for the training stream of ``epoch`` (None on classic)."""
        return self._job.stream_counts(epoch)
