"""Arrow columns ↔ numpy tensors, and TensorFlow dtypes → Spark types (runs in Python workers too)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ._model_runners import TensorInfo


def spark_type(info: TensorInfo) -> Any:
    """The result column's type: a scalar per row for shape (batch,), nested arrays beyond."""
    from pyspark.sql import types as T

    base = {
        "float16": T.FloatType(), "float32": T.FloatType(), "float64": T.DoubleType(),
        "int8": T.IntegerType(), "int16": T.IntegerType(), "uint8": T.IntegerType(), "uint16": T.IntegerType(),
        "int32": T.IntegerType(), "int64": T.LongType(), "uint32": T.LongType(), "bool": T.BooleanType(),
        "string": T.BinaryType(),
    }.get(info.dtype)
    if base is None:
        msg = f"output {info.name!r} has dtype {info.dtype}, which has no Spark column type"
        raise ValueError(msg)
    t: T.DataType = base
    for _ in info.shape[1:]:
        t = T.ArrayType(t, containsNull=True)
    return t


_CAST = {"float16": np.float32, "int8": np.int32, "int16": np.int32, "uint8": np.int32, "uint16": np.int32,
         "uint32": np.int64}


def to_arrow(values: np.ndarray, n: int) -> pa.Array:
    """A (n, d1, d2…) array as an Arrow column of n nested lists (a scalar column when 1-D)."""
    values = np.asarray(values)
    if values.ndim == 0 or values.shape[0] != n:
        msg = f"the model returned {values.shape} for a batch of {n} rows; outputs need the batch dimension first"
        raise ValueError(msg)
    cast = _CAST.get(values.dtype.name)
    if cast is not None:
        values = values.astype(cast)
    if values.dtype.kind in "OSU":
        values = np.array([v if isinstance(v, bytes) else str(v).encode() for v in values.reshape(-1)],
                          dtype=object).reshape(values.shape)
    arr: pa.Array = pa.array(values.reshape(-1))
    for dim in reversed(values.shape[1:]):
        count = len(arr) // dim if dim else n
        offsets = pa.array(np.arange(count + 1, dtype=np.int32) * dim)
        arr = pa.ListArray.from_arrays(offsets, arr)
    return arr


def to_numpy(col: pa.Array, info: TensorInfo, column: str) -> np.ndarray:
    """An Arrow column (scalars or equal-length nested lists) as a tensor for ``info``."""
    n = len(col)
    if col.null_count:
        msg = f"column {column!r} has null values; tensor {info.name!r} cannot take them"
        raise ValueError(msg)
    dims: list[int] = []
    values = col
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(
        values.type
    ):
        lengths = values.value_lengths().to_numpy(zero_copy_only=False) if len(values) else np.zeros(0, np.int64)
        if len(lengths) and (lengths != lengths[0]).any():
            msg = (f"column {column!r} has arrays of different lengths ({int(lengths.min())}..{int(lengths.max())}); "
                   f"tensor {info.name!r} needs one shape {list(info.shape)}")
            raise ValueError(msg)
        dims.append(int(lengths[0]) if len(lengths) else max(info.shape[len(dims) + 1], 0)
                    if len(info.shape) > len(dims) + 1 else 0)
        values = values.flatten()
    shape = (n, *dims)
    want = info.shape
    if want and len(dims) == 1 and len(want) > 2:
        return _reshaped(values, n, dims[0], info, column)
    if want and (len(want) != len(shape) or any(w not in (-1, g) for w, g in zip(want[1:], shape[1:]))):
        msg = (f"column {column!r} gives rows of shape {list(shape[1:])} but tensor {info.name!r} "
               f"takes {list(want[1:])} per row (full shape {list(want)}, -1 = any)")
        raise ValueError(msg)
    flat = values.to_numpy(zero_copy_only=False)
    if info.dtype == "string":
        return np.asarray(flat, dtype=object).reshape(shape)
    return np.asarray(flat).astype(info.dtype, copy=False).reshape(shape)


def _reshaped(values: pa.Array, n: int, per_row: int, info: TensorInfo, column: str) -> np.ndarray:
    """A flat array per row, reshaped to the tensor's per-row shape (TensorFlowOnSpark coerces it the same way)."""
    target = list(info.shape[1:])
    known = int(np.prod([d for d in target if d != -1]))
    unknown = target.count(-1)
    if unknown > 1 or (unknown == 0 and known != per_row) or (unknown == 1 and (known == 0 or per_row % known)):
        msg = (f"column {column!r} has {per_row} values per row, which do not reshape to tensor {info.name!r}'s "
               f"per-row shape {target} (full shape {list(info.shape)}, -1 = any)")
        raise ValueError(msg)
    if unknown:
        target[target.index(-1)] = per_row // known if known else 0
    flat = values.to_numpy(zero_copy_only=False)
    if info.dtype == "string":
        return np.asarray(flat, dtype=object).reshape((n, *target))
    return np.asarray(flat).astype(info.dtype, copy=False).reshape((n, *target))
