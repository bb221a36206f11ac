"""The driver-side control server: one thread, one selector, signed JSON frames.

Nodes (their supervisors) and feeding tasks connect here.  Each request frame
gets exactly one reply frame.  Handlers never block: a node that waits for the
cluster to form polls (``AwaitSpec``) and gets ``ok=False, body={"retry": …}``
until it is complete.  A frame that fails verification is logged, counted and
its connection closed; the server goes on serving everybody else.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from . import messages as m

log = logging.getLogger(__name__)

Handler = Callable[[m.Message], m.Reply]


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "peer")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.peer = peer


class ControlServer:
    """Owns one listening socket and one thread; ``stop()`` closes both."""

    def __init__(
        self,
        codec: m.Codec,
        handler: Handler,
        host: str = "127.0.0.1",
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self._codec = codec
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
        self.address: tuple[str, int] | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> tuple[str, int]:
        with self._lock:
            if self._thread is not None:
                assert self.address is not None
                return self.address
            family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._host, 0))
            listener.listen(128)
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
                    except Exception:  # noqa: BLE001
                        log.exception("control server tick failed")
                for key, mask in sel.select(timeout=0.5):
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
        except Exception:  # pragma: no cover - a bug in the loop must not go unseen
            log.exception("control server loop crashed")
        finally:
            for key in list(sel.get_map().values()):
                try:
                    key.fileobj.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            sel.close()
            if self._wake_w is not None:
                self._wake_w.close()

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sel.register(sock, selectors.EVENT_READ, _Conn(sock, f"{addr[0]}:{addr[1]}"))

    def _close(self, conn: _Conn) -> None:
        assert self._sel is not None
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _reject(self, conn: _Conn, why: str) -> None:
        self.rejected += 1
        log.warning("tfos_nb control server: rejected a message from %s: %s", conn.peer, why)
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
        while len(conn.inbuf) >= m.HEADER.size:
            (n,) = m.HEADER.unpack_from(conn.inbuf)
            if n > m.MAX_FRAME:
                self._reject(conn, f"oversized frame ({n} bytes)")
                return
            if len(conn.inbuf) < m.HEADER.size + n:
                return
            frame = bytes(conn.inbuf[m.HEADER.size : m.HEADER.size + n])
            del conn.inbuf[: m.HEADER.size + n]
            try:
                msg = self._codec.decode(frame)
            except m.ProtocolError as exc:
                self._reject(conn, str(exc))
                return
            if isinstance(msg, m.Reply):
                self._reject(conn, "a reply sent to the server")
                return
            self.accepted += 1
            try:
                reply = self._handler(msg)
            except Exception as exc:  # a handler bug answers the request, not the server
                log.exception("control handler failed on %s", msg.TYPE)
                reply = m.Reply(ok=False, error=f"{type(exc).__name__}: {exc}")
            conn.outbuf += self._codec.encode(reply)
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
        try:
            self._sel.modify(conn.sock, events, conn)
        except (KeyError, ValueError):
            pass


class ControlClient:
    """A blocking request/reply client with reconnects, used on executors."""

    def __init__(self, codec: m.Codec, address: tuple[str, int], timeout: float = 30.0) -> None:
        self._codec = codec
        self._address = address
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def request(self, msg: m.Message) -> m.Reply:
        with self._lock:
            if self._sock is None:
                self._sock = socket.create_connection(self._address, timeout=self._timeout)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self._sock.sendall(self._codec.encode(msg))
                reply = self._codec.decode(m.read_frame(self._sock))
            except BaseException:
                self.close_locked()
                raise
        if not isinstance(reply, m.Reply):
            raise m.ProtocolError(f"expected a reply, got {reply.TYPE}")
        return reply

    def close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()
