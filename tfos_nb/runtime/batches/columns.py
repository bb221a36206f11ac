"""Rows <-> Arrow record batches <-> numpy columns.

Data always moves in batches.  An RDD's Python rows are turned into one Arrow
record batch per ~thousand rows on the Spark side; a DataFrame's own Arrow
batches are forwarded untouched.  On the node, a column becomes one numpy
array (a 2-D one for fixed-length vectors) without a per-row Python loop.
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any

import numpy as np
import pyarrow as pa

SHAPE_KEY = b"tfos.shape"
KIND_KEY = b"tfos.kind"  # how to rebuild Python rows: tuple | list | row | dict | scalar | vector | ndarray


class FeedDataError(ValueError):
    """A row that cannot be moved as a batch (ragged, wrong type...)."""


# ---------------------------------------------------------------------------
# Python rows -> Arrow
# ---------------------------------------------------------------------------


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.number, bool, np.bool_))


def row_kind(row: Any) -> tuple[str, list[str]]:
    """How a row splits into columns: (kind, column names)."""
    fields = getattr(row, "__fields__", None)
    if isinstance(row, tuple) and fields is not None:  # pyspark.sql.Row
        return "row", list(fields)
    if isinstance(row, dict):
        return "dict", [str(k) for k in row]
    if isinstance(row, np.ndarray):
        return "ndarray", ["_0"]
    if hasattr(row, "toArray"):  # pyspark.ml.linalg vectors
        return "ndarray", ["_0"]
    if isinstance(row, list) and row and all(_is_number(x) for x in row):
        return "vector", ["_0"]
    if isinstance(row, (tuple, list)):
        return ("tuple" if isinstance(row, tuple) else "list"), [f"_{i}" for i in range(len(row))]
    return "scalar", ["_0"]


def _flat_lists(values: list[Any]) -> np.ndarray | None:
    """Equal-length lists of Python floats as a 2-D float64 array, ~1.6x faster than np.asarray."""
    if not len(values):  # an empty column (a node's answer to an empty batch): np.asarray's empty array
        return None
    first = values[0]
    if not isinstance(first, (list, tuple)) or not first:
        return None
    # Integers would be truncated silently by fromiter: only float rows take this path.
    if type(first[0]) is not float or any(len(v) != len(first) for v in values):
        return None
    try:
        flat = np.fromiter(itertools.chain.from_iterable(values), dtype=np.float64, count=len(values) * len(first))
    except (TypeError, ValueError, OverflowError):
        return None
    return flat.reshape(len(values), len(first))


def _flat_to_arrow(arr: np.ndarray) -> pa.Array:
    """A 1-D numeric array as an Arrow array sharing its memory.

    Integers and floats are wrapped without ``pa.array``, whose first call imports pandas (~0.6 s, far more on a
    busy executor) in each Spark Python worker that feeds; booleans (bits in Arrow) go through ``pa.array``.
    """
    if arr.dtype.kind not in "iuf" or not arr.dtype.isnative:
        return pa.array(arr)
    arr = np.ascontiguousarray(arr)
    return pa.Array.from_buffers(pa.from_numpy_dtype(arr.dtype), len(arr), [None, pa.py_buffer(arr)])


def numbers_to_arrow(arr: np.ndarray) -> tuple[pa.Array, dict[bytes, bytes]]:
    """A numeric column: 1-D as is, n-D as a fixed-size list of its flattened rows (shape in the metadata)."""
    if arr.ndim == 1:
        return _flat_to_arrow(arr), {}
    n = arr.shape[0]
    inner = tuple(int(d) for d in arr.shape[1:])
    flat = _flat_to_arrow(np.ascontiguousarray(arr).reshape(-1))
    size = int(np.prod(inner))
    return pa.FixedSizeListArray.from_arrays(flat, size) if n else pa.array([], pa.list_(flat.type, size)), {
        SHAPE_KEY: json.dumps(inner).encode()
    }


def column_to_arrow(name: str, values: list[Any] | np.ndarray) -> tuple[pa.Array, dict[bytes, bytes]]:
    values = [v.toArray() if hasattr(v, "toArray") else v for v in values]
    arr = _flat_lists(values)
    if arr is None:
        try:
            arr = np.asarray(values)
        except ValueError:  # ragged nested lists
            arr = np.asarray(values, dtype=object)
    if arr.dtype.kind in "biuf" and arr.ndim >= 1:
        return numbers_to_arrow(arr)
    try:
        return pa.array(list(values)), {}
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise FeedDataError(f"column {name!r}: cannot convert values to a batch: {exc}") from None


def rows_to_batch(rows: list[Any]) -> pa.RecordBatch:
    """Convert a list of Python rows (tuples, Rows, dicts, vectors, scalars)."""
    kind, names = row_kind(rows[0])
    if kind in ("tuple", "list", "row"):
        width = len(names)
        for r in rows:
            if len(r) != width:
                raise FeedDataError(f"rows of different lengths: expected {width} values, got {len(r)}: {r!r:.200}")
        cols = [[r[i] for r in rows] for i in range(width)]
    elif kind == "dict":
        cols = [[r[k] for r in rows] for k in rows[0]]
    else:
        cols = [rows]
    return record_batch(kind, names, [column_to_arrow(name, values) for name, values in zip(names, cols)])


def record_batch(kind: str, names: list[str], columns: list[tuple[pa.Array, dict[bytes, bytes]]]) -> pa.RecordBatch:
    fields = [pa.field(name, arr.type, metadata=meta or None) for name, (arr, meta) in zip(names, columns)]
    schema = pa.schema(fields, metadata={KIND_KEY: kind.encode()})
    return pa.RecordBatch.from_arrays([arr for arr, _ in columns], schema=schema)


# ---------------------------------------------------------------------------
# Arrow -> numpy / Python rows
# ---------------------------------------------------------------------------


_NUMPY_TYPES = {pa.from_numpy_dtype(np.dtype(t)): np.dtype(t) for t in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")}


def array_to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``arr.to_numpy(zero_copy_only=False)``.  Numbers without nulls come as a read-only view of the array's
    buffer, read here: pyarrow's ``to_numpy`` imports pandas on first use, ~0.6 s of a node's first batch, and
    several times that while every core is busy starting Spark's tasks."""
    dtype = _NUMPY_TYPES.get(arr.type)
    if dtype is None or arr.null_count or not isinstance(arr, pa.Array):
        converted: np.ndarray = arr.to_numpy(zero_copy_only=False)
        return converted
    if not len(arr):
        return np.empty(0, dtype)
    view = np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    view.flags.writeable = False  # as pyarrow's: the batch's memory is shared
    return view


