"""Addresses and ports."""

from __future__ import annotations

import errno
import random
import re
import socket
import time
import urllib.parse
from typing import Any


def resolve(host: str) -> str:
    """The address of ``host``; Spark writes IPv6 literals bracketed (``[fd00::2]``)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0])
    except OSError:
        return host


def local_ip_towards(host: str, port: int) -> str:
    """The local address this machine uses to reach ``host`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))
            address: str = s.getsockname()[0]
            return address
        except OSError:
            return "127.0.0.1"


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections' local ports start there)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(family: int, host: str, port: int) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, port))
        return True
    except OSError as exc:
        # no IPv6 on this machine: nothing there can hold the port
        return family == socket.AF_INET6 and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def free_port(host: str) -> int:
    """A port that was free a moment ago on every address (TensorFlow's server binds the wildcard itself).

    Picked at random below the ephemeral range, so that the many short-lived outgoing
    connections of Spark, Py4J and the feeders (which take ports from that range) cannot
    take it between this check and TensorFlow's bind.
    """
    low = _ephemeral_low()
    lo, hi = max(1024, low - 12000), low - 1
    if hi > lo:
        for _ in range(64):
            port = random.randint(lo, hi)
            if _bindable(socket.AF_INET, "", port) and _bindable(socket.AF_INET6, "::", port):
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        bound: int = s.getsockname()[1]
        return bound


def reserve_port(port: int) -> socket.socket | None:
    """A socket bound to ``port`` on every IPv4 address, holding it for the node's TensorFlow server.

    TensorFlowOnSpark's reservation: bound with ``SO_REUSEADDR`` and not listening, so a
    plain ``bind`` by another program fails while TensorFlow's gRPC server (which sets
    ``SO_REUSEADDR`` itself) can still take the port.  ``None`` when the port is gone already.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
    except OSError:
        sock.close()
        return None
    return sock


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def without_credentials(url: str) -> str:
    """``url`` without the ``user:password@`` of its authority: what may be shown, logged or saved of it.

    A tracking URI such as ``https://user:token@host/`` (or a database store's ``postgresql://user:pw@db/x``)
    carries a secret; the page it names does not need it.  Only the userinfo goes (a query string is kept).
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: still no userinfo shown
        return _USERINFO.sub(r"\1", url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def scrub_credentials(text: str) -> str:
    """``text`` (an error message, a log line) with the userinfo of every URL in it removed."""
    return _USERINFO.sub(r"\1", text)


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#]*@")


# accept() errors that concern only the connection being accepted (it went away while queued): take the
# next one.  Any other (EMFILE, ENFILE, ENOBUFS, ENOMEM: no descriptor or memory now) leaves the connection
# queued and the listener readable, so a server retrying at once would spin: it waits ACCEPT_BACKOFF_S.
ACCEPT_PER_CONNECTION = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ETIMEDOUT, errno.ENETDOWN,
                                   errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENOPROTOOPT,
                                   errno.EOPNOTSUPP, errno.EINTR})
ACCEPT_BACKOFF_S = 0.2


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None, into: Any = None) -> Any:
    """Exactly ``n`` bytes from ``sock``; ``ConnectionError`` if the peer closes first.

    ``deadline`` (``time.monotonic()``): all of them by then, else ``TimeoutError`` — a peer sending
    a byte at a time cannot stretch it as it can a per-receive timeout.  ``into``: a writable buffer of
    ``n`` bytes to fill and return (else a new ``bytearray``).
    """
    buf = bytearray(n) if into is None else into
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k
    return buf
