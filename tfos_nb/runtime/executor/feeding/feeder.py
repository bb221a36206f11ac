"""What runs inside Spark's feeding tasks: send a partition to the node the driver picks.

A training partition ends in one of three ways:

* the node took every row (its answer ``A`` says how many it took and skipped);
* the node stops reading — its function called ``terminate()`` or returned —
  before or while the partition arrives: the partition is *skipped*, never an
  error (TensorFlowOnSpark's contract).  The node may answer ``A`` itself, or its
  process may already be gone (refused or broken connection): then the feeder
  asks the driver what became of the node (:class:`~.messages.FeedCheck`) and
  waits for its verdict, which the node's supervisor gives within a heartbeat;
* the node failed: the feeder fails, and the driver reports that node's error.

A node on this host gets the batches through shared memory (:mod:`.slots`), any other through the socket.
Inference partitions, whose results come back, are :mod:`.infer`'s.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ...batches import columns
from ...batches.rowpack import rows_to_batches
from ...protocol import dataplane, messages
from ...protocol.channel import ControlClient
from ..collector import settle_gc
from ..identity import executor_id
from .batches import count_rows, rechunk, with_sample, without
from .slots import NodeAnswer, Slots, recv_answer, send_batch

_CHECK_GRACE_S = 5.0  # beyond the driver's heartbeat timeout, for the verdict on a lost node


STATS_SCHEMA = "partition int, rows long, skipped long, shared long"  # a feeding task's one row


def feed_totals(stats: Iterable[Any]) -> dict[str, int]:
    """Rows taken, rows skipped, partitions fed and rows that came through shared memory, from a feeding job's
    per-partition stats (dicts or Rows)."""
    stats = list(stats)
    return {"rows": sum(int(s["rows"]) for s in stats), "skipped": sum(int(s["skipped"]) for s in stats),
            "partitions": len(stats), "shared": sum(int(s["shared"]) for s in stats)}


class Feeder:
    def __init__(self, meta: messages.LaunchMeta, partition: int, gen: int, mode: str, timeout: float,
                 feed: str = "input", skip: list[tuple[int, int]] | None = None) -> None:
        self.meta = meta
        self.skip = skip or []
        self.feed = feed
        self.secret = bytes.fromhex(meta.secret)
        self.codec = messages.Codec(self.secret, meta.cluster_id, f"feeder-p{partition}")
        self.client = ControlClient(self.codec, meta.address, timeout=30)
        self.partition = partition
        self.gen = gen
        self.mode = mode
        self.timeout = timeout
        self.node = messages.FeedAssignment()  # until the driver assigns one
        self.released = False
        self.slots: Slots | None = None  # a training connection's shared memory, when its node is on this host

    @property
    def where(self) -> str:
        return f"{self.node.label or '?'} at {self.node.host or '?'}"

    def assign(self, sample: dict[str, Any] | None = None) -> messages.FeedAssignment:
        deadline = time.monotonic() + self.timeout
        delay = 0.02
        while True:
            reply = self.client.request(
                messages.FeedAssign(
                    partition=self.partition,
                    gen=self.gen,
                    host=socket.gethostname(),
                    executor_id=executor_id(),
                    mode=self.mode,
                    sample=sample or {},
                    feed=self.feed,
                )
            )
            if reply.ok:
                self.node = messages.FeedAssignment.from_dict(reply.body)
                return self.node
            if reply.error:
                raise RuntimeError(reply.error)
            if time.monotonic() > deadline:
                msg = f"Timeout while feeding partition {self.partition}: no node took it in {self.timeout:.0f} s"
                raise TimeoutError(msg)
            time.sleep(delay)  # a busy node is polled, with back-off
            delay = min(delay * 2, 0.5)

    def release(self, rows: int, skipped: int, error: str | None, error_kind: str | None = None) -> str | None:
        if self.released:
            return None
        self.released = True
        try:
            reply = self.client.request(
                messages.FeedRelease(
                    partition=self.partition,
                    gen=self.gen,
                    node=self.node.node,
                    rows=rows,
                    skipped=skipped,
                    error=error,
                    error_kind=error_kind,
                    feed=self.feed,
                )
            )
            return messages.FeedReleased.from_dict(reply.body).cluster_error
        except (OSError, messages.ProtocolError):
            return None
        finally:
            self.client.close()

    def connect(self) -> Any:
        header: dict[str, Any] = {"partition": self.partition, "gen": self.gen, "mode": self.mode, "feed": self.feed}
        if self.node.after >= 0:  # deterministic mode: the node reads this partition after that one
            header["after"] = self.node.after
        if self.skip:
            header["skip"] = [list(r) for r in self.skip]
        if self.node.rows >= 0:  # counted: the node knows its share's length
            header["rows"] = self.node.rows
        self.slots = Slots.offer(self.node.host, header, self.timeout) if self.mode == "train" else None
        try:
            sock = dataplane.client_connect(self.node.host, self.node.port, self.secret, header, self.timeout)
        except BaseException:
            self.close_slots(answered=False)
            raise
        if self.slots is not None:
            try:
                self.slots.accepted(sock)
            except BaseException:
                sock.close()
                self.close_slots(answered=False)
                raise
        return sock

    def send(self, sock: socket.socket, batch: Any) -> None:
        """One training batch to the node: through shared memory or the socket (:class:`.slots.Slots`)."""
        if self.slots is not None:
            self.slots.send(sock, batch)
        else:
            send_batch(sock, batch)

    def close_slots(self, answered: bool) -> None:
        if self.slots is not None:
            self.slots.close(answered)
            self.slots = None

    def verdict(self, exc: BaseException) -> tuple[str, str | None]:
        """What became of the node after the connection to it failed with ``exc``: (verdict, error).

        A broken connection usually means the node's process ended; its supervisor
        tells the driver within a heartbeat (or the driver notices the missing
        heartbeats), so the question is repeated until the driver knows.  A timeout
        or an error the node answered is asked about once.
        """
        node_failed = isinstance(exc, NodeAnswer) and exc.node_failed
        if isinstance(exc, NodeAnswer) and not node_failed:
            return "error", None
        patient = node_failed or not (isinstance(exc, TimeoutError) or "timed out" in str(exc))
        deadline = time.monotonic() + self.meta.driver_timeout + _CHECK_GRACE_S
        delay = 0.05
        while True:
            try:
                reply = self.client.request(messages.FeedCheck(partition=self.partition, node=self.node.node))
            except (OSError, messages.ProtocolError):
                return "error", None  # the driver is gone: nothing more to learn
            answer = messages.FeedVerdict.from_dict(reply.body) if reply.ok else messages.FeedVerdict("error")
            if answer.verdict != "reading" or not patient or time.monotonic() > deadline:
                return answer.verdict, answer.error
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def fail(self, exc: BaseException, rows: int, verdict: str = "error", cluster_error: str | None = None) -> RuntimeError:
        released_error = self.release(rows, 0, f"{type(exc).__name__}: {exc}", messages.error_kind(exc))
        cluster_error = cluster_error or released_error
        if isinstance(exc, NodeAnswer) and exc.node_failed:
            msg = f"feeding partition {self.partition} to {self.where} failed: {exc}"  # the node's own error
        elif verdict == "failed":
            msg = f"feeding partition {self.partition} to {self.where} failed: {self.node.label or 'the node'} failed"
        elif verdict == "stopped":
            msg = f"feeding partition {self.partition} to {self.where} stopped: the cluster is shutting down"
        elif isinstance(exc, TimeoutError) or "timed out" in str(exc):
            msg = (
                f"Timeout while feeding partition {self.partition} to {self.where}: the node took no data "
                f"for {self.timeout:.0f} s"
            )
        else:
            msg = f"feeding partition {self.partition} to {self.where} failed: {exc}"
        if cluster_error:
            msg += f"\n{cluster_error}"
        return RuntimeError(msg)


def changed_rows(partition: int, gen: int, counted: int, now: int, more: bool = False) -> str:
    """Why a counted partition cannot be fed: its rows changed since ``train()`` counted them."""
    held = f"more than {counted}" if more else f"{now}"
    return (f"partition {partition} of epoch {gen} holds {held} rows, but {counted} when they were counted before "
            "the first epoch: the data changes from one read to the next (a non-deterministic source or "
            "transformation, such as rand(), sample() or a table written meanwhile); cache() it (df.cache(), "
            "rdd.cache()) so that every epoch feeds the same rows, or set TFOS_KNOWN_LENGTH=0 to feed epochs of "
            "unknown length")


def feed_train(meta: messages.LaunchMeta, partition: int, gen: int, batches: Iterable[Any], timeout: float,
               feed: str = "input", skip: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """Send one partition's batches to the node the driver picks; wait until it took them (or skipped them).
    ``feed``: a named set's name (``gen`` its version: the node keeps the rows as a set), else the training stream.
    ``skip``: row ranges of the partition not sent (a resumed epoch's rows its backup had trained on); the node
    is told them, so its ledger names rows by their place in the partition."""
    settle_gc()
    feeder = Feeder(meta, partition, gen, "train", timeout, feed, skip)
    if skip:
        batches = without(batches, skip)
    batches, sample = with_sample(batches)
    try:
        node = feeder.assign(sample)
    except BaseException:
        feeder.client.close()
        raise
    if node.skip:  # no node reads data any more
        skipped = count_rows(batches)
        feeder.release(0, skipped, None)
        return {"partition": partition, "rows": 0, "skipped": skipped, "shared": 0}
    sent = 0
    expected = node.rows  # -1: not counted
    try:
        sock = feeder.connect()
        try:
            for batch in batches:
                if batch.num_rows:
                    if 0 <= expected < sent + batch.num_rows:  # never sent: the node would step more than its peers
                        raise columns.FeedDataError(changed_rows(partition, gen, expected, sent + batch.num_rows,
                                                                 more=True))
                    sent += batch.num_rows  # counted before it goes: a batch lost in a broken send is skipped too
                    feeder.send(sock, batch)
            if 0 <= expected != sent:
                raise columns.FeedDataError(changed_rows(partition, gen, expected, sent))
            dataplane.send_frame(sock, dataplane.Kind.END)
            done = recv_answer(sock)
            feeder.close_slots(answered=True)
        finally:
            sock.close()
            feeder.close_slots(answered=False)
    except columns.FeedDataError as exc:
        feeder.release(sent, 0, str(exc))
        raise
    except (OSError, dataplane.DataPlaneError) as exc:
        verdict, error = feeder.verdict(exc)
        if verdict != "done":
            raise feeder.fail(exc, sent, verdict, error) from None
        skipped = sent + count_rows(batches)  # the node stopped reading: none of this partition is known taken
        feeder.release(0, skipped, None)
        return {"partition": partition, "rows": 0, "skipped": skipped, "shared": 0}
    except Exception as exc:  # the partition's own rows failed (a UDF upstream raised): the driver hears the cause
        feeder.release(sent, 0, f"{type(exc).__name__}: {exc}")  # first, not the node's report of the cut
        raise
    rows, skipped = int(done.get("rows", sent)), int(done.get("skipped", 0))
    feeder.release(rows, skipped, None)
    return {"partition": partition, "rows": rows, "skipped": skipped, "shared": int(done.get("shared", 0))}


def make_rdd_feeder(meta: Mapping[str, Any] | messages.LaunchMeta, gen: int, timeout: float,
                    batch_rows: int, name: str = "input",
                    skip: Mapping[int, list[tuple[int, int]]] | None = None) -> Callable[[int, Iterable[Any]], Iterator[str]]:
    launch_meta = messages.LaunchMeta.parse(meta)
    skip = dict(skip or {})

    def feed(partition: int, rows: Iterable[Any]) -> Iterator[str]:
        yield json.dumps(feed_train(launch_meta, partition, gen, rows_to_batches(rows, batch_rows), timeout, name,
                                    skip.get(partition)))

    return feed


def partition_id() -> int:
    """The partition of the Spark task this runs in."""
    from pyspark import TaskContext

    tctx = TaskContext.get()
    assert tctx is not None  # only ever called inside a Spark task
    return tctx.partitionId()


def make_arrow_feeder(meta: Mapping[str, Any] | messages.LaunchMeta, gen: int, timeout: float,
                      batch_rows: int, name: str = "input",
                      skip: Mapping[int, list[tuple[int, int]]] | None = None) -> Callable[[Iterable[Any]], Iterator[Any]]:
    launch_meta = messages.LaunchMeta.parse(meta)
    skip = dict(skip or {})

    def feed(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        partition = partition_id()
        stats = feed_train(launch_meta, partition, gen, rechunk(batches, batch_rows), timeout, name,
                           skip.get(partition))
        yield pa.RecordBatch.from_pydict(
            {"partition": [partition], "rows": [stats["rows"]], "skipped": [stats["skipped"]],
             "shared": [stats["shared"]]},
            schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("skipped", pa.int64()),
                              ("shared", pa.int64())]),
        )

    return feed
