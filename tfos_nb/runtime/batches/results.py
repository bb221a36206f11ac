"""Inference results: what a node passes to ``batch_results`` -> Arrow -> rows or a DataFrame's columns.

A node answers in any of TensorFlowOnSpark's forms: one result per row (scalars,
tuples, lists, dicts, ``Row`` objects, numpy rows), a numpy array or tensor
(one row per element), or a dict of columns.  On the node it becomes one Arrow
batch that remembers its form (``columns.KIND_KEY``), so that

* ``inference(rdd)`` gives back the rows as the node returned them (tuples stay
  tuples, numpy rows stay numpy), and
* ``inference(df, schema=...)`` maps them onto the schema's columns: by name for
  dicts and Rows, by position for tuples and lists, a 2-D array's columns one
  per field; every column cast to its field's type.  A result that does not fit
  is one :class:`ResultSchemaError` naming the node, the column and what was returned.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from . import columns

__all__ = ["ResultSchemaError"]


class ResultSchemaError(ValueError):
    """A node's ``batch_results`` do not fit the schema given to ``inference``."""


# ---------------------------------------------------------------------------
# Node side
# ---------------------------------------------------------------------------


def num_rows(results: Any) -> int:
    if isinstance(results, dict):
        lens = {len(v) for v in results.values()}
        if len(lens) > 1:
            raise ValueError(f"batch_results: columns of different lengths {sorted(lens)}")
        return lens.pop() if lens else 0
    if hasattr(results, "shape") and hasattr(results, "numpy"):  # a tf.Tensor
        return int(results.shape[0]) if len(results.shape) else 1
    return len(results)


def _with_kind(arrays: list[pa.Array], fields: list[pa.Field], kind: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata={columns.KIND_KEY: kind.encode()}))


def results_to_batch(results: Any) -> pa.RecordBatch:
    """Encode what the user passed to ``batch_results``, keeping its form."""
    if hasattr(results, "numpy") and not isinstance(results, np.ndarray):  # a tf.Tensor
        results = results.numpy()
    if isinstance(results, dict):  # columns by name
        arrays, fields = [], []
        for k, v in results.items():
            arr, meta = columns.column_to_arrow(str(k), v if isinstance(v, np.ndarray) else list(v))
            arrays.append(arr)
            fields.append(pa.field(str(k), arr.type, metadata=meta or None))
        return _with_kind(arrays, fields, "dict")
    if isinstance(results, np.ndarray):  # one result per element along the first axis
        if results.ndim == 0:
            msg = "batch_results() got a 0-d array; pass one result per row of the last next_batch()"
            raise ValueError(msg)
        arr, meta = columns.column_to_arrow("result", results if results.dtype.kind in "biuf" else list(results))
        return _with_kind([arr], [pa.field("result", arr.type, metadata=meta or None)], "ndarray")
    rows = list(results)
    if not rows:
        return _with_kind([pa.array([], pa.null())], [pa.field("result", pa.null())], "scalar")
    return columns.rows_to_batch(rows)  # per-row tuples, lists, dicts, Rows, numpy rows or scalars


# ---------------------------------------------------------------------------
# Spark side
# ---------------------------------------------------------------------------


def _kind(batch: pa.RecordBatch) -> str:
    kind: bytes = (batch.schema.metadata or {}).get(columns.KIND_KEY, b"scalar")
    return kind.decode()


def result_rows(batch: pa.RecordBatch) -> list[Any]:
    """The results as the node returned them, one per row (``inference(rdd)``)."""
    kind = _kind(batch)
    if kind == "ndarray":
        col = columns.column_to_numpy(batch, 0)
        return list(col)  # numpy scalars or numpy rows, as the node's array held them
    return columns.batch_to_rows(batch)


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _first(batch: pa.RecordBatch) -> str:
    try:
        rows = result_rows(batch.slice(0, 1)) if batch.num_rows else []
    except Exception:  # noqa: BLE001 - only for the message
        return "?"
    return f"{rows[0]!r:.200}" if rows else "nothing"


def to_schema(batch: pa.RecordBatch, target: pa.Schema, node: str) -> pa.RecordBatch:
    """Map one batch of a node's results onto the Arrow schema of ``inference(df, schema=...)``."""
    names = target.names
    desc = ", ".join(f"{f.name} {f.type}" for f in target)
    kind = _kind(batch)
    have = batch.schema.names
    where = f"{node}'s batch_results()"
    if kind in ("dict", "row") and (kind == "dict" or set(names) <= set(have)):
        missing = [c for c in names if c not in have]
        if missing:
            msg = (f"{where} returned no column {', '.join(map(repr, missing))} of the schema ({desc}); "
                   f"it returned {have} (first row: {_first(batch)})")
            raise ResultSchemaError(msg)
        cols = [batch.column(have.index(c)) for c in names]
    elif (batch.num_columns == 1 and _is_list(batch.schema.types[0])
          and not any(_is_list(f.type) for f in target) and kind in ("vector", "ndarray")):
        arr = columns.column_to_numpy(batch, 0)  # a 2-D array: its columns, one per field
        width = int(np.prod(arr.shape[1:])) if arr.ndim > 1 else 1
        if width != len(names):
            msg = (f"{where} rows have {width} value(s) but the schema has {len(names)} column(s) ({desc}); "
                   f"first row returned: {_first(batch)}")
            raise ResultSchemaError(msg)
        flat = arr.reshape(len(arr), width)
        cols = [pa.array(flat[:, i]) for i in range(width)]
    else:
        if batch.num_columns != len(names):
            what = "rows have" if kind in ("tuple", "list", "row") else "results have"
            msg = (f"{where} {what} {batch.num_columns} value(s) but the schema has {len(names)} column(s) "
                   f"({desc}); first row returned: {_first(batch)}")
            raise ResultSchemaError(msg)
        cols = [batch.column(i) for i in range(batch.num_columns)]
    out = []
    for field, col in zip(target, cols):
        if col.type != field.type:
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                sample = col.slice(0, 1).to_pylist()
                got = f"{sample[0]!r:.100} ({col.type})" if sample else str(col.type)
                msg = (f"{where}: column {field.name!r} of the schema is {field.type}, but the node returned "
                       f"{got} for it (first row: {_first(batch)}): {str(exc).splitlines()[0]}")
                raise ResultSchemaError(msg) from None
        out.append(col)
    return pa.RecordBatch.from_arrays(out, schema=target)
