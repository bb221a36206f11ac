"""Whether a Spark object comes from Spark Connect (no SparkContext, no RDDs): one test for the whole package."""

from __future__ import annotations

from typing import Any


def is_connect(obj: Any) -> bool:
    """``obj`` (a SparkSession, DataFrame …) is Spark Connect's (``pyspark.sql.connect``), not classic PySpark's."""
    return type(obj).__module__.startswith("pyspark.sql.connect")