def _list_to_numpy(name: str, arr: pa.Array, shape: tuple[int, ...] | None) -> np.ndarray:
    n = len(arr)
    if arr.null_count:
        raise FeedDataError(f"column {name!r} has {arr.null_count} null value(s); fill them before feeding")
    if pa.types.is_fixed_size_list(arr.type):
        width = arr.type.list_size
        values = arr.values.slice(arr.offset * width, n * width)
    else:
        offsets = array_to_numpy(arr.offsets)
        lengths = np.diff(offsets)
        if n and not np.all(lengths == lengths[0]):
            raise FeedDataError(
                f"column {name!r} holds arrays of different lengths "
                f"({int(lengths.min())}..{int(lengths.max())}); expected one fixed length per column"
            )
        width = int(lengths[0]) if n else 0
        values = arr.values.slice(int(offsets[0]), n * width) if n else arr.values.slice(0, 0)
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type):
        inner = _list_to_numpy(name, values, None)
        out = inner.reshape((n, width) + inner.shape[1:])
    else:
        out = array_to_numpy(values).reshape(n, width)
    if shape is not None and out.shape[1:] != shape:
        out = out.reshape((n,) + shape)
    return out


def _vector_struct_to_numpy(name: str, arr: pa.StructArray) -> np.ndarray:
    """Spark ML's VectorUDT in Arrow: struct<type, size, indices, values>."""
    types = array_to_numpy(arr.field("type"))
    vals = arr.field("values")
    if np.all(types == 1):  # all dense
        return _list_to_numpy(name, vals, None).astype(np.float64, copy=False)
    sizes = arr.field("size").to_pylist()
    idx = arr.field("indices").to_pylist()
    values = vals.to_pylist()
    width = max((s for s in sizes if s is not None), default=len(values[0]) if values else 0)
    out = np.zeros((len(arr), width), dtype=np.float64)
    for i, (t, ix, v) in enumerate(zip(types, idx, values)):
        if t == 1:
            out[i, : len(v)] = v
        else:
            out[i, ix] = v
    return out


