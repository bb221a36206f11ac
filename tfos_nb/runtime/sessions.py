"""Classic PySpark or Spark Connect: the one test the whole package uses, and the one way to run a small
function in a Spark task on either (imports nothing from pyspark)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["in_one_task", "is_connect"]


def is_connect(obj: Any) -> bool:
    """``obj`` (a SparkSession, DataFrame …) is Spark Connect's (``pyspark.sql.connect``): no SparkContext, no RDDs.

    Looks at the class and its bases by name only, so the classic path never loads the Connect
    client (gRPC).
    """
    return any(c.__module__.startswith("pyspark.sql.connect") for c in type(obj).__mro__)


def in_one_task(spark: Any, fn: Callable[[], str]) -> str:
    """``fn()`` run in a one-task Spark job (a ``mapInArrow`` over one row: classic or Connect alike), in a
    Python worker on an executor; what it returned."""

    def task(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"out": [fn()]}, schema=pa.schema([("out", pa.string())]))

    return str(spark.range(0, 1, 1, 1).mapInArrow(task, "out string").collect()[0]["out"])
