"""TensorFlowOnSpark's ``TFNode`` helpers, for programs that migrate unchanged."""

from __future__ import annotations

from typing import Any

from .context import hdfs_path as _hdfs_path
from .context import start_cluster_server
from .feed.data_feed import DataFeed as _DataFeed
from .feed.hub import FeedHub

__all__ = ["DataFeed", "batch_results", "hdfs_path", "next_batch", "start_cluster_server", "terminate"]


def DataFeed(  # noqa: N802 - TensorFlowOnSpark's name
    mgr: FeedHub,
    train_mode: bool = True,
    qname_in: str = "input",
    qname_out: str = "output",
    input_mapping: dict[str, str] | list[str] | None = None,
    *,
    numpy_rows: bool = True,
) -> _DataFeed:
    """The node's data feed: ``TFNode.DataFeed(ctx.mgr, train_mode)``.

    On a node that is not fed (a ps or evaluator node, or any node of an
    InputMode.TENSORFLOW cluster: ``ctx.mgr`` is None) the feed is empty:
    ``should_stop()`` is True at once and ``next_batch`` returns ``[]``, as in
    TensorFlowOnSpark, whose examples create a feed on every node.
    Array columns come as numpy arrays in rows; ``numpy_rows=False`` gives
    Python lists (see ``feed.DataFeed``).
    """
    if mgr is None:
        mgr = FeedHub()
        mgr.stop()
    return _DataFeed(mgr, train_mode, qname_in, qname_out, input_mapping, numpy_rows=numpy_rows)


def hdfs_path(ctx: Any, path: str) -> str:
    """``path`` made absolute on ``ctx.defaultFS`` (any object with ``defaultFS`` and ``working_dir``)."""
    return _hdfs_path(ctx, path)


def next_batch(mgr: FeedHub, batch_size: int, qname: str = "input") -> Any:
    """Up to ``batch_size`` fed rows: ``TFNode.DataFeed(mgr).next_batch(batch_size)`` (TensorFlowOnSpark's form)."""
    return _DataFeed(mgr, True, qname).next_batch(batch_size)


def batch_results(mgr: FeedHub, data: Any, qname: str = "output") -> None:
    """Answer the batch just read with one result per row: ``TFNode.DataFeed(mgr, False).batch_results(data)``."""
    _DataFeed(mgr, False, qname_out=qname).batch_results(data)


def terminate(mgr: FeedHub, qname: str = "input") -> None:
    """Stop reading: the rows still routed to this node are skipped and ``train()`` returns normally."""
    _DataFeed(mgr, True, qname).terminate()
