"""Feeding a running cluster's nodes from batch data: each feed one Spark job, watched with the nodes.

``TFCluster.train`` feeds its epochs here (:meth:`BatchFeed.feed_epochs`), a training stream
(:mod:`.streams`) feeds each micro-batch, and the named sets (:mod:`.named_sets`) each set,
through :meth:`BatchFeed.action` and :meth:`BatchFeed.watch`.  A feed's Spark action runs the
feeders of :mod:`..executor.feeder` on the data's partitions; while it runs, a node that fails or a
feeding task's error tears the cluster down and is raised as the cluster's error.  The checks of
what is given to a feed (batch data, not a DStream; ``batch_rows``; the queue) are here too, so that
every entry point refuses the same things the same way, before any job.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import numbers
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ...executor.feeding.feeder import STATS_SCHEMA, feed_totals, make_arrow_feeder, make_rdd_feeder
from ..control import state as cluster_state
from ..errors import error_for, interrupted, python_error_line
from ..job import DriverJob
from ..tracking.inputs import log_train_input
from . import counts

__all__ = ["BatchFeed", "refuse_dstream", "require_batch_rows", "require_default_queue"]
log = logging.getLogger(__name__)


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
        raise ValueError(f"{what}(qname={qname!r}): inference feeds the nodes' 'input' feed (named sets are sets "
                         "for training: train(..., validation=df) or train(df, qname=...)); leave qname at its default")


#: Spark's delay scheduling: how long a task waits for the executor that caches its partition
LOCALITY_WAITS = ("spark.locality.wait.process", "spark.locality.wait.node", "spark.locality.wait.rack")


@contextlib.contextmanager
def no_locality_wait(sc: Any) -> Iterator[None]:
    """Spark's locality wait off while ``train()`` feeds (restored after).  A feeding task holds its slot until its
    node took its partition, and its rows go to the node wherever the task runs; with more partitions than slots,
    the next partition's task waited for the busy executor that caches it (``spark.locality.wait``, 3 s) while a
    free one idled, and every node waited with the node it feeds (measured: 8 cached partitions on 2 executors
    trained 2.4x as long as 2).  Spark reads the setting when it schedules a stage, so the jobs of other threads
    meanwhile run without the wait too.  Not on Spark Connect (no handle on the session's configuration)."""
    conf = None
    try:
        conf = sc._jsc.sc().conf()  # the live SparkConf (getConf() is a copy)
        before = {key: conf.getOption(key) for key in LOCALITY_WAITS}
        for key in LOCALITY_WAITS:
            conf.set(key, "0")
    except Exception:  # noqa: BLE001 - a context without the JVM's conf: scheduled as Spark decides
        conf = None
    try:
        yield
    finally:
        if conf is not None:
            for key, value in before.items():
                if value.isDefined():
                    conf.set(key, value.get())
                else:
                    conf.remove(key)


class BatchFeed:
    """The Spark jobs that feed one cluster's nodes (``job``, launched with ``meta``), each watched with the nodes."""

    def __init__(self, job: DriverJob, meta: dict[str, Any]) -> None:
        self._job = job
        self.controller = job.controller
        self.cluster_name = job.name  #: in the descriptions of its Spark jobs
        self.meta = meta  #: the launch's: what the executors' feeders are made from

    # -- before a feed ---------------------------------------------------------------
    def require_alive(self) -> None:
        """Raise the cluster's error when it failed (tearing it down), a RuntimeError when it is shut down."""
        view = self._job.state.snapshot()
        if view.state == cluster_state.C_FAILED:
            self._job.close()
            raise error_for(view)
        if self._job.closed or view.state in (cluster_state.C_STOPPED, cluster_state.C_FINISHED):
            msg = f"cluster {self.cluster_name} is shut down"
            raise RuntimeError(msg)

    def refuse_rdd_on_connect(self, what: str) -> None:
        """A ValueError for ``what()`` given an RDD where the session has none (Spark Connect)."""
        if not self._job.rdds_available:
            msg = (f"{what}() on Spark Connect takes a DataFrame"
                   + (" and the result schema (inference(df, schema='...'))" if what == "inference" else "")
                   + ": a Spark Connect session has no RDDs")
            raise ValueError(msg)

    # -- one feed --------------------------------------------------------------------
    def action(self, data: Any, version: int, feed_timeout: float, batch_rows: int, name: str = "input",
               skip: Mapping[int, list[tuple[int, int]]] | None = None) -> Callable[[], list[dict[str, int]]]:
        """The Spark action that feeds a DataFrame's (``mapInArrow``) or an RDD's partitions to the nodes as epoch
        ``version`` (a ``train()`` epoch or a stream's micro-batch), or as version ``version`` of the named set
        ``name``; it returns each partition's counts.  ``skip``: partition -> row ranges not fed (a resumed
        epoch's)."""
        from pyspark.sql import DataFrame

        if not isinstance(data, DataFrame):
            rdd_fn = make_rdd_feeder(self.meta, version, feed_timeout, batch_rows, name, skip)
            return lambda: [json.loads(s) for s in data.mapPartitionsWithIndex(rdd_fn).collect()]
        fn = make_arrow_feeder(self.meta, version, feed_timeout, batch_rows, name, skip)
        return lambda: [r.asDict() for r in data.mapInArrow(fn, STATS_SCHEMA).collect()]

    def watch(self, suffix: str, description: str, action: Callable[[], Any], what: str) -> Any:
        """Run ``action`` as a Spark job while watching the nodes; tear down on any failure."""
        self.controller.reset_feed_errors()
        return self._await(self._job.spark_job(suffix, description, action), what)

    def partitions(self, data: Any) -> int:
        """How many partitions ``data`` (a DataFrame) is fed in, i.e. its feeding stage's tasks: a job of one row a
        partition, whose function reads none of the partition's rows.  The same plan under the same final
        ``mapInArrow`` as the feed's, so it is split the same way (adaptive execution decides from the same data).
        For Spark Connect, whose client cannot count a running stage's tasks."""
        def one_row(batches: Any) -> Any:
            import pyarrow as pa

            yield pa.RecordBatch.from_pydict({"n": [1]}, schema=pa.schema([("n", pa.int32())]))

        count = self.watch("partitions", f"tfos_nb {self.cluster_name}: count the partitions to feed",
                           lambda: data.mapInArrow(one_row, "n int").count(), "counting the partitions to feed")
        return int(count)

    # -- train()'s epochs ----------------------------------------------------------------
    def feed_epochs(self, data: Any, epochs: int, feed_timeout: float, batch_rows: int,
                    skip_rows: Mapping[int, list[tuple[int, int]]] | None, tracking: Any) -> dict[str, int]:
        """Feed ``data`` (an RDD or batch DataFrame) ``epochs`` times, one Spark job an epoch; the rows the nodes
        took and skipped, and the partitions fed, over all epochs.  ``skip_rows`` leaves rows out of the first
        epoch; ``tracking`` (the job's MLflow run, or None) learns the first epoch's rows of a DataFrame."""
        waits = no_locality_wait(self._job.sc) if self._job.counts_tasks else contextlib.nullcontext()
        with waits:
            try:
                return self._feed_epochs(data, epochs, feed_timeout, batch_rows, skip_rows, tracking)
            except BaseException:
                if self._job.counts_tasks:
                    counts.forget(data)  # its rows may not be what was counted: the next call counts them again
                raise

    def _feed_epochs(self, data: Any, epochs: int, feed_timeout: float, batch_rows: int,
                     skip_rows: Mapping[int, list[tuple[int, int]]] | None, tracking: Any) -> dict[str, int]:
        from pyspark.sql import DataFrame

        is_df = isinstance(data, DataFrame)
        if not is_df:
            self.refuse_rdd_on_connect("train")
        ctl = self.controller
        total = {"rows": 0, "skipped": 0, "partitions": 0, "shared": 0}
        # Two epochs' jobs in flight: the next one is submitted once this one's feeding stage runs and all its
        # tasks started (so the next one's tasks cannot take a slot this one still needs); its rows wait in their
        # own queue on the nodes. Not on Spark Connect, where end_epoch is itself a Spark job that would queue
        # behind the next epoch's tasks.
        pipelined = ctl.pipelines_epochs and os.environ.get("TFOS_FEED_PIPELINE", "1") != "0"
        inflight: collections.deque[tuple[int, Any]] = collections.deque()

        told: set[int] = set()
        told_tracking: list[int] = []  # the epoch whose rows went to MLflow with the DataFrame (the first)
        # Spark Connect: no status tracker to count a running stage's tasks, so the partitions are counted first
        counted = None if self._job.counts_tasks else self.partitions(data)
        # Each partition's rows, once for the call: every node then knows its share's length before it ends
        rows = None
        if counts.counts(data) and self._job.counts_tasks:  # not on Spark Connect (its coordinator is not told counts)
            rows = counts.partition_rows(data, lambda action: self.watch(
                "count", f"tfos_nb {self.cluster_name}: count the rows of each partition to feed", action,
                "counting the rows to feed"))

        def learn_shares() -> None:
            """Tell the controller each running epoch's number of feeding tasks, so that once all of them went to
            nodes each node can end its read at its share's end (nodes with unequal shares under
            MultiWorkerMirroredStrategy step together: waiting for the whole epoch's end would deadlock)."""
            for epoch, job in inflight:
                if epoch not in told and not job.done and ctl.feeding_started(epoch):
                    tasks = job.feeding_tasks() if counted is None else counted
                    if tasks is not None:
                        ctl.set_feed_tasks(epoch, tasks)
                        told.add(epoch)

        def finish_oldest() -> None:
            epoch, job = inflight[0]
            stats = feed_totals(self._await(job, "feeding", tick=learn_shares))
            inflight.popleft()
            if is_df and tracking is not None and not told_tracking:  # the first epoch: its exact rows
                told_tracking.append(epoch)
                log_train_input(tracking, data, stats["rows"] + stats["skipped"])
            for key, n in stats.items():
                total[key] += n
            ctl.end_epoch(epoch)

        ctl.reset_feed_errors()
        for i in range(epochs):
            while len(inflight) >= (2 if pipelined else 1):
                finish_oldest()
            if inflight:  # feeding_started: a DataFrame's job may first run its shuffle as a job of its own
                last_epoch, last = inflight[-1]
                self._await(last, "feeding", tick=learn_shares,
                            until=lambda: ctl.feeding_started(last_epoch) and last.tasks_launched())
            epoch = ctl.open_epoch(remaining=epochs - 1 - i)
            if rows is not None:
                ctl.count_epoch(epoch, counts.without_skipped(rows, skip_rows) if i == 0 else rows)
            action = self.action(data, epoch, feed_timeout, batch_rows, skip=skip_rows if i == 0 else None)
            inflight.append((epoch, self._job.spark_job(f"feed-{epoch}",
                                                        f"tfos_nb {self.cluster_name}: feed epoch {epoch}", action)))
        while inflight:
            finish_oldest()
        return total

    # -- watching a feed's job ---------------------------------------------------------
    def _await(self, job: Any, what: str, until: Callable[[], bool] | None = None,
               tick: Callable[[], None] | None = None) -> Any:
        """Wait for ``job`` to end (or for ``until()``, leaving it running) while watching the nodes and the
        feeding tasks, calling ``tick()`` every slice; tear down on any failure."""
        ctl = self.controller
        state = self._job.state
        try:
            while not job.wait(0.2):
                if tick is not None:
                    tick()
                if until is not None and until():
                    return None
                if state.snapshot().state == cluster_state.C_FAILED or ctl.feed_errors:
                    job.cancel(join_timeout=0)  # a node or a feeding task failed: retries would not help
                    break
            view = state.snapshot()
            if view.state != cluster_state.C_FAILED and ctl.lost_feeds:
                # A feeding task lost its node before the node's supervisor said why: wait for its report (a dead
                # node process is reported at once, a dead supervisor after the heartbeat timeout), so the error
                # names the node and its cause rather than a broken connection.
                deadline = time.monotonic() + ctl.heartbeat_timeout + 2
                looked = 0.0
                while view.state != cluster_state.C_FAILED and time.monotonic() < deadline:
                    looked = state.wait_a_change(0.2, looked)
                    view = state.snapshot()
            own = ctl.data_errors  # the partition's own rows: a node that failed as its feed ended only followed
            if view.state == cluster_state.C_FAILED and not own:
                self._job.close()
                raise error_for(view)
            if own or job.error is not None or ctl.feed_errors:
                errors = own or ctl.feed_errors
                cause = errors[0] if errors else python_error_line(job.error)
                self._job.close()
                view = state.snapshot()
                if not own and view.state == cluster_state.C_FAILED and view.nodes and \
                        any(n.state == cluster_state.FAILED for n in view.nodes):
                    raise error_for(view) from None
                msg = f"{what} failed: {cause}"
                raise RuntimeError(msg) from None
            return job.result()
        except BaseException as exc:
            if not interrupted(exc):
                raise  # a failure above: the cluster was torn down where it was found
            try:
                job.cancel()
            finally:
                self._job.close()
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt from exc  # py4j's error in the interrupt's place: the user pressed Ctrl-C / ■
        finally:
            self._job.forget(job)
