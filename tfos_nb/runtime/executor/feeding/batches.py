"""A partition's Arrow batches as a feeding task sends them: in batches of at most ``batch_rows``, with the shape of
their first row said, without the rows a resumed epoch's backup had trained on."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from ...batches import columns
from ...recovery import ledger


def count_rows(batches: Iterator[Any]) -> int:
    return sum(b.num_rows for b in batches)


def with_sample(batches: Iterable[Any]) -> tuple[Iterator[Any], dict[str, Any]]:
    """``batches`` (unchanged) and the shape of their rows, from the first that has one: the Arrow schema (IPC,
    hex) and each column's value shape (``columns.batch_to_columns`` of one row).  The driver passes the first it
    hears of to every node: one given no row of an epoch builds its dataset from it.  Empty for no rows."""
    it = iter(batches)
    head: list[Any] = []
    for batch in it:
        head.append(batch)
        if batch.num_rows:
            try:
                shapes = [list(col.shape[1:]) for col in columns.batch_to_columns(batch.slice(0, 1))]
            except columns.FeedDataError:  # the feed itself reports it
                return itertools.chain(head, it), {}
            return itertools.chain(head, it), {"schema": bytes(batch.schema.serialize()).hex(), "shapes": shapes}
    return iter(head), {}


def without(batches: Iterable[Any], skip: list[tuple[int, int]]) -> Iterator[Any]:
    """``batches`` (a partition's, in order) without the rows at the partition's offsets in ``skip``."""
    offset = 0
    for batch in batches:
        n = batch.num_rows
        for start, length in ledger.kept_slices(skip, offset, n):
            yield batch.slice(start, length) if length < n else batch
        offset += n


def rechunk(batches: Iterable[Any], batch_rows: int) -> Iterator[Any]:
    for b in batches:
        for off in range(0, b.num_rows, batch_rows):
            yield b.slice(off, batch_rows)
