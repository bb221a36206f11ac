"""The data path between a Spark feeding task and a node: Arrow batches over TCP.

A connection starts with a mutual HMAC challenge (both ends prove they hold the
cluster secret), then carries typed frames ``type (1) | length (8) | payload``,
the type one of :class:`Kind`:

=====  ===========  ==================  ==============================================
 H     ``HEADER``   feeder -> node      JSON header: partition, generation, mode
 D     ``DATA``     feeder -> node      one Arrow IPC stream holding one record batch
 E     ``END``      feeder -> node      end of this partition
 R     ``RESULTS``  node -> feeder      results for the oldest unanswered rows (Arrow)
 M     ``REGION``   node -> feeder      JSON: the shared-memory region offered (:mod:`.shared`), or ``{}``
 S     ``SLOT``     feeder -> node      a batch in a slot of that region: slot (4), length (8)
 F     ``FREE``     node -> feeder      that slot is free again: slot (4)
 A     ``DONE``     node -> feeder      JSON: done (rows taken, rows skipped)
 X     ``ERROR``    node -> feeder      JSON: error, one line
=====  ===========  ==================  ==============================================

Payloads are parsed by Arrow, JSON or a fixed ``struct`` only; nothing is unpickled.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import os
import socket
import struct
import time
from typing import Any

import pyarrow as pa

from ..net import recv_exact

FRAME = struct.Struct(">cQ")
MAGIC = b"TFOSDATA1"
NONCE = 32
MAX_DATA_FRAME = 1 << 30
MAX_JSON_FRAME = 1 << 16


class DataPlaneError(ConnectionError):
    pass


class Kind(bytes, enum.Enum):
    """A frame's type byte; a byte that is none of these ends the connection (:class:`DataPlaneError`)."""

    HEADER = b"H"
    DATA = b"D"
    END = b"E"
    RESULTS = b"R"
    DONE = b"A"
    ERROR = b"X"
    REGION = b"M"
    SLOT = b"S"
    FREE = b"F"


_ARROW_KINDS = (Kind.DATA, Kind.RESULTS)  # may carry up to MAX_DATA_FRAME bytes; the others JSON or nothing


class HandshakeTimeout(DataPlaneError):
    """The peer did not complete the handshake by its deadline."""


def _mac(secret: bytes, label: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, label + nonce, hashlib.sha256).digest()


def send_frame(sock: socket.socket, kind: Kind, payload: Any = b"") -> None:
    n = payload.size if hasattr(payload, "size") and not isinstance(payload, (bytes, bytearray)) else len(payload)
    sock.sendall(FRAME.pack(kind.value, n))
    if n:
        sock.sendall(memoryview(payload) if not isinstance(payload, (bytes, bytearray)) else payload)


def send_json(sock: socket.socket, kind: Kind, obj: dict[str, Any]) -> None:
    send_frame(sock, kind, json.dumps(obj).encode())


def recv_frame(sock: socket.socket, deadline: float | None = None) -> tuple[Kind, Any]:
    """The next frame: its kind and payload (a ``bytearray``; an Arrow frame's a ``pyarrow.Buffer``).

    An Arrow frame is received into a buffer of Arrow's memory pool: aligned, so that its record batch is read
    in place, and not zero-filled first (a ``bytearray`` of a batch's size is, page by page, on every frame).
    """
    raw, n = FRAME.unpack(recv_exact(sock, FRAME.size, deadline))
    try:
        kind = Kind(raw)
    except ValueError:
        raise DataPlaneError(f"unknown frame type {raw!r}") from None
    limit = MAX_DATA_FRAME if kind in _ARROW_KINDS else MAX_JSON_FRAME
    if n > limit:
        raise DataPlaneError(f"frame {raw!r} of {n} bytes exceeds {limit}")
    if not n:
        return kind, bytearray()
    if kind in _ARROW_KINDS:
        return kind, recv_exact(sock, n, deadline, into=pa.allocate_buffer(n))
    return kind, recv_exact(sock, n, deadline)


def parse_json(payload: bytearray) -> dict[str, Any]:
    try:
        obj = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataPlaneError(f"bad JSON frame: {exc}") from None
    if not isinstance(obj, dict):
        raise DataPlaneError("JSON frame is not an object")
    return obj


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise HandshakeTimeout("handshake not completed in time")
    return left


def server_handshake(sock: socket.socket, secret: bytes, deadline: float) -> dict[str, Any]:
    """Node side: challenge the feeder, answer its challenge, read its header, all by ``deadline``
    (``time.monotonic()``; the socket is left with a timeout, for the caller to reset)."""
    nonce = os.urandom(NONCE)
    try:
        sock.settimeout(_left(deadline))
        sock.sendall(MAGIC + nonce)
        got = recv_exact(sock, NONCE + NONCE, deadline)
        their_mac, their_nonce = bytes(got[:NONCE]), bytes(got[NONCE:])
        if not hmac.compare_digest(their_mac, _mac(secret, b"feeder|", nonce)):
            raise DataPlaneError("feeder failed authentication")
        sock.settimeout(_left(deadline))
        sock.sendall(_mac(secret, b"node|", their_nonce))
        kind, payload = recv_frame(sock, deadline)
    except TimeoutError:
        raise HandshakeTimeout("handshake not completed in time") from None
    if kind is not Kind.HEADER:
        raise DataPlaneError(f"expected a header frame, got {kind.value!r}")
    return parse_json(payload)


def client_connect(host: str, port: int, secret: bytes, header: dict[str, Any], timeout: float) -> socket.socket:
    """Feeder side: connect, authenticate both ways, send the header."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = recv_exact(sock, len(MAGIC) + NONCE)
        if bytes(hello[: len(MAGIC)]) != MAGIC:
            raise DataPlaneError(f"{host}:{port} is not a tfos_nb node")
        my_nonce = os.urandom(NONCE)
        sock.sendall(_mac(secret, b"feeder|", bytes(hello[len(MAGIC) :])) + my_nonce)
        if not hmac.compare_digest(bytes(recv_exact(sock, NONCE)), _mac(secret, b"node|", my_nonce)):
            raise DataPlaneError(f"{host}:{port} failed authentication")
        send_json(sock, Kind.HEADER, header)
    except BaseException:
        sock.close()
        raise
    return sock
