"""Addresses and ports."""

from __future__ import annotations

import socket


def resolve(host: str) -> str:
    """The address of ``host``; Spark writes IPv6 literals bracketed (``[fd00::2]``)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except OSError:
        return host


def local_ip_towards(host: str, port: int) -> str:
    """The local address this machine uses to reach ``host`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def free_port(host: str) -> int:
    """A port that was free on ``host`` a moment ago (TensorFlow binds it itself)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes from ``sock``; ``ConnectionError`` if the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k
    return buf
