"""The node's feed hub: what feeding tasks' connections bring, queued for the node's function to read.

Feeding tasks connect to the node's :class:`.server.DataServer`; each connection's reader thread puts
Arrow record batches into the :class:`FeedHub`, in one bounded queue per generation (epoch):
back-pressure reaches Spark through TCP.  ``feed.DataFeed`` reads from the hub.

The driver keeps two epochs' feeding jobs in flight, so the next epoch's partitions can arrive
while this one is read.  A reader bounded to epoch ``g`` takes only generations up to ``g`` and
ends when they are empty and either the driver said ``g`` is complete (``end_epoch``: every
feeder acknowledged) or this node's share of ``g`` is in: the driver said how many of ``g``'s
partitions it sent here once it had sent them all (``epoch_assigned``) and as many of them
ended.  The second is what lets nodes that got unequal shares train together: under
``MultiWorkerMirroredStrategy`` a node that waited for the whole epoch's end would wait for
rows the other nodes can only read by stepping with it.  The next epoch's data waits in its own
queue.  The bound is per generation: one bound for all, filled by the next epoch's feeders,
would block this epoch's feeders while the reader waits for them.

Deterministic mode: a node reads its partitions whole, in the driver's order (:mod:`tfos_nb.runtime.determinism.turns`).

Out of step: the driver tells the nodes which epochs the running ``train()`` feeds (``plan``); a bounded read
past them while the last is not all read elsewhere (a dataset iterated once more than the job's epochs) would
deadlock a synchronous strategy, so after :data:`.plan.AHEAD_S` it raises :class:`.plan.FeedOutOfStep`, naming
the node.  Once the fed epochs are all read, a read past them waits for the next ``train()`` or the stop.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ... import step_time
from ...batches import columns
from ...batches import results as inference_results
from ...determinism import turns as feed_turns
from ...protocol import dataplane
from . import plan as feed_plan
from .conn import Conn
from .epochs import Epochs

log = logging.getLogger(__name__)

_QUEUE_BATCHES = 16
class FeedHub:
    """The queue between connections and the consumer, plus the end-of-data signals."""

    def __init__(self, max_batches: int = _QUEUE_BATCHES, on_close: Callable[[], None] | None = None,
                 label: str = "this node", on_drop: Callable[[Conn], None] | None = None,
                 hold_bytes: int | None = None, on_past: Callable[[int, int], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._on_close, self._on_drop = on_close, on_drop  # to the driver: "reads no more", "a partition cut short"
        # to the driver: a read waits past the running train()'s epochs (the epoch asked, rows read of the last one)
        self._on_past = on_past
        self._conns: set[Conn] = set()  # connections not yet answered
        self.error: str | None = None  # why the node's function failed, once it did
        self.named: Any = None  # the node's named sets (named_feeds.NamedFeeds), read by DataFeed(qname_in=name)
        # per generation, in arrival order: ("data", conn, batch) and ("eoc", conn, None) at a partition's end
        self._queues: dict[int, collections.deque[tuple[str, Conn, Any]]] = {}
        self._sizes: dict[int, int] = {}  # data items queued per generation (what the bound counts)
        self._max = max_batches
        self.stopped = False  # the driver asked the cluster to stop
        self.closed = False  # terminate() or the user's function returned: discard new data
        self.epochs = Epochs(label)  # which epochs are fed, how much of each came here, which a read takes next
        self.rows = 0
        self.skipped = 0
        self._pending: collections.deque[tuple[Conn, int]] = collections.deque()
        self._last_take = 0
        # deterministic mode: partitions read in the driver's order (``hold_bytes``: kept in memory before spilling)
        self._turns = feed_turns.Turns(hold_bytes)

    def _partition_taken(self, conn: Conn) -> None:
        """``conn``'s partition is all taken (or gone): the connections whose turn it makes join the queue; lock
        held."""
        for nxt in self._turns.taken(conn):
            self._release(nxt)

    def _release(self, conn: Conn) -> None:
        """A held connection's turn: its items join the queue — what it spilled through a thread that reads the file
        back as a feeder would send it (bounded by the queue); lock held."""
        items, spill = self._turns.release(conn)
        self._enqueue(conn.gen, items, sum(1 for kind, _, _ in items if kind == "data"))
        if spill is None:
            self._maybe_finish(conn)  # an empty partition is all taken at once
        else:
            threading.Thread(target=self._replay, args=(conn, spill), name="tfos-feed-replay", daemon=True).start()

    def _replay(self, conn: Conn, spill: feed_turns.Spill) -> None:
        replayed = 0
        try:
            for batch in spill.batches():
                with self._cond:
                    self._wait_for_room(conn.gen)
                    if self.closed:
                        break
                    self._enqueue(conn.gen, [("data", conn, batch)], 1)
                    replayed += batch.num_rows
        except (OSError, pa.ArrowException) as exc:  # the node's own temporary file: its rows are lost, say so
            log.warning("partition %d of epoch %d: its rows kept on disk could not be read back: %s", conn.partition,
                        conn.gen, exc)
        with self._cond:
            self._turns.replayed(conn, spill)
            if replayed < spill.rows:  # closed meanwhile (or the file failed): the rest is not read
                conn.skipped += spill.rows - replayed
                self.skipped += spill.rows - replayed
            if not self.closed:
                self._enqueue(conn.gen, [("eoc", conn, None)], 0)

    def _wait_for_room(self, gen: int) -> None:
        """Back-pressure: wait while ``gen``'s queue holds its bound of batches (or until the hub closes); lock held."""
        while self._sizes.get(gen, 0) >= self._max and not self.closed:
            self._cond.wait(0.5)

    def _enqueue(self, gen: int, items: list[feed_turns.Item], data: int) -> None:
        """``items`` to the end of ``gen``'s queue, its ``data`` batches among them counted against the bound (the
        caller knows how many: no count per batch on the hot path); lock held."""
        self._queues.setdefault(gen, collections.deque()).extend(items)
        self._sizes[gen] = self._sizes.get(gen, 0) + data
        self._cond.notify_all()

    # -- producers (reader threads, control thread) --------------------------
    def put(self, conn: Conn, gen: int, batch: pa.RecordBatch) -> None:
        with self._cond:
            self._conns.add(conn)
            if conn.counted:
                self.epochs.counted.add(gen)
            held = self._turns.held(conn)
            if held is None:
                self._wait_for_room(gen)
            conn.received += batch.num_rows
            if self.closed:
                conn.skipped += batch.num_rows
                self.skipped += batch.num_rows
                return
            if held is not None:
                self._turns.keep(conn, batch)
                return
            self._enqueue(gen, [("data", conn, batch)], 1)

    def peek(self) -> pa.RecordBatch | None:
        """The oldest queued batch, left in place (``as_dataset`` builds its signature from it); blocks until one
        arrives, None once the feed ended without one.  A node whose share of the next epoch it reads is all in and
        empty (it got no partition, or empty ones) gets a row of zeros shaped as the fed data's
        (:attr:`.epochs.Epochs.sample`, never read as data): waiting for a row would wait for an epoch its peers can
        only end by stepping with it."""
        ahead = feed_plan.Ahead()
        with self._cond:
            while True:
                for g in sorted(self._queues):
                    for kind, _, batch in self._queues[g]:
                        if kind == "data":
                            return batch
                gen = self.epochs.next(self._has_rows)
                self._waits_past(gen)  # told even when the stop ends it at once: its peers may still step
                if self.stopped or self.closed:
                    return None
                if self.epochs.in_call(gen) and self.epochs.share_in(gen) and self.epochs.sample is not None:
                    return self.epochs.sample  # an empty share of this call's epoch (no row is queued: above)
                if ahead.still(self.epochs.ahead(gen)):  # a new dataset while the call's last epoch is read elsewhere
                    raise self.epochs.out_of_step_error(gen)
                self._cond.wait(0.5)

    def _has_rows(self, gen: int) -> bool:
        """Whether rows of ``gen`` are queued here; lock held."""
        return any(kind == "data" for kind, _, _ in self._queues.get(gen, ())) or self._turns.rows().get(gen, 0) > 0 \
            or any(c.gen == gen for c in self._turns.replaying)

    def queued_rows(self) -> dict[int, int]:
        """Rows waiting to be read, by generation."""
        with self._cond:
            rows = {g: sum(b.num_rows for kind, _, b in q if kind == "data") for g, q in self._queues.items() if q}
            for g, n in self._turns.rows().items():
                rows[g] = rows.get(g, 0) + n
            return rows

    def end_conn(self, conn: Conn) -> None:
        with self._cond:
            conn.ended = True
            self.epochs.conn_ended(conn.gen)
            if self.closed:
                self._finish_closed(conn)
                return
            self._conns.add(conn)
            held = self._turns.held(conn)
            if held is not None:  # all its rows are in this node's keeping: its feeding task ends, freeing its slot
                held.append(("eoc", conn, None))
                conn.finish(rows=conn.received)
                if self._turns.ready(conn):  # its turn came while it was spilling: all of it is in now
                    self._release(conn)
                self._cond.notify_all()
                return
            self._maybe_finish(conn)
            # marks the partition's end for inference batches
            self._queues.setdefault(conn.gen, collections.deque()).append(("eoc", conn, None))
            self._cond.notify_all()

    def _maybe_finish(self, conn: Conn) -> None:
        """Ack a feeder as soon as all its rows are taken (train) or answered (inference); lock held."""
        if conn.held is None and conn.ended and (conn.consumed if conn.mode == "train" else conn.answered) >= conn.received:
            self._conns.discard(conn)
            conn.finish()
            self._partition_taken(conn)

    def drop(self, conn: Conn, error: str) -> None:
        """A connection broke (the feeder went away): forget it; a training one cut short is told (``on_drop``)."""
        with self._cond:
            self._conns.discard(conn)
            cut_short = not conn.ended and conn.mode == "train" and not (self.closed or self.stopped)
            if not conn.ended:
                self.epochs.conn_ended(conn.gen)
                self._cond.notify_all()
            self._turns.drop(conn)  # held rows go with it (a training partition cut short: the cluster fails)
            self._partition_taken(conn)
        conn.finish(error)
        if cut_short and self._on_drop is not None:
            self._on_drop(conn)

    def end_epoch(self, epoch: int) -> None:
        """The driver saw every partition of generations up to ``epoch`` fed: readers of them end once they are read."""
        with self._cond:
            if self.epochs.end(epoch):
                self._turns.forget_through(epoch)
                self._cond.notify_all()

    def epoch_assigned(self, epoch: int, partitions: int, rows: int = -1, most: int = -1) -> None:
        """Every partition of ``epoch`` went to a node, ``partitions`` of them to this one; in a counted epoch,
        ``rows`` of its rows and ``most``, the largest share of any node."""
        with self._cond:
            self.epochs.assigned(epoch, partitions, rows, most)
            self._cond.notify_all()

    def counted(self) -> bool:
        """Whether the epoch the next bounded read takes was counted: its length known to the node before it ends."""
        with self._cond:
            return self.epochs.next(self._has_rows) in self.epochs.counted

    def planned(self, gen: int, timeout: float) -> tuple[int, int] | None:
        """(rows sent here, the most any node got) of counted epoch ``gen``, waiting up to ``timeout`` s for the
        driver's word (it comes with the heartbeat's answer once every partition went out); None without it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.epochs.planned(gen) is None and not self.closed and time.monotonic() < deadline:
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            return self.epochs.planned(gen)

    def set_plan(self, first: int, last: int, sample: dict[str, Any] | None = None) -> None:
        """The running ``train()`` feeds epochs ``first``..``last`` (0, 0: no train() call announced); ``sample``:
        its data's shape (``{"schema", "shapes"}``), once a feeding task told the driver."""
        with self._cond:
            self.epochs.set_plan(first, last, sample)
            self._cond.notify_all()

    @property
    def sample(self) -> pa.RecordBatch | None:
        """A row of zeros shaped as the running call's data (:attr:`.epochs.Epochs.sample`)."""
        with self._cond:
            return self.epochs.sample

    @property
    def plan(self) -> tuple[int, int] | None:
        """(first, last) epoch the running ``train()`` feeds, None outside a call."""
        return self.epochs.plan

    @property
    def epoch_done(self) -> int:
        """The last epoch the driver ended."""
        return self.epochs.done

    @property
    def out_of_step(self) -> str | None:
        """The :class:`.plan.FeedOutOfStep` error, once a read raised it."""
        return self.epochs.out_of_step

    @property
    def label(self) -> str:
        return self.epochs.label

    def _waits_past(self, gen: int) -> None:
        """A bounded read of ``gen`` finds nothing queued: past the running train()'s epochs the driver hears of it
        once (:meth:`.epochs.Epochs.past`), whether it waits or the stop ends it; lock held."""
        if self._on_past is not None and not self.closed:
            rows = self.epochs.past(gen)
            if rows is not None:
                self._on_past(gen, rows)

    def _share_read(self, gen: int) -> bool:
        """Whether this node's share of ``gen`` is all read (or the driver ended ``gen``); lock held."""
        return self.epochs.done >= gen or (self.epochs.share_in(gen) and not self._queues.get(gen)
                                          and not self._turns.in_gen(gen))

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def _finish_closed(self, conn: Conn) -> None:
        """Answer a feeder of a node that reads no more: done (train), or why not."""
        self._conns.discard(conn)
        if self.error is not None:
            conn.finish(self.error, node_failed=True)
        elif conn.mode == "train":
            conn.finish()
        else:
            conn.finish("the node stopped reading data before answering this partition")

    def close(self, error: str | None = None) -> None:
        """Stop taking data: skip what is queued and what still arrives.

        Feeders are acknowledged (their rows counted as skipped) — or, with
        ``error`` (the node's function failed), told that error, so that the
        failure is reported as this node's and never as data skipped.
        """
        with self._cond:
            if self.closed:
                if error is not None and self.error is None:  # failed after terminate(): later feeders hear of it
                    self.error = error
                return
            self.closed = True
            self.error = error
            items = [item for q in self._queues.values() for item in q]
            items += self._turns.clear()
            self._queues.clear()
            self._sizes.clear()
            for kind, conn, batch in items:
                if kind == "data":
                    conn.skipped += batch.num_rows
                    self.skipped += batch.num_rows
                elif kind == "spilled":  # a held partition's rows on disk (``batch``: how many)
                    conn.skipped += batch
                    self.skipped += batch
            ended = [c for c in self._conns if c.ended]
            pending = [c for c, _ in self._pending]
            self._pending.clear()
            self._cond.notify_all()
        for conn in pending:
            conn.finish(error or "the node stopped before answering all rows", node_failed=error is not None)
        for conn in ended:
            with self._cond:
                self._finish_closed(conn)
        if error is None and self._on_close is not None:
            self._on_close()

    # -- the consumer ---------------------------------------------------------
    def drained(self) -> bool:
        with self._cond:
            return (self.stopped or self.closed) and not any(self._queues.values()) and not self._turns.waiting \
                and not self._turns.replaying

    def _next_gen(self, epoch: list[int] | None) -> int | None:
        """The oldest generation with queued items that this read may take from; lock held.

        Unbounded reads (``epoch=None``) take every generation, oldest first.  A read
        bounded to epoch ``g`` takes generations up to ``g`` (older data arriving late
        belongs to it).
        """
        limit = None if epoch is None else epoch[0]
        gens = [g for g, q in self._queues.items() if q and (limit is None or g <= limit)]
        return min(gens) if gens else None

    def ready(self, n: int, epoch: list[int] | None = None) -> bool:
        """Whether a read of ``n`` rows bounded as ``epoch`` would get them all without waiting: that many rows are
        queued in the generations it may take (``as_dataset`` takes more batches at once only then)."""
        limit = None if epoch is None else epoch[0]
        with self._cond:
            if self.stopped or self.closed:
                return False
            got = 0
            for g, q in self._queues.items():
                if limit is None or g <= limit:
                    for kind, _, batch in q:
                        if kind == "data":
                            got += batch.num_rows
                            if got >= n:
                                return True
            return False

    def take(self, n: int, train_mode: bool, epoch: list[int] | None = None,
             spans: list[tuple[Conn, int, int]] | None = None) -> list[tuple[Conn, pa.RecordBatch]]:
        """Up to ``n`` rows as (connection, batch slice) pieces; ``spans`` gets each piece's connection and its
        rows' positions in the connection's stream (recovery's ledger).

        Blocks until ``n`` rows are there, or the data ends: the cluster stops, in
        inference mode a partition ends, or with ``epoch=[g]`` this node's share of
        generation ``g`` ends (``_share_read``).  A bounded read given ``[0]`` picks
        its epoch first (:meth:`.epochs.Epochs.next`) — a node that gets the next epoch's data
        first waits for this epoch's, and one whose share of an epoch is nothing reads nothing.
        """
        pieces: list[tuple[Conn, pa.RecordBatch]] = []
        got = 0
        ahead = feed_plan.Ahead()
        with self._cond:
            if epoch is not None and not epoch[0]:
                epoch[0] = self.epochs.next(self._has_rows)
                self.epochs.begin(epoch[0])
            while got < n:
                gen = self._next_gen(epoch)
                if gen is None:
                    if epoch is not None:  # told even when the stop ends it at once: its peers may still step
                        self._waits_past(epoch[0])
                    if self.stopped or self.closed:
                        break
                    if epoch is not None and self._share_read(epoch[0]):
                        self.epochs.read(epoch[0])
                        break  # this node's share of the epoch is all taken
                    if ahead.still(epoch is not None and self.epochs.ahead(epoch[0])):
                        raise self.epochs.out_of_step_error(epoch[0] if epoch else 0)
                    since = time.perf_counter()
                    self._cond.wait(0.5)
                    step_time.CLOCK.waited(since)  # a step waiting for Spark's rows: the panel's "input" share
                    continue
                q = self._queues[gen]
                kind, conn, batch = q.popleft()
                if not q:
                    del self._queues[gen]
                if kind == "eoc":
                    self._maybe_finish(conn)
                    if not train_mode and got:
                        break
                    continue
                self._sizes[gen] -= 1
                self._cond.notify_all()
                k = min(n - got, batch.num_rows)
                if k < batch.num_rows:  # the rest goes back first in line
                    self._queues.setdefault(gen, collections.deque()).appendleft(("data", conn, batch.slice(k)))
                    self._sizes[gen] += 1
                    batch = batch.slice(0, k)
                pieces.append((conn, batch))
                if spans is not None:
                    spans.append((conn, conn.consumed, conn.consumed + k))
                conn.consumed += k
                got += k
                self.epochs.took(gen, k)
                self._maybe_finish(conn)
            self.rows += got
            for conn, piece in pieces:
                if conn.mode == "infer":  # rows that need an answer through batch_results()
                    self._pending.append((conn, piece.num_rows))
            self._last_take = got
        return pieces

    def answer(self, results: Any) -> None:
        """Route ``batch_results`` to the feeders of the rows last taken, in order."""
        n = inference_results.num_rows(results)
        with self._cond:
            pending = sum(k for _, k in self._pending)
            if n != pending:
                msg = (
                    f"batch_results() got {n} results for {pending} input rows; "
                    "return exactly one result per row of the last next_batch()"
                )
                raise ValueError(msg)
            todo = list(self._pending)
            self._pending.clear()
        batch = inference_results.results_to_batch(results)
        offset = 0
        for conn, k in todo:
            part = batch.slice(offset, k)
            offset += k
            try:
                conn.send(dataplane.Kind.RESULTS, columns.encode_ipc(part))
            except OSError as exc:
                log.warning("could not return results to partition %s: %s", conn.partition, exc)
            conn.answered += k
            with self._cond:
                self._maybe_finish(conn)
