"""The nodes' output on the driver's stderr, for programs run outside a notebook (``spark-submit``, ``python job.py``).

A batch job would otherwise show nothing of its nodes while they train: their lines
go to ``tfos_nb-…-nodeN.log`` files in each executor's work directory.  As PySpark's
TorchDistributor streams its workers' output to the driver, the lines the nodes'
heartbeats already bring to the driver (the same path that feeds a notebook cell and
``cluster.logs()``) are written to ``sys.stderr`` as ``[role:index] line``, TensorFlow's
native log noise left out (:mod:`..noise`, as in a cell).

In a notebook kernel the cell shows the nodes (panel, stream), so nothing is written
there by default.  ``TFCluster.run(..., node_output=False)`` or
``TFOS_NB_NODE_OUTPUT=0`` turns it off; ``node_output=True`` or
``TFOS_NB_NODE_OUTPUT=1`` turns it on anywhere.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import IO

from ..noise import quiet_lines

__all__ = ["ENV", "StderrLines", "in_notebook_kernel", "wanted", "with_stderr"]

ENV = "TFOS_NB_NODE_OUTPUT"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")

LogCallback = Callable[[str, list[str]], None]


def in_notebook_kernel() -> bool:
    """Whether this process is an IPython kernel (Jupyter), seen without importing IPython.

    A kernel's shell has a ``kernel``; a terminal IPython or a plain interpreter has none.
    """
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    return getattr(shell, "kernel", None) is not None


def wanted(node_output: bool | None) -> bool:
    """Whether to stream: the argument if given, else ``TFOS_NB_NODE_OUTPUT`` if set, else outside a kernel."""
    if node_output is not None:
        return bool(node_output)
    value = os.environ.get(ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if value:
        msg = (f"{ENV}={os.environ[ENV]!r}: use 1 (stream the nodes' output to the driver's stderr) or 0 (do not); "
               "unset, it streams outside notebooks")
        raise ValueError(msg)
    return not in_notebook_kernel()


class StderrLines:
    """A cluster's log listener: every new node line as ``[role:index] line`` on ``stream`` (``sys.stderr``).

    Called on the control server's thread; one write per heartbeat's lines, so
    lines of two nodes never interleave mid-line.
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, label: str, lines: list[str]) -> None:
        kept = quiet_lines(lines)
        if not kept:
            return
        text = "".join(f"[{label}] {line}\n" for line in kept)
        stream = self._stream if self._stream is not None else sys.stderr  # the stderr of the moment (redirects)
        with self._lock:
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stderr must not break the control server
                pass


def with_stderr(log_callback: LogCallback | None, node_output: bool | None) -> LogCallback | None:
    """``log_callback``, plus the stderr stream when :func:`wanted` says so."""
    if not wanted(node_output):
        return log_callback
    stderr = StderrLines()
    if log_callback is None:
        return stderr

    def both(label: str, lines: list[str]) -> None:
        stderr(label, lines)
        log_callback(label, lines)

    return both