def column_to_numpy(batch: pa.RecordBatch | pa.Table, i: int) -> np.ndarray:
    field = batch.schema.field(i)
    col = batch.column(i)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    meta = field.metadata or {}
    shape = tuple(json.loads(meta[SHAPE_KEY])) if SHAPE_KEY in meta else None
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _list_to_numpy(field.name, col, shape)
    if pa.types.is_struct(t) and {f.name for f in t} >= {"type", "size", "indices", "values"}:
        return _vector_struct_to_numpy(field.name, col)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        return np.asarray(col.to_pylist(), dtype=object)
    if col.null_count:
        raise FeedDataError(f"column {field.name!r} has {col.null_count} null value(s); fill them before feeding")
    return array_to_numpy(col)


def batch_to_columns(batch: pa.RecordBatch | pa.Table) -> list[np.ndarray]:
    return [column_to_numpy(batch, i) for i in range(batch.num_columns)]


def _array_values(batch: pa.RecordBatch | pa.Table, i: int) -> list[Any] | None:
    """A list column's values as one numpy array per row (views into one array), or None when it must stay Python.

    Only numeric list columns (fixed-size or list, nested too) with no nulls, at
    any depth, and one length per column take this path; the arrays share the
    batch's buffers where Arrow allows it (no copy) and are then read-only.
    """
    col = batch.column(i)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t, inner = col.type, col
    while _is_list_type(t):
        if inner.null_count:
            return None
        inner = inner.flatten()
        t = t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or inner.null_count:
        return None
    try:
        arr = column_to_numpy(batch, i)
    except FeedDataError:  # ragged: Python lists, as before
        return None
    return list(arr)


def _pylist(col: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``col.to_pylist()``; through numpy for numbers without nulls (same Python values, ~10x faster)."""
    t = col.type
    if not col.null_count and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        out: list[Any] = array_to_numpy(col).tolist()
        return out
    values: list[Any] = col.to_pylist()
    return values


def _is_list_type(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def batch_to_rows(batch: pa.RecordBatch | pa.Table, numpy_arrays: bool = False) -> list[Any]:
    """Rebuild the Python rows a batch came from (for TensorFlowOnSpark's ``next_batch``).

    A DataFrame's own Arrow batches carry no kind: their rows come back as
    ``pyspark.sql.Row`` (as ``df.rdd`` gives them), fields by name or position.
    With ``numpy_arrays``, a numeric array column's values are numpy arrays
    (read-only views into the batch) instead of Python lists; other columns
    (scalars, strings, arrays with nulls or of different lengths) are unchanged.
    """
    meta = batch.schema.metadata or {}
    kind = meta.get(KIND_KEY, b"row").decode()
    if kind in ("scalar",):
        scalars: list[Any] = batch.column(0).to_pylist()
        return scalars
    if kind in ("vector", "ndarray"):
        if kind == "ndarray":
            return list(column_to_numpy(batch, 0))
        vals = _array_values(batch, 0) if numpy_arrays else None
        return vals if vals is not None else column_to_numpy(batch, 0).tolist()
    cols = [
        (numpy_arrays and _is_list_type(batch.schema.field(i).type) and _array_values(batch, i))
        or _pylist(batch.column(i))
        for i in range(batch.num_columns)
    ]
    if kind == "dict":
        names = batch.schema.names
        return [dict(zip(names, vals)) for vals in zip(*cols)]
    if kind == "list":
        return [list(vals) for vals in zip(*cols)]
    if kind == "row" and cols:  # a DataFrame's rows (df.rdd): pyspark.sql.Row, fields by name
        make = functools.partial(tuple.__new__, _row_class(tuple(batch.schema.names)))
        return list(map(make, zip(*cols)))
    return list(zip(*cols)) if cols else []


@functools.lru_cache(maxsize=64)
def _row_class(names: tuple[str, ...]) -> type:
    """A ``pyspark.sql.Row`` subclass whose rows share one field list (no per-row attribute to set)."""
    from pyspark.sql import Row

    return type("Row", (Row,), {"__fields__": list(names), "__slots__": ()})


def warm_up() -> None:
    """Import ``pyspark.sql.Row`` (a DataFrame's rows from ``next_batch``).  Run in a thread as a fed node starts,
    so the first batch does not wait for it (~0.1 s, a second or more while every core starts Spark's tasks)."""
    try:
        _row_class(("_",))
    except Exception:  # noqa: BLE001 - only a head start: the first batch meets the same error and reports it
        pass


# ---------------------------------------------------------------------------
# Arrow IPC
# ---------------------------------------------------------------------------


def encode_ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def decode_ipc(buf: Any) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(buf) if not isinstance(buf, pa.Buffer) else buf)
    return reader.read_next_batch()
