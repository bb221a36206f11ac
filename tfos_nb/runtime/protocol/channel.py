"""The driver-side control server: one thread, one selector, signed JSON frames.

Nodes (their supervisors) and feeding tasks connect here.  Each request frame
gets exactly one reply frame.  Handlers never block: a node that waits for the
cluster to form polls (``AwaitSpec``) and gets ``ok=False, body={"retry": …}``
until it is complete.  A frame that fails verification is logged, counted and
its connection closed; the server goes on serving everybody else.

Anyone who can reach the port can connect: what a connection costs before it
proves it holds the cluster's secret (its first verified frame) is bounded as
:mod:`.unverified` explains -- a deadline, a pool whose oldest is closed at once
when a new one comes, and a budget of buffered bytes -- and the server never
stops accepting because of them.  The listener is read at most
:data:`ACCEPTS_PER_WAKE` times a turn of the loop, so verified peers are served
between batches of a flood; when the process runs out of file descriptors the
server stops accepting for ``net.ACCEPT_BACKOFF_S`` instead of retrying at
once.  Verified connections (supervisors, feeding tasks) are never timed out.
"""

from __future__ import annotations

import collections
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from ..net import ACCEPT_BACKOFF_S, ACCEPT_PER_CONNECTION
from . import messages
from .unverified import FIRST_FRAME_DEADLINE_S, REJECT_LOG_INTERVAL_S, UNVERIFIED_BYTES, Rejections, pool_size

log = logging.getLogger(__name__)

Handler = Callable[[messages.Message], messages.Reply]

ACCEPTS_PER_WAKE = 64  # then the loop serves the other ready connections before accepting more


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "peer", "held", "deadline", "events")

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.peer = peer
        self.held = 0  # bytes it counts in the server's unverified_bytes (while it is unverified)
        self.deadline: float | None = deadline  # None once it sent a verified frame
        self.events = selectors.EVENT_READ  # what the selector watches it for


