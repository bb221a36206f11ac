"""One feeding task's connection, seen from the node: its partition, generation and skipped rows, its counts, and
its one answer to the feeder (done, or why not)."""

from __future__ import annotations

import collections
import socket
import threading
from typing import Any

from ...protocol import dataplane


class Conn:
    """One feeding task's connection, seen from the node."""

    def __init__(self, sock: socket.socket, header: dict[str, Any]) -> None:
        self.sock = sock
        self.partition = int(header.get("partition", -1))
        self.gen = int(header.get("gen", 0))
        self.mode = str(header.get("mode", "train"))
        self.feed = str(header.get("feed", "input"))  # a named set's name (executor/feed/named_sets.py), else "input"
        self.after = int(header.get("after", -1))  # deterministic mode: read once that partition (same gen) is
        self.held: collections.deque[tuple[str, Conn, Any]] | None = None  # its items until then (FeedHub)
        # row ranges of the partition its feeder did not send (recovery: already trained), merged
        self.skip: list[tuple[int, int]] = [(int(a), int(b)) for a, b in header.get("skip") or ()]
        self.counted = int(header.get("rows", -1)) >= 0  # the train() call counted its partitions' rows
        self.received = self.consumed = self.answered = self.skipped = 0
        self.shared = 0  # rows received through shared memory (protocol/shared.py)
        self.ended = False  # the feeder sent E
        self.closed = False
        self._send_lock = threading.Lock()

    def send(self, kind: dataplane.Kind, payload: Any) -> None:
        with self._send_lock:
            if self.closed:
                return
            if isinstance(payload, dict):
                dataplane.send_json(self.sock, kind, payload)
            else:
                dataplane.send_frame(self.sock, kind, payload)

    def finish(self, error: str | None = None, node_failed: bool = False, rows: int | None = None) -> None:
        """The one answer: done with ``rows`` taken (the rows consumed unless said), or ``error``."""
        with self._send_lock:
            if self.closed:
                return
            try:
                if error:
                    dataplane.send_json(self.sock, dataplane.Kind.ERROR, {"error": error, "node_failed": node_failed})
                else:
                    dataplane.send_json(self.sock, dataplane.Kind.DONE, {"rows": self.consumed if rows is None else rows,
                                                           "skipped": self.skipped, "shared": self.shared})
            except OSError:
                pass
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass
