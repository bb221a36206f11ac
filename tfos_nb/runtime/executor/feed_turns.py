"""Deterministic mode's turns on a node: each training connection names the partition its node reads before it
(``Conn.after``, same generation); its items wait aside (``Conn.held``, not bounded) until every row of that
partition was taken, then join the hub's queue — so a node reads its partitions whole, in the driver's order.

A held connection is answered as soon as all its rows are here (:meth:`FeedHub.end_conn`): its feeding task ends
and frees its Spark slot.  A task waiting for its turn in a slot would keep the partition its node reads now from
running when Spark has fewer slots than partitions — and under a synchronous strategy the other nodes, waiting for
this one to step, would never read on either.  The cost: a node may keep in memory the partitions Spark sent it
early, at most its share of the epochs in flight.

Not thread-safe on its own: the :class:`~.feed_hub.FeedHub` calls it with its lock held.
"""

from __future__ import annotations

import collections
from typing import Any

from .feed_conn import Conn

Item = tuple[str, Conn, Any]  # the hub's queue items: ("data", conn, batch) and ("eoc", conn, None)


class Turns:
    """Which partitions of each generation were all taken here, and the connections waiting for theirs."""

    def __init__(self) -> None:
        self._taken: dict[int, set[int]] = {}  # generation -> partitions all taken
        self.waiting: list[Conn] = []  # connections whose partition before is not all taken

    def held(self, conn: Conn) -> collections.deque[Item] | None:
        """Where ``conn``'s items wait (None: straight to the queue); ``conn`` is held, or not, when first seen."""
        if conn.after >= 0 and conn.held is None:
            if conn.after in self._taken.get(conn.gen, ()):
                conn.after = -1
            else:
                conn.held = collections.deque()
                self.waiting.append(conn)
        return conn.held

    def taken(self, conn: Conn) -> list[Conn]:
        """``conn``'s partition is all taken (or gone): the connections whose turn it makes, their items in
        ``held`` still (the hub moves them to its queue and clears it)."""
        if conn.mode != "train" or conn.feed != "input":
            return []
        self._taken.setdefault(conn.gen, set()).add(conn.partition)
        turn = [c for c in self.waiting if c.gen == conn.gen and c.after == conn.partition]
        for c in turn:
            self.waiting.remove(c)
            c.after = -1
        return turn

    def drop(self, conn: Conn) -> None:
        """A held connection broke: its items go with it."""
        if conn in self.waiting:
            self.waiting.remove(conn)
            conn.held = None

    def in_gen(self, gen: int) -> bool:
        return any(c.gen == gen for c in self.waiting)

    def rows(self) -> dict[int, int]:
        """Rows held, by generation."""
        out: dict[int, int] = {}
        for c in self.waiting:
            out[c.gen] = out.get(c.gen, 0) + sum(b.num_rows for kind, _, b in c.held or () if kind == "data")
        return out

    def forget_through(self, epoch: int) -> None:
        self._taken = {g: parts for g, parts in self._taken.items() if g > epoch}

    def clear(self) -> list[Item]:
        """Every held item, no longer held (the node reads no more)."""
        items = [item for c in self.waiting for item in c.held or ()]
        for c in self.waiting:
            c.held = None
        self.waiting.clear()
        return items
