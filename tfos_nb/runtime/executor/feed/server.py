"""The node's data server: feeding tasks connect, each connection's reader thread queues Arrow batches in the hub.

Anyone who can reach the port can connect, so what a connection costs before it completes the handshake
is bounded (see :class:`DataServer`).
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time

import pyarrow as pa

from ... import net
from ...batches import columns
from ...protocol import dataplane, shared
from .conn import Conn
from .hub import FeedHub
from .named_sets import NAME, NamedFeeds

log = logging.getLogger(__name__)

# A feeder completes the handshake in a few round trips as soon as it connects; this bounds, for the whole
# handshake, how long a connection that does not (idle, or a byte at a time) holds a thread and a descriptor.
HANDSHAKE_DEADLINE_S = 10.0
# Handshakes in flight at once, each on a thread of its own: beyond it the oldest is closed, so silent
# connections cannot pile up threads nor keep a feeder that completes the handshake at once out.
MAX_HANDSHAKES = 32


class DataServer:
    """Accepts feeding tasks' connections on the node's address.

    Anyone who can reach the port can connect, so a connection that has not completed the
    handshake (mutual HMAC proof and the header frame) is bounded: the whole handshake must
    end within :data:`HANDSHAKE_DEADLINE_S` of the accept (however the bytes trickle in), at
    most :data:`MAX_HANDSHAKES` run at once (each on a thread; a new one beyond that closes
    the oldest), and when descriptors run out accepting pauses ``net.ACCEPT_BACKOFF_S``.
    """

    def __init__(self, hub: FeedHub, secret: bytes, host: str, *, handshake_deadline: float = HANDSHAKE_DEADLINE_S,
                 max_handshakes: int = MAX_HANDSHAKES, named: NamedFeeds | None = None) -> None:
        self._hub = hub
        self._named = named  # where a named set's connections write (``feed`` in their header)
        self._secret = secret
        self._handshake_deadline = handshake_deadline
        self._max_handshakes = max_handshakes
        self._handshaking: collections.OrderedDict[socket.socket, None] = collections.OrderedDict()  # oldest first
        self._lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="tfos-data-server", daemon=True)
        self._stopped = threading.Event()
        self.timed_out = 0  # connections closed before completing the handshake (deadline, or room for newer ones)
        self.accept_errors = 0

    def start(self) -> DataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    def _accept_loop(self) -> None:
        failing = False
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError as exc:
                if self._stopped.is_set():
                    return
                self.accept_errors += 1
                if exc.errno in net.ACCEPT_PER_CONNECTION:
                    continue
                if not failing:  # EMFILE, ENFILE…: the connection stays queued; retrying at once would spin
                    log.warning("tfos_nb data server: cannot accept connections (%s); retrying every %g s",
                                exc, net.ACCEPT_BACKOFF_S)
                failing = True
                self._stopped.wait(net.ACCEPT_BACKOFF_S)
                continue
            failing = False
            with self._lock:
                if len(self._handshaking) >= self._max_handshakes:
                    oldest = next(iter(self._handshaking))
                    del self._handshaking[oldest]
                    self._cut(oldest)
                self._handshaking[sock] = None
            threading.Thread(target=self._serve, args=(sock,), name="tfos-data-conn", daemon=True).start()

    def _cut(self, sock: socket.socket) -> None:
        """End a handshake from outside its thread: its receive returns at once."""
        self.timed_out += 1
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _serve(self, sock: socket.socket) -> None:
        conn: Conn | None = None
        sink: FeedHub | NamedFeeds | None = None
        try:
            try:
                header = dataplane.server_handshake(sock, self._secret, time.monotonic() + self._handshake_deadline)
            finally:
                with self._lock:
                    kept = sock in self._handshaking
                    self._handshaking.pop(sock, None)
            if not kept:
                raise dataplane.DataPlaneError("closed to make room for newer connections")
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, header)
            log.debug("data connection: %s of partition %d (%s %d)", conn.mode, conn.partition,
                      "epoch" if conn.feed == "input" else f"set {conn.feed!r} version", conn.gen)
            sink = self._sink(conn)
            if sink is None:  # answered, never dropped: no partition of anything was cut
                conn.finish(f"no feed {conn.feed!r} here")
                return
            region = self._region(conn, header)
            try:
                self._read(conn, sink, region)
            finally:
                if region is not None:
                    region.close()
        except (OSError, dataplane.DataPlaneError, pa.ArrowException) as exc:  # Arrow: a set's batch its file refuses
            if conn is None or sink is None:
                if isinstance(exc, dataplane.HandshakeTimeout):
                    self.timed_out += 1
                log.debug("tfos_nb data connection refused: %s", exc)
                sock.close()
            else:
                log.warning("tfos_nb data connection dropped: %s", exc)
                sink.drop(conn, str(exc))

    @staticmethod
    def _region(conn: Conn, header: dict[str, object]) -> shared.NodeRegion | None:
        """A training connection's feeder on this host offered its shared memory (``shared`` in its header): the
        region mapped, or None; the feeder hears which (an ``M`` frame) before it sends a batch."""
        offer = header.get("shared")
        if offer is None:
            return None
        region = None
        if conn.mode == "train":
            try:
                region = shared.NodeRegion(offer)
            except OSError as exc:  # another host or pid namespace after all: the socket carries the batches
                log.debug("partition %d: the feeder's shared memory is not for this node (%s)", conn.partition, exc)
        conn.send(dataplane.Kind.REGION, {"mapped": region is not None})
        return region

    @staticmethod
    def _read(conn: Conn, sink: FeedHub | NamedFeeds, region: shared.NodeRegion | None) -> None:
        """``conn``'s frames until its end: each batch, through the socket or a slot of ``region``, to ``sink``."""
        while True:
            kind, payload = dataplane.recv_frame(conn.sock)
            if kind is dataplane.Kind.DATA:
                data = payload
            elif kind is dataplane.Kind.SLOT and region is not None:
                try:
                    slot, data = region.take(payload)
                except ValueError as exc:
                    raise dataplane.DataPlaneError(str(exc)) from None
                conn.send(dataplane.Kind.FREE, shared.FREE_FRAME.pack(slot))  # the copy is the node's own
            elif kind is dataplane.Kind.END:
                sink.end_conn(conn)
                return
            else:
                raise dataplane.DataPlaneError(f"unexpected frame {kind.value!r}")
            try:
                batch = columns.decode_ipc(data)
            except (pa.ArrowInvalid, OSError) as exc:
                raise dataplane.DataPlaneError(f"bad Arrow batch: {exc}") from None
            if kind is dataplane.Kind.SLOT:
                conn.shared += batch.num_rows
            sink.put(conn, conn.gen, batch)

    def _sink(self, conn: Conn) -> FeedHub | NamedFeeds | None:
        """Where ``conn``'s batches go: the training stream's hub, a named set's files, or nowhere (refused)."""
        if conn.feed == "input":
            return self._hub
        if self._named is None or conn.mode != "train" or not NAME.fullmatch(conn.feed):
            return None
        return self._named
