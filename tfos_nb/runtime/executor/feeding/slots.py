"""A feeding task's side of a data connection: the node's answers, and a training partition's batches written into
slots of shared memory when the node is on this host (:mod:`tfos_nb.runtime.protocol.shared`)."""

from __future__ import annotations

import socket
import time
from typing import Any

from ...batches import columns
from ...protocol import dataplane, shared


class NodeAnswer(dataplane.DataPlaneError):
    """The node answered a partition with an error (``X``)."""

    def __init__(self, error: str, node_failed: bool) -> None:
        super().__init__(error)
        self.node_failed = node_failed


def node_error(payload: Any) -> NodeAnswer:
    body = dataplane.parse_json(payload)
    return NodeAnswer(str(body.get("error", "node error")), bool(body.get("node_failed")))


def recv_answer(sock: socket.socket) -> dict[str, Any]:
    """The node's answer to a whole partition (``A``), or its error raised (:class:`NodeAnswer`)."""
    kind, payload = dataplane.recv_frame(sock)
    while kind is dataplane.Kind.FREE:  # slots given back after the last batch: nothing more to write
        kind, payload = dataplane.recv_frame(sock)
    if kind is dataplane.Kind.ERROR:
        raise node_error(payload)
    if kind is not dataplane.Kind.DONE:
        raise dataplane.DataPlaneError(f"unexpected frame {kind.value!r}")
    return dataplane.parse_json(payload)


def send_batch(sock: socket.socket, batch: Any) -> None:
    """One batch through the socket (a ``D`` frame)."""
    dataplane.send_frame(sock, dataplane.Kind.DATA, columns.encode_ipc(batch))


class Slots:
    """One training connection's use of this process's shared-memory region: offered in the header, accepted or
    not by the node, a batch written into a free slot, the region back to the pool at the end."""

    def __init__(self, region: shared.FeederRegion, timeout: float) -> None:
        self.region: shared.FeederRegion | None = region
        self._timeout = timeout

    @classmethod
    def offer(cls, host: str, header: dict[str, Any], timeout: float) -> Slots | None:
        """Slots for a training connection to a node at ``host``, offered in ``header``; None when the node is not
        on this host (or shared memory is off or not to be had here)."""
        if not (shared.wanted() and shared.is_local(host)):
            return None
        region = shared.checkout()
        if region is None:
            return None
        header["shared"] = region.offer()
        return cls(region, timeout)

    def accepted(self, sock: socket.socket) -> None:
        """The node's ``M`` frame, right after the header: whether it mapped the region (else every batch goes
        through the socket, and the region back to the pool)."""
        kind, payload = dataplane.recv_frame(sock, time.monotonic() + self._timeout)
        sock.settimeout(self._timeout)
        if kind is not dataplane.Kind.REGION:
            raise dataplane.DataPlaneError(f"unexpected frame {kind.value!r}")
        if dataplane.parse_json(payload).get("mapped") is not True:
            self.close(answered=True)

    def send(self, sock: socket.socket, batch: Any) -> None:
        """One batch to the node: into a free slot when the node mapped the region and the batch fits, else through
        the socket."""
        region = self.region
        if region is not None:
            if not region.free:
                self._wait_free(sock, region)
            slot = region.free.pop()
            n = region.write(slot, batch)
            if n is not None:
                dataplane.send_frame(sock, dataplane.Kind.SLOT, shared.SLOT_FRAME.pack(slot, n))
                return
            region.free.append(slot)
        send_batch(sock, batch)

    def _wait_free(self, sock: socket.socket, region: shared.FeederRegion) -> None:
        """Back-pressure: wait (up to the feed's timeout, as a blocked send would) until the node gives a slot back."""
        try:
            while not region.free:
                kind, payload = dataplane.recv_frame(sock, time.monotonic() + self._timeout)
                if kind is dataplane.Kind.FREE:
                    slot = shared.FREE_FRAME.unpack(bytes(payload))[0] if len(payload) == shared.FREE_FRAME.size else -1
                    if not 0 <= slot < shared.SLOTS or slot in region.free:
                        raise dataplane.DataPlaneError(f"slot {slot} given back, not one in use")
                    region.free.append(slot)
                elif kind is dataplane.Kind.ERROR:
                    raise node_error(payload)
                elif kind is dataplane.Kind.DONE:  # it stopped reading: as a send to a closed connection fails
                    raise ConnectionError("the node answered before the partition's end")
                else:
                    raise dataplane.DataPlaneError(f"unexpected frame {kind.value!r}")
        finally:
            sock.settimeout(self._timeout)

    def close(self, answered: bool) -> None:
        """The connection ended: the region back to the process's pool when the node ``answered`` the partition
        (or never mapped the region), else closed (the node may still be reading a slot)."""
        if self.region is not None:
            shared.checkin(self.region, answered)
            self.region = None
