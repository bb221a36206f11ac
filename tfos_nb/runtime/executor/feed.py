"""The node side of InputMode.SPARK: a data server and the ``DataFeed`` users read.

Feeding tasks connect to the node's :class:`DataServer`; each connection's
reader thread puts Arrow record batches into one bounded queue (back-pressure
reaches Spark through TCP).  :class:`DataFeed` hands them out in batches of the
size asked for: as Python rows (TensorFlowOnSpark's ``next_batch``), as numpy
columns (``next_batch_arrays``), or as a ``tf.data.Dataset`` (``as_dataset``).
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from .. import columns as C
from .. import results as R
from ..protocol import dataplane as dp

log = logging.getLogger(__name__)

_QUEUE_BATCHES = 16


class _Conn:
    """One feeding task's connection, seen from the node."""

    def __init__(self, sock: socket.socket, header: dict[str, Any]) -> None:
        self.sock = sock
        self.partition = int(header.get("partition", -1))
        self.gen = int(header.get("gen", 0))
        self.mode = str(header.get("mode", "train"))
        self.received = 0
        self.consumed = 0
        self.answered = 0
        self.skipped = 0
        self.ended = False  # the feeder sent E
        self.closed = False
        self._send_lock = threading.Lock()

    def send(self, kind: bytes, payload: Any) -> None:
        with self._send_lock:
            if self.closed:
                return
            if isinstance(payload, dict):
                dp.send_json(self.sock, kind, payload)
            else:
                dp.send_frame(self.sock, kind, payload)

    def finish(self, error: str | None = None, node_failed: bool = False) -> None:
        with self._send_lock:
            if self.closed:
                return
            try:
                if error:
                    dp.send_json(self.sock, b"X", {"error": error, "node_failed": node_failed})
                else:
                    dp.send_json(self.sock, b"A", {"rows": self.consumed, "skipped": self.skipped})
            except OSError:
                pass
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


