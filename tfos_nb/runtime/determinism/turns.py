"""Deterministic mode's turns on a node: each training connection names the partition its node reads before it
(``Conn.after``, same generation); its items wait aside (``Conn.held``) until every row of that partition was
taken, then join the hub's queue — so a node reads its partitions whole, in the driver's order.

A held connection is answered as soon as all its rows are here (:meth:`FeedHub.end_conn`): its feeding task ends
and frees its Spark slot.  A task waiting for its turn in a slot would keep the partition its node reads now from
running when Spark has fewer slots than partitions — and under a synchronous strategy the other nodes, waiting for
this one to step, would never read on either.  So Spark runs a node's later partitions as fast as it computes
them, and the node keeps them: in memory up to ``TFOS_NB_FEED_HOLD_MB`` (256 MB) of held batches, then in an Arrow
file per partition in a private temporary folder (as Spark spills a shuffle), read back in order when its turn
comes and removed once read.  A spilled partition joins the queue once all of it arrived.  The folder is under
the node's ``TMPDIR``, which its owner removes however the node ends (:class:`~..private.PrivateTmp`): a node
killed with SIGKILL leaves none of it.

Not thread-safe on its own: the :class:`~tfos_nb.runtime.executor.feed.hub.FeedHub` calls it with its lock held.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
from typing import Any

import pyarrow as pa

from ..executor.feed.conn import Conn

log = logging.getLogger(__name__)
Item = tuple[str, Conn, Any]  # the hub's queue items: ("data", conn, batch) and ("eoc", conn, None)
ENV_HOLD_MB = "TFOS_NB_FEED_HOLD_MB"


def hold_budget() -> int:
    """Bytes of held batches a node keeps in memory before it spills (``TFOS_NB_FEED_HOLD_MB``, default 256)."""
    try:
        return max(0, int(float(os.environ.get(ENV_HOLD_MB, "256")) * 2**20))
    except ValueError:
        return 256 * 2**20


class Spill:
    """One held partition's batches past the memory budget, in an Arrow stream file."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        self.path = path
        self._sink = pa.OSFile(path, "wb")
        self._writer: Any = pa.ipc.new_stream(self._sink, schema)
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None

    def batches(self) -> Any:
        """The batches back, in order (after :meth:`close`)."""
        with pa.OSFile(self.path, "rb") as source:
            yield from pa.ipc.open_stream(source)


class Turns:
    """Which partitions of each generation were all taken here, and the connections waiting for theirs."""

    def __init__(self, budget: int | None = None) -> None:
        self._taken: dict[int, set[int]] = {}  # generation -> partitions all taken
        self.waiting: list[Conn] = []  # connections whose partition before is not all taken (or, spilled, not all in)
        self.replaying: set[Conn] = set()  # spilled connections whose batches are being read back into the queue
        self.budget = hold_budget() if budget is None else budget
        self.held_bytes = 0  # held batches in memory
        self._spills: dict[Conn, Spill] = {}
        self._folder: str | None = None
        self.spilled = 0  # partitions spilled to disk, for the node's log and the tests

    def held(self, conn: Conn) -> collections.deque[Item] | None:
        """Where ``conn``'s items wait (None: straight to the queue); ``conn`` is held, or not, when first seen."""
        if conn.after >= 0 and conn.held is None and conn not in self.replaying:
            if conn.after in self._taken.get(conn.gen, ()):
                conn.after = -1
            else:
                conn.held = collections.deque()
                self.waiting.append(conn)
        return conn.held

    def keep(self, conn: Conn, batch: pa.RecordBatch) -> None:
        """A held connection's batch: in memory within the budget, else (and for the rest of it) on disk."""
        spill = self._spills.get(conn)
        if spill is None and self.held_bytes + batch.nbytes <= self.budget:
            assert conn.held is not None
            conn.held.append(("data", conn, batch))
            self.held_bytes += batch.nbytes
            return
        if spill is None:
            if self._folder is None:
                self._folder = tempfile.mkdtemp(prefix="tfos_nb-held-")  # 0700: this node's rows only
            spill = self._spills[conn] = Spill(os.path.join(self._folder, f"g{conn.gen}-p{conn.partition}.arrows"),
                                               batch.schema)
            self.spilled += 1
            log.debug("partition %d of epoch %d came before its turn: kept on disk past %d bytes in memory",
                      conn.partition, conn.gen, self.budget)
        spill.write(batch)

    def taken(self, conn: Conn) -> list[Conn]:
        """``conn``'s partition is all taken (or gone): the connections whose turn it makes and that can join the
        queue now — a spilled one once all of it is in (:meth:`ready`)."""
        if conn.mode != "train" or conn.feed != "input":
            return []
        self._taken.setdefault(conn.gen, set()).add(conn.partition)
        turn = [c for c in self.waiting if c.gen == conn.gen and c.after == conn.partition]
        for c in turn:
            c.after = -2  # its turn came
        return [c for c in turn if self.ready(c)]

    def ready(self, conn: Conn) -> bool:
        """Whether ``conn``, whose turn came, can join the queue: not spilled, or spilled and all in."""
        return conn.after == -2 and (conn not in self._spills or conn.ended)

    def release(self, conn: Conn) -> tuple[list[Item], Spill | None]:
        """``conn`` joins the queue: its items in memory (its end left out when it spilled) and its spill file."""
        self.waiting.remove(conn)
        conn.after = -1
        items, conn.held = list(conn.held or ()), None
        self.held_bytes -= sum(b.nbytes for kind, _, b in items if kind == "data")
        spill = self._spills.pop(conn, None)
        if spill is not None:
            spill.close()
            items = [item for item in items if item[0] == "data"]
            self.replaying.add(conn)
        return items, spill

    def replayed(self, conn: Conn, spill: Spill) -> None:
        self.replaying.discard(conn)
        try:
            os.unlink(spill.path)
        except OSError:
            pass

    def drop(self, conn: Conn) -> None:
        """A held connection broke: its items go with it."""
        if conn in self.waiting:
            self.waiting.remove(conn)
            self.held_bytes -= sum(b.nbytes for kind, _, b in conn.held or () if kind == "data")
            conn.held = None
            spill = self._spills.pop(conn, None)
            if spill is not None:
                spill.close()
                self.replayed(conn, spill)

    def in_gen(self, gen: int) -> bool:
        return any(c.gen == gen for c in self.waiting) or any(c.gen == gen for c in self.replaying)

    def rows(self) -> dict[int, int]:
        """Rows held (in memory or spilled), by generation."""
        out: dict[int, int] = {}
        for c in self.waiting:
            n = sum(b.num_rows for kind, _, b in c.held or () if kind == "data")
            out[c.gen] = out.get(c.gen, 0) + n + (self._spills[c].rows if c in self._spills else 0)
        return out

    def forget_through(self, epoch: int) -> None:
        self._taken = {g: parts for g, parts in self._taken.items() if g > epoch}

    def clear(self) -> list[Item]:
        """Every held item in memory, no longer held (the node reads no more); spill files removed (their rows are
        counted in the returned ``("spilled", conn, rows)`` items)."""
        items = [item for c in self.waiting for item in c.held or ()]
        for c in self.waiting:
            c.held = None
        for c, spill in self._spills.items():
            spill.close()
            items.append(("spilled", c, spill.rows))
        self.waiting.clear()
        self._spills.clear()
        self.held_bytes = 0
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        return items
