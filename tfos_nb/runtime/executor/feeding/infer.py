"""What runs inside Spark's inference tasks: send a partition to a node and yield its results, in order.

Inference partitions need answers, so a node that stopped reading is an error here, raised at once; a feeding
task that stops early (``rdd.take(n)``, a failed downstream stage) releases its node, so a re-run of the
partition is served right away.  Results come back on the data connection, so inference always uses the socket
(no shared memory).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ...batches import columns, results
from ...batches.rowpack import rows_to_batches
from ...protocol import dataplane, messages
from ..collector import settle_gc
from .batches import rechunk
from .feeder import Feeder, partition_id
from .slots import node_error, send_batch


def _infer_lost(feeder: Feeder, exc: BaseException, sent: int) -> RuntimeError:
    verdict, error = feeder.verdict(exc)
    if verdict == "done":
        msg = (
            f"partition {feeder.partition}: {feeder.where} stopped reading (its function returned or called "
            "terminate()) before answering every row; inference needs nodes that answer until the feed ends"
        )
        feeder.release(sent, 0, None)
        return RuntimeError(msg)
    return feeder.fail(exc, sent, verdict, error)


def feed_infer(meta: messages.LaunchMeta, partition: int, batches: Iterable[Any], timeout: float,
               convert: Callable[[Any, str], Any] | None = None) -> Iterator[Any]:
    """Send one partition to a node and yield its results, in order: Arrow batches, or ``convert(batch, node)``."""
    settle_gc()
    feeder = Feeder(meta, partition, 0, "infer", timeout)
    try:
        feeder.assign()
    except BaseException:
        feeder.client.close()
        raise
    try:
        sock = feeder.connect()
    except (OSError, dataplane.DataPlaneError) as exc:
        raise _infer_lost(feeder, exc, 0) from None
    errors: list[BaseException] = []
    sent = [0]

    def write() -> None:
        try:
            for batch in batches:
                if batch.num_rows:
                    send_batch(sock, batch)
                    sent[0] += batch.num_rows
            dataplane.send_frame(sock, dataplane.Kind.END)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the reading side
            errors.append(exc)

    writer = threading.Thread(target=write, name="tfos-feed-writer", daemon=True)
    writer.start()
    received = 0
    try:
        while True:
            kind, payload = dataplane.recv_frame(sock)
            if kind is dataplane.Kind.RESULTS:
                batch = columns.decode_ipc(payload)
                received += batch.num_rows
                yield batch if convert is None else convert(batch, feeder.node.label or "?")
            elif kind is dataplane.Kind.DONE:
                break
            elif kind is dataplane.Kind.ERROR:
                raise node_error(payload)
            else:
                raise dataplane.DataPlaneError(f"unexpected frame {kind.value!r}")
        writer.join()
        if errors:
            raise errors[0]
    except columns.FeedDataError as exc:
        feeder.release(sent[0], 0, str(exc))
        raise
    except (OSError, dataplane.DataPlaneError) as exc:
        cause = errors[0] if errors and not isinstance(exc, dataplane.DataPlaneError) else exc
        if isinstance(cause, columns.FeedDataError):
            feeder.release(sent[0], 0, str(cause))
            raise cause from None
        raise _infer_lost(feeder, cause, sent[0]) from None
    finally:
        sock.close()
        writer.join(timeout=5)
        # Also when the consumer stopped early (rdd.take(n), a failed downstream task): free the node.
        feeder.release(sent[0], 0, None)
    if received != sent[0]:
        msg = f"partition {partition}: fed {sent[0]} rows but got {received} results back"
        raise RuntimeError(msg)


def make_rdd_inferer(meta: Mapping[str, Any] | messages.LaunchMeta, timeout: float,
                     batch_rows: int) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    launch_meta = messages.LaunchMeta.parse(meta)

    def infer(partition: int, rows: Iterable[Any]) -> Iterator[Any]:
        for rows_out in feed_infer(launch_meta, partition, rows_to_batches(rows, batch_rows), timeout,
                                   lambda batch, _: results.result_rows(batch)):
            yield from rows_out

    return infer


def make_arrow_inferer(meta: Mapping[str, Any] | messages.LaunchMeta, timeout: float, batch_rows: int,
                       schema: Any) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """``mapInArrow`` body: the nodes' results mapped onto ``schema`` (a StructType)."""
    launch_meta = messages.LaunchMeta.parse(meta)

    def infer(batches: Iterable[Any]) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(schema)
        partition = partition_id()
        yield from feed_infer(launch_meta, partition, rechunk(batches, batch_rows), timeout,
                              lambda batch, node: results.to_schema(batch, target, node))

    return infer
