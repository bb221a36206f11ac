"""An RDD's Python rows -> Arrow record batches, as they stream through a feeding task.

TensorFlowOnSpark's programs feed RDDs of ``(features, label)`` tuples, features
a list of Python floats.  Kept until a batch is full and then converted, such
rows cost more than Spark's own work of unpickling them: the garbage collector
walks every float of every kept row, and ``np.fromiter`` converts one float at a
time.  Packed as they arrive, they cost about half (see :func:`rows_to_batches`).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from . import columns


def rows_to_batches(rows: Iterable[Any], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """A partition's Python rows as batches of ``batch_rows`` rows (the last one shorter), each with the schema and
    values ``columns.rows_to_batch`` gives its slice.

    Rows of one shape whose vector columns are equal-length lists of floats (TensorFlowOnSpark's
    ``(features, label)`` tuples) are packed as they arrive rather than kept until their batch is full: a
    vector's floats go straight into the batch's array (``struct``, ~1.7x faster than ``np.fromiter``), and the
    row is dropped at once, so the garbage collector never walks a thousand rows of floats.  From the first row
    that does not fit the partition's shape on, its rows are kept and converted per batch as before.
    """
    it = iter(rows)
    packer = None
    for first in it:
        packer = _Packer.for_row(first, batch_rows)
        if packer is None:
            break
        misfit = None
        for row in itertools.islice(it, batch_rows - 1):
            if not packer.add(row):
                misfit = row
                break
        yield packer.batch()
        if misfit is not None:
            it = itertools.chain([misfit], it)
            break
    else:
        return
    buf = [first] if packer is None else []
    for row in it:
        buf.append(row)
        if len(buf) >= batch_rows:
            yield columns.rows_to_batch(buf)
            buf = []
    if buf:
        yield columns.rows_to_batch(buf)


class _Packer:
    """One batch of rows of one shape: float vectors packed as they come, other columns kept as values."""

    def __init__(self, row: Any, kind: str, names: list[str], lengths: list[int], batch_rows: int) -> None:
        self.kind, self.names, self.type, self.width = kind, names, type(row), len(names)
        self.vectors = [(i, struct.Struct(f"{n}d"), n * 8, np.empty((batch_rows, n))) for i, n in enumerate(lengths)
                        if n]
        self.values: list[tuple[int, list[Any]]] = [(i, []) for i, n in enumerate(lengths) if not n]
        self.n = 0
        self.add(row)

    @classmethod
    def for_row(cls, row: Any, batch_rows: int) -> _Packer | None:
        """A packer when ``row`` has a vector of floats to pack (else None: ``columns.rows_to_batch`` does as well)."""
        kind, names = columns.row_kind(row)
        if kind not in ("tuple", "list", "row"):
            return None
        lengths = [len(v) if type(v) in (list, tuple) and v and type(v[0]) is float else 0 for v in row]
        packer = cls(row, kind, names, lengths, batch_rows) if any(lengths) else None
        return packer if packer is not None and packer.n else None

    def add(self, row: Any) -> bool:
        """Pack ``row``; False (and nothing taken) when it does not fit this batch's shape."""
        if type(row) is not self.type or len(row) != self.width:
            return False
        n = self.n
        try:
            for i, st, size, out in self.vectors:
                v = row[i]
                if type(v) not in (list, tuple) or len(v) * 8 != size:
                    return False
                st.pack_into(out, n * size, *v)  # type: ignore[arg-type]  # an ndarray is a writable buffer
        except (struct.error, OverflowError, TypeError):  # not a float: np.asarray decides what the column becomes
            return False
        for i, values in self.values:
            values.append(row[i])
        self.n = n + 1
        return True

    def batch(self) -> pa.RecordBatch:
        cols: list[Any] = [None] * self.width
        for i, _, _, out in self.vectors:
            cols[i] = columns.numbers_to_arrow(out[: self.n])
        for i, values in self.values:
            cols[i] = columns.column_to_arrow(self.names[i], values)
        return columns.record_batch(self.kind, self.names, cols)
