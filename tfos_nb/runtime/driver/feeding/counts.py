"""The rows of each partition a ``train()`` call feeds, counted once before its first epoch.

Under ``MultiWorkerMirroredStrategy`` every node steps each epoch the same number of times.  When the nodes know
that number before the epoch starts, TensorFlow need not ask every worker at every step whether all still have
data (its partial-batch handling: a collective a step): the driver counts each partition's rows once per
``train()`` call, adds up each node's share as partitions go out (:class:`.shares.EpochShares`), and each node
learns its own rows and the largest share, so its dataset ends every epoch after the same number of batches as
its peers' (``executor/feed/data_feed.py``).  Later epochs are fed the same partitions: a feeding task whose
partition holds another number of rows than counted fails with one sentence (``executor/feeding/feeder.py``).

Only data Spark holds (cached: ``df.cache()``, ``rdd.cache()``) is counted by default, by Spark alone, without its
rows reaching Python: counting anything else runs the user's upstream code once more (a second read of the files,
every Python UDF and ``mapPartitions`` function again — with their side effects, and a block in one of them where no
node waits for it).  ``TFOS_KNOWN_LENGTH=always`` counts uncached data too (a DataFrame through the same
``mapInArrow`` plan its feed runs, so that it is split into the same partitions); ``0`` counts nothing.

Cached data is counted once, not once per call: its counts are kept for the next ``train()`` on it (a Spark job on
this machine's 2 cores costs half a second or more, a fifth of benchmark B1's feed; a cached RDD's count unpickles
every row in Python, as dear as an epoch's read).  A DataFrame's are kept by the identity of the data Spark caches
for it (a new one once it is unpersisted and cached again), an RDD's by the RDD (cached again after an
``unpersist()``, it keeps them: rows its lineage recomputes to another count are named by the feed, as in any epoch).
They are forgotten as soon as a ``train()`` on the data fails.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ENV", "counts", "enabled", "forget", "partition_rows", "without_skipped"]

#: ``TFOS_KNOWN_LENGTH``: ``cached`` (the default) counts cached data, ``always`` any, ``0`` none (epochs of unknown
#: length: TensorFlow's per-step check on)
ENV = "TFOS_KNOWN_LENGTH"


def enabled() -> bool:
    return os.environ.get(ENV, "cached").strip().lower() not in ("0", "never", "off", "false")


def counts(data: Any) -> bool:
    """Whether ``train()`` counts ``data``'s rows: cached, or counting asked for whatever it is."""
    if not enabled():
        return False
    return os.environ.get(ENV, "cached").strip().lower() == "always" or _cached(data)


def _arrow_counts(batches: Any) -> Any:
    import pyarrow as pa
    from pyspark import TaskContext

    tctx = TaskContext.get()
    partition = tctx.partitionId() if tctx is not None else -1
    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"partition": [partition], "rows": [rows]},
                                     schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64())]))


def _cached(data: Any) -> bool:
    try:
        level = data.storageLevel if hasattr(data, "storageLevel") else data.getStorageLevel()
    except Exception:  # noqa: BLE001 - a session that cannot say: not known to be cached
        return False
    return bool(level.useMemory or level.useDisk)


_KEPT = 8  # cached DataFrames and RDDs whose counts are kept
_kept: collections.OrderedDict[tuple[str, str, int], dict[int, int]] = collections.OrderedDict()
_kept_lock = threading.Lock()


def _cache_key(data: Any) -> tuple[str, str, int] | None:
    """The identity of the data Spark caches for ``data``, or None (not cached, or not a classic session: counted
    every call).  A DataFrame's is its cache entry's columnar RDD (the same for an equal plan, another once it is
    cached anew); an RDD's is its own id (the rows it caches are its own: a cached RDD is counted in Python, every
    row unpickled, as dear as an epoch's read)."""
    from pyspark import RDD
    from pyspark.sql import DataFrame

    try:
        if isinstance(data, RDD):
            return (str(data.context.applicationId), "rdd", int(data.id())) if _cached(data) else None
        if not isinstance(data, DataFrame) or not hasattr(data, "_jdf"):
            return None
        session = data.sparkSession
        found = session._jsparkSession.sharedState().cacheManager().lookupCachedData(data._jdf)
        if not found.isDefined():
            return None
        buffers = found.get().cachedRepresentation().cacheBuilder().cachedColumnBuffers()
        return str(session.sparkContext.applicationId), "df", int(buffers.id())
    except Exception:  # noqa: BLE001 - another Spark's internals: counted every call, as before
        return None


def forget(data: Any) -> None:
    """Drop ``data``'s kept counts (a ``train()`` on it failed: its rows may not be what was counted)."""
    key = _cache_key(data)
    if key is not None:
        with _kept_lock:
            _kept.pop(key, None)


def partition_rows(data: Any, run: Callable[[Callable[[], Any]], Any]) -> dict[int, int]:
    """Rows of each partition of ``data`` (a DataFrame or an RDD), by partition index; ``run(action)`` runs the
    Spark action as the feed's jobs run (watched with the nodes).  A cached DataFrame's or RDD's are kept for the
    next call."""
    key = _cache_key(data)
    if key is None:
        return _partition_rows(data, run)
    with _kept_lock:
        kept = _kept.get(key)
    if kept is None:
        kept = _partition_rows(data, run)
        with _kept_lock:
            _kept[key] = kept
            while len(_kept) > _KEPT:
                _kept.popitem(last=False)
    return dict(kept)


def _partition_rows(data: Any, run: Callable[[Callable[[], Any]], Any]) -> dict[int, int]:
    from pyspark.sql import DataFrame

    if not isinstance(data, DataFrame):  # a cached RDD's partitions come from the block manager
        return dict(run(lambda: data.mapPartitionsWithIndex(lambda i, it: [(i, sum(1 for _ in it))]).collect()))
    if _cached(data) and hasattr(data, "_jdf"):
        from pyspark.sql import functions as F

        counted = run(lambda: data.groupBy(F.spark_partition_id().alias("partition")).count().collect())
        return {int(r["partition"]): int(r["count"]) for r in counted}
    counted = run(lambda: data.mapInArrow(_arrow_counts, "partition int, rows long").collect())
    return {int(r["partition"]): int(r["rows"]) for r in counted}


def without_skipped(rows: Mapping[int, int], skip: Mapping[int, list[tuple[int, int]]] | None) -> dict[int, int]:
    """``rows`` less the row ranges a resumed epoch does not feed."""
    out = dict(rows)
    for partition, ranges in (skip or {}).items():
        if partition in out:
            out[partition] = max(0, out[partition] - sum(min(b, out[partition]) - min(a, out[partition])
                                                          for a, b in ranges))
    return out
