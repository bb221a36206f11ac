"""Deterministic mode's feed on the driver: which node reads a training partition, and after which one.

Partition ``p`` of every epoch goes to the ``p mod n``-th of the ``n`` training nodes (the chief and workers, by
index), told to read it after partition ``p - n``: each node reads its partitions whole and in ascending order,
the same stream at every run, whichever executor ran which task and whenever.  The node's half
(:mod:`.turns`) keeps a partition that came early aside until the one before it is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

N = TypeVar("N")


def reader(partition: int, nodes: Sequence[N]) -> tuple[N, int]:
    """The node of ``nodes`` (the training nodes in index order) that reads ``partition``, and the partition it
    reads just before (-1: none, this is its first)."""
    if not nodes:
        raise ValueError("deterministic mode's feed needs a training node")
    return nodes[partition % len(nodes)], max(partition - len(nodes), -1)
