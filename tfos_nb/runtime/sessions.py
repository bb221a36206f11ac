"""Classic PySpark or Spark Connect: the one test the whole package uses (imports nothing from pyspark)."""

from __future__ import annotations

from typing import Any

__all__ = ["is_connect"]


def is_connect(obj: Any) -> bool:
    """``obj`` (a SparkSession, DataFrame …) is Spark Connect's (``pyspark.sql.connect``): no SparkContext, no RDDs.

    Looks at the class and its bases by name only, so the classic path never loads the Connect
    client (gRPC).
    """
    return any(c.__module__.startswith("pyspark.sql.connect") for c in type(obj).__mro__)
