"""Arrow batches handed from a feeding task to a node on the same host through shared memory.

On a data connection whose feeder and node share a host (the node's address is one of the feeder's own: the
common case, a node fed by its own executor's tasks), the socket still carries the handshake and every frame, but
a training batch's bytes go through a region both processes map, not through the kernel's socket buffers twice:

1. the feeding process keeps one region for all its connections (:func:`checkout`): an anonymous ``memfd`` of
   :data:`SLOTS` slots of :data:`SLOT_BYTES` (no name anyone can guess or open; another user cannot open another
   process's descriptors through ``/proc``), a random token written at its start; its pages are the kernel's to
   zero once, not once a connection;
2. after the handshake proved both ends, the feeder offers it in its header (``"shared"``: its pid, the
   descriptor's number, the size and the token);
3. the node opens ``/proc/<pid>/fd/<n>`` read-only (the kernel allows it to the feeder's own user only), checks
   the size and the token (a descriptor number reused for something else, or a pid of another namespace, fails
   here), maps it, and says whether it did in an ``M`` frame;
4. each batch is written as an Arrow IPC stream straight into a free slot and announced by an ``S`` frame (slot,
   length); the node copies it out into its own memory before it reads a byte of it (what the node parses is
   its own copy, whatever the feeder writes meanwhile), gives the slot back (``F``), and queues the batch as one
   received through the socket.  A batch too big for a slot goes through the socket.

A node that cannot map the region (another host after all, another pid namespace) gets every batch through the
socket; it takes either on every connection.  A region goes back to its process's pool only after a connection
the node answered in full; after any other end it is closed (the node may still be reading a slot).  Only a
training stream uses it; inference keeps the socket (its results come back on it).
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import socket
import stat
import struct
import threading
from typing import Any

import numpy as np
import pyarrow as pa

SLOTS = 4
SLOT_BYTES = 8 << 20  # a feeder's batch of 1024 rows x 784 float32 is 3.2 MB; B1's of 2084 rows 6.5 MB
_HEAD = mmap.PAGESIZE  # the token's page; the slots start after it
TOKEN = 16
SLOT_FRAME = struct.Struct(">IQ")  # S: slot, bytes
FREE_FRAME = struct.Struct(">I")  # F: slot
ENV = "TFOS_SHARED_MEMORY"  # "0": every batch through the socket

_local: dict[str, bool] = {}


def wanted() -> bool:
    """Whether this feeder may ask for a region: ``memfd`` exists here and :data:`ENV` is not ``0``."""
    return hasattr(os, "memfd_create") and os.environ.get(ENV, "1") != "0"


def is_local(host: str) -> bool:
    """Whether ``host`` (an address or a name) is an address of this host's own interfaces, in this network
    namespace: a socket can be bound to it.  Two network namespaces on one machine are two hosts here."""
    if host not in _local:
        try:
            infos = socket.getaddrinfo(host.strip("[]"), 0, type=socket.SOCK_DGRAM)
        except OSError:
            infos = []
        found = False
        for family, kind, proto, _, address in infos:
            try:
                with socket.socket(family, kind, proto) as s:
                    s.bind((address[0], 0))
                found = True
                break
            except OSError:
                continue
        _local[host] = found
    return _local[host]


def _offset(slot: int) -> int:
    return _HEAD + slot * SLOT_BYTES


def _size() -> int:
    """A region's bytes: the token's page and the slots."""
    return _offset(SLOTS)


class FeederRegion:
    """The feeder's end: a region of its process, mapped, and which of its slots are free."""

    def __init__(self) -> None:
        self.size = _size()
        self._fd = os.memfd_create("tfos_nb-feed", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, self.size)
            self._map = mmap.mmap(self._fd, self.size)
        except BaseException:
            os.close(self._fd)
            raise
        self.token = secrets.token_bytes(TOKEN)
        self._map[:TOKEN] = self.token
        self.free = list(range(SLOTS))

    def offer(self) -> dict[str, Any]:
        """The header's ``shared``: where the node finds the region and how it knows it is this one."""
        return {"pid": os.getpid(), "fd": self._fd, "size": self.size, "slots": SLOTS, "slot_bytes": SLOT_BYTES,
                "token": self.token.hex()}

    def write(self, slot: int, batch: pa.RecordBatch) -> int | None:
        """``batch`` as an Arrow IPC stream into ``slot``: its length, or None when it does not fit."""
        # a writable view of the slot (a slice of one Arrow buffer over the map would not be writable); it and the
        # Arrow objects over it go with this call, so that close() finds the map without exports
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(memoryview(self._map)[_offset(slot):_offset(slot) + SLOT_BYTES]))
        try:
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            return int(sink.tell())
        except OSError:  # "Write out of bounds": the batch is bigger than a slot
            return None
        finally:
            sink.close()

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


