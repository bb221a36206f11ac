"""A training stream's ``foreachBatch`` function on Spark Connect: runs on the Connect server.

On Spark Connect, ``writeStream.foreachBatch(fn)`` pickles ``fn`` and runs it in
a Python process of the Connect server, with ``batch_df`` a DataFrame of a
server-side session: ``fn`` cannot reach the notebook's objects.  So the
function :func:`make_batch_feeder` returns is self-contained: it feeds each
micro-batch with the ``mapInArrow`` feeder ``train(df)`` uses (its tasks talk
to the cluster's coordinator directly; its address and secret travel inside
the closure, as they do in every feeding task), then tells the coordinator
what the micro-batch fed (a signed :class:`~..protocol.remote.StreamBatch`).
The notebook reads those counts, and a failed micro-batch's error, from its
snapshots of the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...protocol import messages, remote
from ...protocol.channel import ControlClient
from .feeder import STATS_SCHEMA, feed_totals, make_arrow_feeder

ERROR_CHARS = 16000  # the start of a failed micro-batch's Spark error: the failed task's Python traceback


def report_batch(meta: messages.LaunchMeta, msg: remote.StreamBatch) -> None:
    """Send one micro-batch's outcome to the coordinator (raises when it cannot be reached or refuses)."""
    codec = messages.Codec(bytes.fromhex(meta.secret), meta.cluster_id, "stream")
    client = ControlClient(codec, meta.address, timeout=30)
    try:
        reply = client.request(msg)
    finally:
        client.close()
    if not reply.ok:
        raise RuntimeError(f"the cluster's coordinator refused the micro-batch report: {reply.error}")


def make_batch_feeder(meta: Mapping[str, Any] | messages.LaunchMeta, epoch: int, timeout: float,
                      batch_rows: int) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function of a training stream on Spark Connect (the stream is the one ``epoch``)."""
    launch_meta = messages.LaunchMeta.parse(meta)
    feeder = make_arrow_feeder(launch_meta, epoch, timeout, batch_rows)

    def on_batch(batch_df: Any, batch_id: int) -> None:
        try:
            stats = batch_df.mapInArrow(feeder, STATS_SCHEMA).collect()
        except Exception as exc:
            try:
                report_batch(launch_meta, remote.StreamBatch(epoch=epoch, batch=int(batch_id),
                                                      error=str(exc)[:ERROR_CHARS]))
            except Exception:  # noqa: BLE001 - the feeding error is the one to raise
                pass
            raise
        fed = feed_totals(stats)
        report_batch(launch_meta, remote.StreamBatch(epoch=epoch, batch=int(batch_id), rows=fed["rows"],
                                              skipped=fed["skipped"], partitions=fed["partitions"]))

    return on_batch
