"""Feeding a running cluster from Spark Structured Streaming.

A stream is one unbounded epoch.  ``TFCluster.train_stream`` starts a query whose
``foreachBatch`` feeds every micro-batch to the chief/worker nodes exactly like
one ``train()`` epoch's partitions (Arrow batches, the driver picks the node),
except that the epoch stays open: nodes read with ``next_batch`` /
``should_stop`` (or one ``as_dataset()`` iteration) until the query stops.  A
micro-batch is committed only once the nodes took all its rows, so every row
is fed once while the query runs; stopping the query lets the micro-batch in
flight finish first.

``TFCluster.inference_stream`` maps the stream through the nodes
(``mapInArrow``, as ``inference()`` does for a DataFrame) and writes the
predictions to any streaming sink (memory, files, Kafka, ``foreachBatch``).

Both return a :class:`StreamingFeed`: the query's owner.  ``stop()`` stops the
query (and ends the training epoch); ``TFCluster.shutdown()`` stops every
active feed before it stops the cluster.

On Spark Connect the ``foreachBatch`` function runs on the Connect server, not
here: a training stream's function is then the self-contained one of
:mod:`tfos_nb.runtime.executor.feeding.stream` (same feeder as ``train(df)``), which tells the
cluster's coordinator what each micro-batch fed; the feed reads those counts
and a micro-batch's error from the notebook's mirror of the coordinator
(``on_server``), and :meth:`FeedOwner.refresh_state` brings the mirror up to
date before it answers.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...executor.feeding.feeder import feed_totals
from ...protocol.remote import StreamCounts
from ..control import state as cluster_state
from ..control.plane import ControlPlane
from ..control.roles import awaited_nodes
from ..errors import error_for, python_error_line

__all__ = ["StreamingFeed"]

_POLL_S = 0.5
_COUNTS = ("rows", "skipped", "partitions", "batches")
_START_TRIES = 5
_WORKER_START_FAILED = "Python worker failed to connect back"


class FeedOwner(Protocol):
    """What a StreamingFeed needs of its cluster: its owner, the cluster's :class:`.streams.ClusterStreams`
    (a protocol, so that this module does not import it)."""

    state: cluster_state.ClusterState
    controller: ControlPlane

    @property
    def closed(self) -> bool: ...
    def close(self, wait: float | None = None) -> None: ...
    def stop_feeds(self) -> None: ...
    def stream_ended(self, feed: StreamingFeed) -> None: ...
    def feed_micro_batch(self, batch_df: Any, epoch: int, batch_id: int, feed_timeout: float,
                         batch_rows: int) -> list[dict[str, int]]: ...
    def refresh_state(self) -> None: ...
    def stream_counts(self, epoch: int) -> StreamCounts | None: ...


def is_streaming(data: Any) -> bool:
    """Whether ``data`` is a streaming DataFrame (``spark.readStream...``)."""
    return bool(getattr(data, "isStreaming", False)) and hasattr(data, "writeStream")


def require_stream(data: Any, what: str) -> None:
    if not is_streaming(data):
        msg = (
            f"{what}() needs a streaming DataFrame (spark.readStream...), got {type(data).__name__}; "
            f"use {what.replace('_stream', '')}() for an RDD or a batch DataFrame"
        )
        raise TypeError(msg)


class StreamingFeed:
    """A Structured Streaming query that feeds a cluster; made by ``train_stream`` / ``inference_stream``.

    ``query`` is Spark's ``StreamingQuery``.  For training, ``rows``, ``skipped``
    and ``batches`` count what the nodes took so far (the panel's "rows fed"
    counts the same rows per node).  ``process_all_available()`` waits until
    everything the source has now is fed; ``stop()`` stops the query; ``wait()``
    blocks until the query ends or the cluster does.  A node's error is raised
    by ``wait()`` / ``process_all_available()`` as the cluster's
    :class:`~tfos_nb.runtime.driver.cluster.TFClusterError`.
    """

    def __init__(self, cluster: FeedOwner, kind: str, epoch: int = 0, checkpoint: str | None = None, *,
                 feed_timeout: float = 600, batch_rows: int = 1024, on_server: bool = False) -> None:
        self.kind = kind  # "train" or "inference"
        self.epoch = epoch  # a training stream is one unbounded epoch
        self.query: Any = None
        # Spark Connect: the foreachBatch function runs on the server; counts and errors come from the coordinator
        self.on_server = on_server
        self._counts = dict.fromkeys(_COUNTS, 0)
        self.error: BaseException | None = None
        self._cluster = cluster
        self._feed_timeout = feed_timeout
        self._batch_rows = batch_rows
        self._owned_checkpoint = checkpoint
        self._lock = threading.Lock()
        self._stopped = False

    # -- starting ------------------------------------------------------------------
    def _start(self, writer: Any) -> None:
        for attempt in range(_START_TRIES):
            try:
                self.query = writer.start()
                return
            except BaseException as exc:
                # Spark Connect starts the query's foreachBatch process on the server, and gives it a fixed 10 s
                # to connect back: on a loaded server that start can fail before the query exists. Try again.
                if attempt + 1 < _START_TRIES and _WORKER_START_FAILED in str(exc):
                    continue
                self.stop()  # ends the training epoch it opened, removes the temporary checkpoint
                raise

    def _on_batch(self, batch_df: Any, batch_id: int) -> None:
        """foreachBatch body (Spark's micro-batch thread): feed one micro-batch, return when it was taken."""
        try:
            stats = self._cluster.feed_micro_batch(batch_df, self.epoch, batch_id, self._feed_timeout,
                                                   self._batch_rows)
        except BaseException as exc:
            with self._lock:
                self.error = self.error or exc
            raise
        with self._lock:
            self._counts["batches"] += 1
            for key, n in feed_totals(stats).items():
                if key in self._counts:  # not "shared": a stream's counts are the coordinator's on Spark Connect too
                    self._counts[key] += n

    # -- information ---------------------------------------------------------------
    @property
    def is_active(self) -> bool:
        """Whether the query still runs."""
        try:
            return bool(self.query is not None and self.query.isActive)
        except Exception:  # noqa: BLE001 - the Spark session is gone
            return False

    @property
    def stats(self) -> dict[str, int]:
        """Rows the nodes took, rows skipped (the nodes had stopped reading), partitions and micro-batches fed."""
        if self.on_server and self.kind == "train":  # as the coordinator counted them at the last snapshot
            got = self._cluster.stream_counts(self.epoch) or StreamCounts()
            return {k: int(getattr(got, k)) for k in _COUNTS}
        with self._lock:
            return dict(self._counts)

    @property
    def rows(self) -> int:
        return self.stats["rows"]

    @property
    def skipped(self) -> int:
        return self.stats["skipped"]

    @property
    def partitions(self) -> int:
        return self.stats["partitions"]

    @property
    def batches(self) -> int:
        return self.stats["batches"]

    @property
    def progress(self) -> Any:
        """The query's last progress report (Spark's ``lastProgress``), or None."""
        try:
            return self.query.lastProgress if self.query is not None else None
        except Exception:  # noqa: BLE001
            return None

    # -- waiting ----------------------------------------------------------------------
    def process_all_available(self) -> None:
        """Block until everything the source has now was fed (and, for inference, written).

        Raises the cluster's error when a node failed, and the query's error when
        feeding failed.
        """
        self._raise_cluster_error()
        try:
            self.query.processAllAvailable()
        except Exception as exc:  # noqa: BLE001 - re-raised as the cluster's error, the feed's, or one line
            self._cluster.refresh_state()  # Spark Connect: what the coordinator knows now
            self._raise_cluster_error()
            error = self._feed_error()
            if error is not None:
                raise error from None
            raise RuntimeError(f"the streaming query failed: {_first_line(exc)}") from None
        self._cluster.refresh_state()
        self._raise_cluster_error()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the query ends, the cluster ends, or every training node returned.

        Returns False when ``timeout`` s passed first.  The query is left running
        only on a timeout.  Raises the cluster's error when a node failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        cluster = self._cluster
        state = cluster.state
        looked = 0.0
        try:
            while True:
                view = state.snapshot()
                if view.state == cluster_state.C_FAILED:
                    break
                if cluster.closed or view.state in (cluster_state.C_STOPPED, cluster_state.C_FINISHED):
                    break
                trainers = awaited_nodes(view.nodes)
                if trainers and all(n.state in cluster_state.TERMINAL for n in trainers):
                    break
                if not self.is_active:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    return False
                looked = state.wait_a_change(_POLL_S, looked)
        except KeyboardInterrupt:
            self.stop()
            cluster.close()
            raise
        self.stop()
        if not self.on_server:  # (stop() refreshed a training stream's on Spark Connect)
            self._cluster.refresh_state()  # Spark Connect: the query failed; the coordinator knows why
        self._raise_cluster_error()
        error = self._feed_error()
        if error is not None:  # feeding a micro-batch failed (the cluster was torn down then)
            raise error
        exc = self._query_exception()
        if exc is not None:
            raise RuntimeError(f"the streaming query failed: {exc}")
        return True

    # -- stopping -----------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the query (the micro-batch in flight is fed first) and end the stream's epoch.

        Idempotent; never raises (a failure shows in ``error``, in ``wait()`` and
        in the cluster's ``shutdown()``).
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            if self.query is not None:
                self.query.stop()
        except Exception:  # noqa: BLE001 - the Spark session may be stopping already
            pass
        finally:
            try:
                if self.kind == "train" and not self._cluster.closed:  # as_dataset() readers see the epoch end
                    self._cluster.controller.end_epoch(self.epoch)
                if self.on_server:
                    self._cluster.refresh_state()  # the counts of the last micro-batch
            except Exception:  # noqa: BLE001 - Spark Connect: the coordinator is gone; the cluster's error tells why
                pass
            self._cluster.stream_ended(self)
            self._cleanup()

    def _cleanup(self) -> None:
        if self._owned_checkpoint:
            shutil.rmtree(self._owned_checkpoint, ignore_errors=True)
            self._owned_checkpoint = None

    # -- internals ---------------------------------------------------------------------------
    def _feed_error(self) -> BaseException | None:
        """Why feeding a micro-batch failed, if it did; on Spark Connect the cluster is then torn down here
        (as a failed ``train()`` epoch tears it down): the error names the node when one failed."""
        if self.error is not None or not self.on_server:
            return self.error
        got = self._cluster.stream_counts(self.epoch)
        if got is None or got.error is None:
            return None
        cause = python_error_line(got.error)  # the failed feeding task's own error line
        self._cluster.stop_feeds()
        self._cluster.close()
        view = self._cluster.state.snapshot()
        if view.state == cluster_state.C_FAILED and any(n.state == cluster_state.FAILED for n in view.nodes):
            self.error = error_for(view)
        else:
            self.error = RuntimeError(f"feeding micro-batch {got.failed_batch} failed: {cause}")
        return self.error

    def _raise_cluster_error(self) -> None:
        view = self._cluster.state.snapshot()
        if view.state == cluster_state.C_FAILED:
            self._cluster.stop_feeds()  # this feed and every other one on the failed cluster
            self._cluster.close()
            raise error_for(view)

    def _query_exception(self) -> str | None:
        try:
            exc = self.query.exception() if self.query is not None else None
        except Exception:  # noqa: BLE001
            return None
        return None if exc is None else _first_line(exc)

    def __repr__(self) -> str:
        what = f"{self.rows} rows in {self.batches} micro-batches" if self.kind == "train" else "inference"
        return f"<tfos_nb StreamingFeed {self.kind}: {'active' if self.is_active else 'stopped'}, {what}>"


def _first_line(exc: BaseException) -> str:
    return python_error_line(exc)


def checkpoint_dir(given: str | None) -> tuple[str, str | None]:
    """The query's checkpoint location, and the temporary one this feed owns (removed at stop)."""
    if given:
        return given, None
    owned = tempfile.mkdtemp(prefix="tfos_nb-stream-")
    return owned, owned


def apply_writer_options(writer: Any, *, query_name: str | None, trigger: dict[str, Any] | None,
                         checkpoint: str, options: dict[str, Any] | None = None) -> Any:
    writer = writer.option("checkpointLocation", checkpoint)
    if options:
        writer = writer.options(**options)
    if query_name:
        writer = writer.queryName(query_name)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer


def sink_writer(preds: Any, sink: str | Callable[[Any, int], None], path: str | None,
                output_mode: str) -> Any:
    writer = preds.writeStream.outputMode(output_mode)
    if callable(sink):
        return writer.foreachBatch(sink)
    writer = writer.format(sink)
    if path:
        writer = writer.option("path", path)
    return writer