_pool: list[FeederRegion] = []
_pool_lock = threading.Lock()


def checkout() -> FeederRegion | None:
    """This process's region for one connection (a new one when none is free); None when none can be made."""
    with _pool_lock:
        if _pool:
            region = _pool.pop()
            region.free = list(range(SLOTS))
            return region
    try:
        return FeederRegion()
    except OSError:  # no memfd, no memory: the socket carries the batches
        return None


def checkin(region: FeederRegion, answered: bool) -> None:
    """``region`` back after its connection: kept for the next when the node answered the whole partition (it
    reads no slot any more), else closed."""
    if answered:
        with _pool_lock:
            if not _pool:
                _pool.append(region)
                return
    region.close()


class NodeRegion:
    """The node's end: a feeder's region, mapped read-only, read by copying a slot out."""

    def __init__(self, offer: Any) -> None:
        """Map the region ``offer`` (the header's ``shared``) describes; ``OSError`` when it cannot (another host,
        another pid namespace, a descriptor that is not the feeder's region) or ``offer`` is not one."""
        try:
            pid, fd, size = int(offer["pid"]), int(offer["fd"]), int(offer["size"])
            token = bytes.fromhex(str(offer["token"]))
            layout = (int(offer["slots"]), int(offer["slot_bytes"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise OSError(errno.EINVAL, f"not a region's offer: {exc}") from None
        if layout != (SLOTS, SLOT_BYTES) or size != _size() or len(token) != TOKEN \
                or pid <= 0 or fd < 0:
            raise OSError(errno.EINVAL, "a region of another layout")
        path = f"/proc/{pid}/fd/{fd}"
        seen = os.stat(path)  # before it is opened: a FIFO or a device named by a hostile peer is never opened
        if not stat.S_ISREG(seen.st_mode) or seen.st_size != size or seen.st_uid != os.getuid():
            raise OSError(errno.EINVAL, "not the feeder's region (a file of another kind, size or owner)")
        handle = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            now = os.fstat(handle)
            if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
                raise OSError(errno.EINVAL, "not the feeder's region (it changed while it was opened)")
            self._map = mmap.mmap(handle, size, prot=mmap.PROT_READ)
        finally:
            os.close(handle)
        if self._map[:TOKEN] != token:
            self._map.close()
            raise OSError(errno.EINVAL, "not the feeder's region (its token differs)")

    def take(self, payload: bytes | bytearray) -> tuple[int, pa.Buffer]:
        """An ``S`` frame's slot and a copy of its bytes in Arrow's memory pool; ``ValueError`` for a slot or a
        length out of bounds."""
        if len(payload) != SLOT_FRAME.size:
            raise ValueError(f"a slot frame of {len(payload)} bytes")
        slot, n = SLOT_FRAME.unpack(payload)
        if slot >= SLOTS or not 0 < n <= SLOT_BYTES:
            raise ValueError(f"slot {slot} of {n} bytes is outside the region ({SLOTS} slots of {SLOT_BYTES})")
        out = pa.allocate_buffer(n)
        np.frombuffer(out, np.uint8)[:] = np.frombuffer(self._map, np.uint8, n, _offset(slot))
        return slot, out

    def close(self) -> None:
        self._map.close()
