"""The named sets of :class:`~tfos_nb.runtime.driver.cluster.TFCluster`: validation and test sets fed once.

``train(df, validation=val_df)``, ``train(df, feeds={"test": test_df})`` and TensorFlowOnSpark's
``train(rdd, qname="validation")`` feed each set in one Spark job before the training epochs (:func:`feed_set`,
through the cluster's :class:`.batch.BatchFeed`); the nodes keep their shares
(``executor/feed/named_sets.py``) and read them with ``ctx.get_data_feed(qname_in=NAME)``; the driver's record of
who holds what is ``driver/feeding/set_records.py``.  What is given is checked here first, before any job (:func:`named_sets`).
"""

from __future__ import annotations

import logging
from typing import Any

from ...executor.feeding.feeder import feed_totals
from ..control.plane import ControlPlane
from ..tracking.inputs import log_train_input
from .batch import BatchFeed, refuse_dstream
from .streaming import is_streaming

__all__ = ["feed_set", "named_sets", "warn_unread_sets"]
log = logging.getLogger(__name__)


def _columns(data: Any) -> list[tuple[str, str]] | None:
    """A DataFrame's columns and types; None for an RDD (its rows are only known once read)."""
    from pyspark.sql import DataFrame

    return [(str(n), str(t)) for n, t in data.dtypes] if isinstance(data, DataFrame) else None


def named_sets(data: Any, qname: Any, validation: Any, feeds: Any) -> dict[str, Any]:
    """The named sets a ``train()`` call feeds before its epochs (name -> DataFrame/RDD), checked up front: names
    (see ``named_feeds.check_name``), batch data (a set is fed once: not a stream), the training data's columns."""
    from ...executor.feed.named_sets import check_name

    if qname != "input":
        check_name(qname)
        if validation is not None or feeds:
            raise ValueError(f"train(qname={qname!r}) feeds its data as that named set; give validation= and feeds= "
                             "to the call that feeds the training data")
        if is_streaming(data):
            raise ValueError(f"train(qname={qname!r}): a named set is fed once; a streaming DataFrame never ends")
        return {qname: data}
    if feeds is not None and not isinstance(feeds, dict):
        raise TypeError(f"feeds is a dict of name -> DataFrame or RDD, got {type(feeds).__name__}")
    sets = dict(feeds or {})
    if validation is not None:
        if "validation" in sets:
            raise ValueError("the set 'validation' is given twice: as validation= and in feeds=")
        sets = {"validation": validation, **sets}
    expected = _columns(data)
    for name, value in sets.items():
        check_name(name)
        if name == "input":
            raise ValueError("'input' is the training feed's name; give a named set another name")
        refuse_dstream(value, "train")
        if not _is_spark_data(value):
            raise TypeError(f"the set {name!r} is a DataFrame or RDD, got {type(value).__name__}")
        if is_streaming(value):
            raise ValueError(f"the set {name!r} is fed once; a streaming DataFrame never ends (the training data may "
                             "be a stream, its sets not)")
        got = _columns(value)
        if expected is not None and got is not None and got != expected:
            raise ValueError(f"the set {name!r} has columns {_show(got)} and the training data {_show(expected)}: the "
                             "nodes read both the same way; select the same columns, in the same order, with the same "
                             "types")
    return sets


def _show(columns: list[tuple[str, str]]) -> str:
    return "(" + ", ".join(f"{n} {t}" for n, t in columns) + ")"


def _is_spark_data(value: Any) -> bool:
    from pyspark import RDD
    from pyspark.sql import DataFrame

    return isinstance(value, (DataFrame, RDD))


def feed_set(feed: BatchFeed, name: str, data: Any, passes: int, feed_timeout: float, batch_rows: int,
             tracking: Any) -> dict[str, int]:
    """Feed ``data`` once as the named set ``name`` (one Spark job; see :mod:`.set_records`); the rows the nodes
    took and skipped, and the partitions fed.  ``tracking`` (the job's MLflow run, or None) learns a DataFrame's
    rows."""
    from pyspark.sql import DataFrame

    if not isinstance(data, DataFrame):
        feed.refuse_rdd_on_connect("train")
    controller = feed.controller
    version = controller.open_set(name, passes)
    action = feed.action(data, version, feed_timeout, batch_rows, name)
    stats = feed_totals(feed.watch(f"set-{name}", f"tfos_nb {feed.cluster_name}: feed {name}", action,
                                   f"feeding {name}"))
    controller.end_set(name, version)
    if isinstance(data, DataFrame) and tracking is not None:
        log_train_input(tracking, data, stats["rows"] + stats["skipped"], context=name)
    return stats


def warn_unread_sets(controller: ControlPlane) -> None:
    """A set fed with rows that no node's function read (a ``validation`` passed, ``validation_data`` not):
    said once the job ended, as the unread training rows are."""
    for name, rows in controller.unread_sets().items():
        log.warning("tfos_nb: the set %r (%d rows) was fed to the nodes and no node's function read it: read it "
                    "with ctx.get_data_feed(qname_in=%r) (for Keras: model.fit(..., validation_data="
                    "ctx.get_data_feed(qname_in=%r).as_dataset(batch_size)))", name, rows, name, name)