class FeedHub:
    """The queue between connections and the consumer, plus the end-of-data signals."""

    def __init__(self, max_batches: int = _QUEUE_BATCHES, on_close: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._on_close = on_close  # tells the driver (through the supervisor) that this node reads no more
        self._conns: set[_Conn] = set()  # connections not yet answered
        self.error: str | None = None  # why the node's function failed, once it did
        self._q: collections.deque[tuple[str, Any, Any]] = collections.deque()
        self._max = max_batches
        self._carry: tuple[_Conn, int, pa.RecordBatch] | None = None
        self.stopped = False  # the driver asked the cluster to stop
        self.closed = False  # terminate() or the user's function returned: discard new data
        self.epoch_done = 0
        self.rows = 0
        self.skipped = 0
        self._pending: collections.deque[tuple[_Conn, int]] = collections.deque()
        self._last_take = 0

    # -- producers (reader threads, control thread) --------------------------
    def put(self, conn: _Conn, gen: int, batch: pa.RecordBatch) -> None:
        with self._cond:
            self._conns.add(conn)
            while len(self._q) >= self._max and not self.closed:
                self._cond.wait(0.5)
            conn.received += batch.num_rows
            if self.closed:
                conn.skipped += batch.num_rows
                self.skipped += batch.num_rows
                return
            self._q.append(("data", conn, (gen, batch)))
            self._cond.notify_all()

    def end_conn(self, conn: _Conn) -> None:
        with self._cond:
            conn.ended = True
            if self.closed:
                self._finish_closed(conn)
                return
            self._conns.add(conn)
            self._maybe_finish(conn)
            self._q.append(("eoc", conn, None))  # marks the partition's end for inference batches
            self._cond.notify_all()

    def _maybe_finish(self, conn: _Conn) -> None:
        """Ack a feeder as soon as all its rows are taken (train) or answered (inference); lock held."""
        if conn.ended and (conn.consumed if conn.mode == "train" else conn.answered) >= conn.received:
            self._conns.discard(conn)
            conn.finish()

    def drop(self, conn: _Conn, error: str) -> None:
        """A connection broke (the feeder went away): forget it."""
        with self._cond:
            self._conns.discard(conn)
        conn.finish(error)

    def end_epoch(self, epoch: int) -> None:
        with self._cond:
            if epoch > self.epoch_done:
                self.epoch_done = epoch
                self._q.append(("eog", None, epoch))
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def _finish_closed(self, conn: _Conn) -> None:
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
            items = list(self._q)
            self._q.clear()
            if self._carry is not None:
                conn, _, batch = self._carry
                conn.skipped += batch.num_rows
                self.skipped += batch.num_rows
                self._carry = None
            for kind, conn, payload in items:
                if kind == "data":
                    conn.skipped += payload[1].num_rows
                    self.skipped += payload[1].num_rows
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
            return (self.stopped or self.closed) and not self._q and self._carry is None

    def take(self, n: int, train_mode: bool, epoch: list[int] | None = None) -> list[tuple[_Conn, pa.RecordBatch]]:
        """Up to ``n`` rows as (connection, batch slice) pieces.

        Blocks until ``n`` rows are there, or the data ends: the cluster stops, in
        inference mode a partition ends, or with ``epoch=[g]`` the generation ``g``
        ends (``g`` is set from the first data seen when it is 0).
        """
        pieces: list[tuple[_Conn, pa.RecordBatch]] = []
        got = 0
        with self._cond:
            while got < n:
                if self._carry is not None:
                    item: tuple[str, Any, Any] = ("data", self._carry[0], (self._carry[1], self._carry[2]))
                    self._carry = None
                elif self._q:
                    item = self._q.popleft()
                    self._cond.notify_all()
                else:
                    if self.stopped or self.closed:
                        break
                    if epoch is not None and epoch[0] and self.epoch_done >= epoch[0]:
                        break  # this epoch's data is all taken and the driver said it is complete
                    self._cond.wait(0.5)
                    continue
                kind, conn, payload = item
                if kind == "eog":
                    if epoch is not None and epoch[0] and payload >= epoch[0]:
                        break
                    continue
                if kind == "eoc":
                    self._maybe_finish(conn)
                    if not train_mode and got:
                        break
                    continue
                gen, batch = payload
                if epoch is not None:
                    if not epoch[0] or gen < epoch[0]:
                        epoch[0] = max(gen, epoch[0])
                    if gen > epoch[0]:
                        self._carry = (conn, gen, batch)
                        break
                k = min(n - got, batch.num_rows)
                if k < batch.num_rows:
                    self._carry = (conn, gen, batch.slice(k))
                    batch = batch.slice(0, k)
                pieces.append((conn, batch))
                conn.consumed += k
                got += k
                self._maybe_finish(conn)
            self.rows += got
            for conn, piece in pieces:
                if conn.mode == "infer":  # rows that need an answer through batch_results()
                    self._pending.append((conn, piece.num_rows))
            self._last_take = got
        return pieces

    def answer(self, results: Any) -> None:
        """Route ``batch_results`` to the feeders of the rows last taken, in order."""
        n = R.num_rows(results)
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
        batch = R.results_to_batch(results)
        offset = 0
        for conn, k in todo:
            part = batch.slice(offset, k)
            offset += k
            try:
                conn.send(b"R", C.encode_ipc(part))
            except OSError as exc:
                log.warning("could not return results to partition %s: %s", conn.partition, exc)
            conn.answered += k
            with self._cond:
                self._maybe_finish(conn)


class DataServer:
    """Accepts feeding tasks' connections on the node's address."""

    def __init__(self, hub: FeedHub, secret: bytes, host: str) -> None:
        self._hub = hub
        self._secret = secret
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="tfos-data-server", daemon=True)
        self._stopped = False

    def start(self) -> DataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), name="tfos-data-conn", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn: _Conn | None = None
        try:
            sock.settimeout(30)
            header = dp.server_handshake(sock, self._secret)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, header)
            while True:
                kind, payload = dp.recv_frame(sock)
                if kind == b"D":
                    try:
                        batch = C.decode_ipc(payload)
                    except (pa.ArrowInvalid, OSError) as exc:
                        raise dp.DataPlaneError(f"bad Arrow batch: {exc}") from None
                    self._hub.put(conn, conn.gen, batch)
                elif kind == b"E":
                    self._hub.end_conn(conn)
                    return
                else:
                    raise dp.DataPlaneError(f"unexpected frame {kind!r}")
        except (OSError, dp.DataPlaneError) as exc:
            log.warning("tfos_nb data connection dropped: %s", exc)
            if conn is not None:
                self._hub.drop(conn, str(exc))
            else:
                sock.close()


def _concat_columns(pieces: list[tuple[Any, pa.RecordBatch]]) -> list[np.ndarray]:
    cols = [C.batch_to_columns(b) for _, b in pieces]
    if len(cols) == 1:
        return cols[0]
    return [np.concatenate([c[i] for c in cols]) for i in range(len(cols[0]))]


