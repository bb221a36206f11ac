"""How a driver job's failure reads: one message format for clusters and parallel runs.

The first node (or run) that failed on its own is the cause and is named with
its host, executor, error and last output lines; nodes lost or stopped after it
are listed at the end.
"""

from __future__ import annotations

import re
from typing import Any

from .control import state

TAIL_IN_ERRORS = 20


class TFClusterError(RuntimeError):
    """A node failed (or was lost); the cluster has been torn down.

    ``node`` is the failed node's label (``worker:1``), with ``host``,
    ``executor_id``, ``exit_code`` and ``tail`` (its last output lines).
    """

    def __init__(self, message: str, node: state.NodeView | None = None) -> None:
        super().__init__(message)
        self.node = node.label if node else None
        self.host = node.host if node else None
        self.executor_id = node.executor_id if node else None
        self.exit_code = node.exit_code if node else None
        self.tail = list(node.tail) if node else []


# What TensorFlow raises in a node whose collective a peer stopped answering (gone, stopped, or failed itself):
# the error of a consequence, not of the cause.
_PEER_CAUSED = re.compile(r"^(?:UnavailableError|CancelledError|AbortedError|DeadlineExceededError)\b|"
                          r"Collective ops is aborted")


def peer_caused(error: str | None) -> bool:
    """Whether a node's ``error`` says its function raised because a peer stopped answering its collective."""
    return bool(error) and _PEER_CAUSED.search(error or "") is not None


def first_failure(view: state.ClusterView) -> tuple[state.NodeView | None, list[state.NodeView]]:
    """(the node that failed first on its own, the others that failed), or (None, []) when none did."""
    failed = [n for n in view.nodes if n.state == state.FAILED]
    # The first node that failed on its own is the cause: a peer waiting for it in a collective fails later, or
    # before its cause is named (a stopped node is named after STOPPED_S) and then says so (peer_caused);
    # lost ones (no heartbeat) come last.
    failed.sort(key=lambda n: (n.error is None or "no heartbeat" in (n.error or ""), peer_caused(n.error),
                               float("inf") if n.failed_at is None else n.failed_at, n.index))
    return (failed[0], failed[1:]) if failed else (None, [])


def failure_message(view: state.ClusterView, what: str, *, given: str = "", others: str = "also failed") -> str:
    """The error text of a failed job: ``what`` names it (``cluster x``, ``parallel runs y``)."""
    n, rest = first_failure(view)
    if n is None and view.state == state.C_STOPPED:
        return f"{what} was {view.error or 'stopped'}"  # its owner stopped it: "... was stopped (shut down)"
    if n is None:
        return f"{what} failed: {view.error or 'unknown error'}"
    msg = f"{n.label}{given} failed on host {n.host or '?'} (executor {n.executor_id or '?'}): {n.error or 'unknown error'}"
    tail = [line for line in n.tail if line.strip()][-TAIL_IN_ERRORS:]
    if tail:
        msg += f"\n--- last {len(tail)} lines of {n.label}'s output ---\n" + "\n".join(tail)
    if rest:
        msg += f"\n({others}: {', '.join(o.label for o in rest)})"
    return msg


def error_for(view: state.ClusterView) -> TFClusterError:
    """The :class:`TFClusterError` of a failed cluster."""
    return TFClusterError(failure_message(view, f"cluster {view.name}", others="also failed or stopped after it"),
                          first_failure(view)[0])


def python_error_line(exc: BaseException | Any) -> str:
    """The last Python exception line inside a Py4J/Spark error, else its first line."""
    text = str(exc)
    hits = re.findall(r"^\s*((?:[\w.]+)(?:Error|Exception|Interrupt)): (.+)$", text, flags=re.M)
    hits = [h for h in hits if not h[0].startswith(("org.", "java.", "py4j."))]
    if hits:
        name, msg = hits[-1]
        return f"{name.rsplit('.', 1)[-1]}: {msg}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a KeyboardInterrupt, or an error raised while one was being handled: py4j, interrupted
    in the middle of a call, tears its connection down in its own handler and may raise a ``Py4JError`` ("Gateway
    must be connected to send cancel cmd.") in the interrupt's place."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False
