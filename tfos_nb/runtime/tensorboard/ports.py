"""The one port finder: who listens on a TCP port of this machine, from Linux's socket tables (``/proc/net/tcp{,6}``).

One reader for every side of TensorBoard's route: the chief, and the kernel for a TensorBoard of its
own (``%tfos_tensorboard --logdir``), find their TensorBoard's port among the sockets of that process
(:func:`listening_port`), and the Jupyter server's proxy
asks, before each request, whose socket a connection to a registered loopback port would reach
(:func:`listener_uids`) — a port TensorBoard freed is anyone's to take.  By hand rather than with
psutil: the Jupyter server's environment need not have psutil, and psutil's per-process scan
(every process's descriptors) costs far more than reading one table.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass

_TCP_LISTEN = "0A"  # the st column of /proc/net/tcp: TCP_LISTEN


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its address, port, owner's uid and socket inode."""

    address: str
    port: int
    uid: int
    inode: str


def listeners(pid: int | str = "self") -> list[Listener]:
    """Every listening TCP socket in the network namespace of process ``pid`` ([] where unreadable)."""
    found = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == _TCP_LISTEN:
                hex_addr, hex_port = cols[1].split(":")
                found.append(Listener(_decode_address(hex_addr, family), int(hex_port, 16), int(cols[7]), cols[9]))
    return found


def _decode_address(hex_addr: str, family: int) -> str:
    # /proc/net/tcp* prints the address as 32-bit words in host byte order
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    return socket.inet_ntop(family, words)


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """The ``(address, port)`` pairs process ``pid`` listens on (its own descriptors; [] if unreadable)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    return [(s.address, s.port) for s in listeners(pid) if s.inode in inodes]


def listening_port(pid: int, host: str) -> int | None:
    """The port process ``pid`` listens on at address ``host`` (the lowest, if several), read from its own
    descriptors; None while it listens nowhere there (or they cannot be read)."""
    ports = [port for address, port in listening_addresses(pid) if same_address(address, host)]
    return min(ports) if ports else None


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(address.strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def same_address(a: str, b: str) -> bool:
    """Whether two textual IP addresses are one (``::ffff:10.0.0.5`` is ``10.0.0.5``)."""
    x, y = _ip(a), _ip(b)
    return a == b if x is None or y is None else x == y


def is_local_address(address: str) -> bool:
    """Whether ``address`` (an IP) is this machine's: loopback, or one it can bind (no packet is sent)."""
    ip = _ip(address)
    if ip is None:
        return False
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False  # EADDRNOTAVAIL: another machine's address
    return True


def listener_uids(address: str, port: int) -> set[int]:
    """The uids owning every socket of this machine that a connection to ``address:port`` could reach.

    The socket bound to that very address, and any wildcard one (``0.0.0.0``, ``::``) on the port: an
    IPv6 wildcard takes IPv4 connections too unless it is IPv6-only, which the table does not show, so
    it counts.  Empty when nothing listens.  Only meaningful for this machine's addresses
    (:func:`is_local_address`).
    """
    ip = _ip(address)
    if ip is None:
        return set()
    uids = set()
    for s in listeners():
        other = _ip(s.address) if s.port == port else None
        if other is not None and (other == ip or (other.is_unspecified and other.version in (ip.version, 6))):
            uids.add(s.uid)
    return uids