class DataFeed:
    """What a node's function reads its data from (TensorFlowOnSpark's ``TFNode.DataFeed``).

    ``next_batch(n)`` returns a list of rows — or, with ``input_mapping``
    (column → tensor name), a dict of tensor name → array.  ``next_batch_arrays(n)``
    returns numpy columns without building Python rows (the fast path).
    """

    def __init__(
        self,
        hub: FeedHub,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: dict[str, str] | list[str] | None = None,
        reporter: Any = None,
    ) -> None:
        self._hub = hub
        self.train_mode = train_mode
        self.qname_in = qname_in
        self.qname_out = qname_out
        if isinstance(input_mapping, (list, tuple)):
            input_mapping = {c: c for c in input_mapping}
        self.input_mapping = dict(input_mapping) if input_mapping else None
        self._reporter = reporter
        self.done_feeding = False
        self._names: list[str] | None = None

    # -- TensorFlowOnSpark's API ----------------------------------------------
    def next_batch(self, batch_size: int) -> Any:
        pieces = self._take(batch_size)
        if self.input_mapping:
            return self._mapped(pieces)
        rows: list[Any] = []
        for _, b in pieces:
            rows.extend(C.batch_to_rows(b))
        return rows

    def should_stop(self) -> bool:
        if self._hub.drained():
            self.done_feeding = True
        return self.done_feeding

    def batch_results(self, results: Any) -> None:
        """Return one result per row of the last ``next_batch`` (inference)."""
        self._hub.answer(results)

    def terminate(self) -> None:
        """Stop reading: data still coming for this node is skipped, feeders return."""
        self._hub.close()
        self.done_feeding = True

    # -- columnar API -----------------------------------------------------------
    def next_batch_arrays(self, batch_size: int) -> Any:
        """Up to ``batch_size`` rows as a tuple of numpy arrays, one per column."""
        pieces = self._take(batch_size)
        if self.input_mapping:
            return self._mapped(pieces)
        if not pieces:
            return ()
        return tuple(_concat_columns(pieces))

    def as_dataset(self, batch_size: int = 128, columns: Any = None, epochs_bounded: bool = True) -> Any:
        """A ``tf.data.Dataset`` over this feed, for ``model.fit``.

        Each element is a batch: a tuple of tensors, one per fed column (a dict
        with ``input_mapping``).  ``columns`` picks columns by position, e.g.
        ``columns=(0, 1)`` or ``columns=((0,), 1)`` for ``(x, y)`` with x a tuple.
        One iteration of the dataset is one epoch of ``cluster.train(..., num_epochs)``,
        so ``model.fit(ds, epochs=E)`` lines up with ``num_epochs=E``.  Auto-sharding
        is off: every node already gets its own partitions.
        """
        import tensorflow as tf

        first = self._peek(batch_size)
        if first is None:
            msg = "as_dataset(): the feed ended before any data arrived"
            raise RuntimeError(msg)
        sample = self._select(first, columns)
        signature = tf.nest.map_structure(
            lambda a: tf.TensorSpec(shape=(None,) + tuple(a.shape[1:]), dtype=tf.as_dtype(a.dtype)), sample
        )
        feed = self
        carry = [first]

        def gen() -> Iterator[Any]:
            epoch = [0]
            while True:
                if carry:
                    pieces = carry.pop()
                    for conn, _ in pieces:
                        epoch[0] = max(epoch[0], conn.gen)
                else:
                    pieces = feed._take(batch_size, epoch if epochs_bounded else None)
                if not pieces:
                    return
                cols = feed._mapped(pieces) if feed.input_mapping else tuple(_concat_columns(pieces))
                yield feed._select(cols, columns)

        ds = tf.data.Dataset.from_generator(gen, output_signature=signature)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(opts)

    # -- internals ----------------------------------------------------------------
    def _peek(self, batch_size: int) -> Any:
        pieces = self._hub.take(batch_size, True, [0])
        if not pieces:
            return None
        return pieces

    def _select(self, cols: Any, columns: Any) -> Any:
        if isinstance(cols, list) and cols and isinstance(cols[0], tuple):  # raw pieces from _peek
            cols = self._mapped(cols) if self.input_mapping else tuple(_concat_columns(cols))
        if columns is None:
            return cols

        def pick(spec: Any) -> Any:
            if isinstance(spec, (tuple, list)):
                return tuple(pick(s) for s in spec)
            return cols[spec]

        return pick(columns)

    def _take(self, n: int, epoch: list[int] | None = None) -> list[tuple[_Conn, pa.RecordBatch]]:
        if n <= 0:
            msg = f"batch size must be positive, got {n}"
            raise ValueError(msg)
        pieces = self._hub.take(n, self.train_mode, epoch)
        if not pieces and self._hub.drained():
            self.done_feeding = True
        return pieces

    def _mapped(self, pieces: list[tuple[_Conn, pa.RecordBatch]]) -> dict[str, Any]:
        assert self.input_mapping is not None
        if not pieces:
            return {tensor: [] for tensor in self.input_mapping.values()}
        names = pieces[0][1].schema.names
        missing = [c for c in self.input_mapping if c not in names]
        if missing:
            msg = f"input_mapping names column(s) {missing} that the fed data does not have; columns are {names}"
            raise KeyError(msg)
        cols = _concat_columns(pieces)
        by_name = dict(zip(names, cols))
        return {tensor: by_name[col] for col, tensor in self.input_mapping.items()}