class ControlServer:
    """Owns one listening socket and one thread; ``stop()`` closes both."""

    def __init__(
        self,
        codec: messages.Codec,
        handler: Handler,
        host: str = "127.0.0.1",
        on_tick: Callable[[], None] | None = None,
        *,
        first_frame_deadline: float = FIRST_FRAME_DEADLINE_S,
        max_unverified: int | None = None,
        reject_log_interval: float = REJECT_LOG_INTERVAL_S,
    ) -> None:
        self._codec = codec
        self._first_frame_deadline = first_frame_deadline
        self.max_unverified = pool_size() if max_unverified is None else max_unverified
        self._unverified: collections.OrderedDict[_Conn, None] = collections.OrderedDict()  # oldest first
        self._accept_paused_until: float | None = None
        self._accept_failing = False
        self._rejections = Rejections(log, reject_log_interval)
        self._handler = handler
        self._on_tick = on_tick
        self._host = host
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.rejected = 0
        self.accepted = 0
        self.timed_out = 0  # unverified connections closed at the deadline or to make room
        self.unverified_bytes = 0  # what unverified connections buffer together (at most UNVERIFIED_BYTES)
        self.accept_errors = 0
        self.address: tuple[str, int] | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> tuple[str, int]:
        with self._lock:
            if self._thread is not None:
                assert self.address is not None
                return self.address
            family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((self._host, 0))
            except OSError as exc:
                listener.close()
                msg = f"the control server cannot listen on {self._host}: {exc.strerror or exc}"
                raise OSError(exc.errno, msg) from exc
            listener.listen(socket.SOMAXCONN)  # a launch of hundreds of nodes connects at once
            listener.setblocking(False)
            self._listener = listener
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._sel = selectors.DefaultSelector()
            self._sel.register(listener, selectors.EVENT_READ, None)
            self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            self.address = (self._host, listener.getsockname()[1])
            self._thread = threading.Thread(target=self._loop, name="tfos-control-server", daemon=True)
            self._thread.start()
            return self.address

    def stop(self) -> None:
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._stopping.set()
            try:
                assert self._wake_w is not None
                self._wake_w.send(b"x")
            except OSError:
                pass
        thread.join(timeout=10)
        with self._lock:
            self._thread = None

    def __enter__(self) -> ControlServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop -----------------------------------------------------------
    def _loop(self) -> None:
        sel = self._sel
        assert sel is not None
        next_tick = time.monotonic() + 0.5
        try:
            while not self._stopping.is_set():
                if self._on_tick is not None and time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + 0.5
                    try:
                        self._on_tick()
                    except Exception:
                        log.exception("control server tick failed")
                for key, mask in sel.select(timeout=self._select_timeout()):
                    if key.data == "wake":
                        try:
                            self._wake_r.recv(64)  # type: ignore[union-attr]
                        except OSError:
                            pass
                    elif key.data is None:
                        self._accept()
                    else:
                        conn: _Conn = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE and conn.sock.fileno() != -1:
                            self._write(conn)
                self._expire(time.monotonic())
                self._rejections.flush(time.monotonic())
        except Exception:  # pragma: no cover - a bug in the loop must not go unseen
            log.exception("control server loop crashed")
        finally:
            self._rejections.flush(time.monotonic(), force=True)
            for key in list(sel.get_map().values()):
                try:
                    key.fileobj.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            sel.close()
            if self._listener is not None:  # unregistered while accepting is paused
                self._listener.close()
            if self._wake_w is not None:
                self._wake_w.close()

    def _select_timeout(self) -> float:
        now = time.monotonic()
        wake = now + 0.5
        if self._unverified:
            deadline = next(iter(self._unverified)).deadline
            if deadline is not None:
                wake = min(wake, deadline)
        if self._accept_paused_until is not None:
            wake = min(wake, self._accept_paused_until)
        return max(0.0, wake - now)

    def _expire(self, now: float) -> None:
        """Close unverified connections past their deadline; resume accepting after a back-off."""
        while self._unverified:
            conn = next(iter(self._unverified))
            if conn.deadline is not None and conn.deadline > now:
                break
            self._drop_unverified(conn, f"no valid frame within {self._first_frame_deadline:g} s")
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._resume_accepting()

    def _pause_accepting(self, until: float) -> None:
        assert self._sel is not None and self._listener is not None
        self._sel.unregister(self._listener)
        self._accept_paused_until = until

    def _resume_accepting(self) -> None:
        assert self._sel is not None and self._listener is not None
        self._accept_paused_until = None
        self._sel.register(self._listener, selectors.EVENT_READ, None)

    def _unverified_gone(self, conn: _Conn) -> None:
        """``conn`` proved itself or was closed: it no longer counts against the pool nor the byte budget."""
        if conn in self._unverified:
            del self._unverified[conn]
            self.unverified_bytes -= conn.held
            conn.held = 0

    def _make_room(self) -> None:
        """Room in the pool for one more unverified connection: the oldest is read first (its frame may have come
        since the selector said so), and closed if it still has not proved itself."""
        while len(self._unverified) >= self.max_unverified:
            oldest = next(iter(self._unverified))
            self._read(oldest)
            if oldest in self._unverified:
                self._drop_unverified(oldest, "too many unverified connections")

    def _shed_bytes(self) -> None:
        """Over :data:`UNVERIFIED_BYTES`: close the oldest unverified connections holding bytes until under it."""
        for conn in list(self._unverified):
            if self.unverified_bytes <= UNVERIFIED_BYTES:
                return
            if conn.held:
                self._drop_unverified(conn, "too many bytes buffered by unverified connections")

    def _drop_unverified(self, conn: _Conn, why: str) -> None:
        self.timed_out += 1
        log.debug("tfos_nb control server: closed %s: %s", conn.peer, why)
        self._close(conn)

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.accept_errors += 1
                if exc.errno in ACCEPT_PER_CONNECTION:
                    continue
                # EMFILE, ENFILE, ENOBUFS, ENOMEM…: the connection stays queued and the listener readable,
                # so watching it now would spin; pause accepting instead (verified peers are still served).
                if not self._accept_failing:
                    log.warning("tfos_nb control server: cannot accept connections (%s); retrying every %g s",
                                exc, ACCEPT_BACKOFF_S)
                self._accept_failing = True
                self._pause_accepting(time.monotonic() + ACCEPT_BACKOFF_S)
                return
            self._accept_failing = False
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._make_room()
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}", time.monotonic() + self._first_frame_deadline)
            self._unverified[conn] = None
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._read(conn)  # its frame is often there already: verified before the next one is accepted

    def _close(self, conn: _Conn) -> None:
        assert self._sel is not None
        self._unverified_gone(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _reject(self, conn: _Conn, why: str) -> None:
        self.rejected += 1
        self._rejections.add(conn.peer, why, time.monotonic())
        self._close(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        if conn.deadline is not None:
            conn.held += len(data)
            self.unverified_bytes += len(data)
            if self.unverified_bytes > UNVERIFIED_BYTES:
                self._shed_bytes()
                if conn not in self._unverified:
                    return
        while len(conn.inbuf) >= messages.HEADER.size:
            (n,) = messages.HEADER.unpack_from(conn.inbuf)
            if n > messages.MAX_FRAME:
                self._reject(conn, f"oversized frame ({n} bytes)")
                return
            if len(conn.inbuf) < messages.HEADER.size + n:
                return
            frame = bytes(conn.inbuf[messages.HEADER.size : messages.HEADER.size + n])
            del conn.inbuf[: messages.HEADER.size + n]
            try:
                msg, request_id = self._codec.decode_request(frame)
            except messages.ProtocolError as exc:
                self._reject(conn, str(exc))
                return
            if isinstance(msg, messages.Reply):
                self._reject(conn, "a reply sent to the server")
                return
            if conn.deadline is not None:  # it holds the secret: no deadline from now on
                conn.deadline = None
                self._unverified_gone(conn)
            self.accepted += 1
            try:
                reply = self._handler(msg)
            except Exception as exc:  # a handler bug answers the request, not the server
                log.exception("control handler failed on %s", msg.TYPE)
                reply = messages.Reply(ok=False, error=f"{type(exc).__name__}: {exc}")
            conn.outbuf += self._codec.encode(reply, answers=request_id)
            self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert self._sel is not None
        try:
            n = conn.sock.send(conn.outbuf)
            del conn.outbuf[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(conn)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if events == conn.events:
            return  # a reply sent whole, as most are: no system call to say so again
        try:
            self._sel.modify(conn.sock, events, conn)
            conn.events = events
        except (KeyError, ValueError):
            pass


class ControlClient:
    """A blocking request/reply client with reconnects, used on executors."""

    def __init__(self, codec: messages.Codec, address: tuple[str, int], timeout: float = 30.0) -> None:
        self._codec = codec
        self._address = address
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def request(self, msg: messages.Message) -> messages.Reply:
        """Send ``msg`` and return the reply to it: any other frame (a reply to another request, replayed or meant
        for another peer, included) is a ``ProtocolError``, and closes the connection."""
        with self._lock:
            if self._sock is None:
                self._sock = socket.create_connection(self._address, timeout=self._timeout)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                frame, request_id = self._codec.encode_request(msg)
                self._sock.sendall(frame)
                return self._codec.decode_reply(messages.read_frame(self._sock), request_id)
            except BaseException:
                self.close_locked()
                raise

    def close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()
