"""A child process's output pipe (its stdout and stderr), read line by line by its :class:`~.owner.ChildOwner`.

Each chunk is read and split under one condition, so that :meth:`OutputLines.drain` can tell when everything the
child wrote so far is in: the traceback a child prints before it reports its function's error
(:class:`~..protocol.pipes.Failed`) goes to the driver with that report.
"""

from __future__ import annotations

import fcntl
import os
import select
import sys
import termios
import threading
import time
from collections.abc import Callable
from typing import IO

LINE_CHARS = 4000  # a longer line is cut


class OutputLines:
    """The lines of ``stream``, each handed to ``on_line`` by :meth:`run` (the reader thread's target)."""

    def __init__(self, stream: IO[bytes], on_line: Callable[[str], None]) -> None:
        self._stream = stream
        self._on_line = on_line
        self._read = threading.Condition()  # held while a chunk is read and split into lines

    def run(self) -> None:
        """Read to the end of the pipe, then close it."""
        fd = self._stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        rest = b""
        while True:
            poller.poll()  # readable, or its end: the read below does not block with the condition held
            with self._read:
                chunk = os.read(fd, 65536)
                if chunk:
                    *lines, rest = (rest + chunk).split(b"\n")
                else:  # the end: an unterminated last line is a line
                    lines, rest = ([rest] if rest else []), b""
                for raw in lines:
                    self._on_line(raw.decode("utf-8", "replace")[:LINE_CHARS])
                self._read.notify_all()
            if not chunk:
                break
        self._stream.close()

    def drain(self, timeout: float) -> bool:
        """Wait until every byte written to the pipe so far went through ``on_line`` (at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        unread = bytearray(4)
        with self._read:
            while True:
                try:
                    fcntl.ioctl(self._stream.fileno(), termios.FIONREAD, unread)
                except (OSError, ValueError):  # read to its end and closed: all is in
                    return True
                left = deadline - time.monotonic()
                if int.from_bytes(unread, sys.byteorder) == 0 or left <= 0:
                    return int.from_bytes(unread, sys.byteorder) == 0
                self._read.wait(left)
