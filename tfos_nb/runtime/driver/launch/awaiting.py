"""Waiting for a cluster's nodes to run their function, after the launch stage started (either backend)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..control import state as cluster_state
from ..errors import error_for, python_error_line

if TYPE_CHECKING:
    from ..job import DriverJob


#: nodes named one by one in a reservation timeout; beyond it the rest are counted by state
NAMED_NODES = 12


def waited_for(nodes: list[Any]) -> str:
    """The nodes a reservation still waits for, as its timeout names them: each with its state, and beyond
    :data:`NAMED_NODES` of them (a launch of hundreds) the first ones and the rest counted by state."""
    named = [f"{n.label} ({n.state})" for n in nodes[:NAMED_NODES]]
    rest = nodes[NAMED_NODES:]
    if not rest:
        return ", ".join(named)
    counts: dict[str, int] = {}
    for n in rest:
        counts[n.state] = counts.get(n.state, 0) + 1
    by_state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return f"{len(nodes)} nodes: {', '.join(named)} and {len(rest)} more ({by_state})"


def await_running(job: DriverJob, meta: dict[str, Any], launch: Any, timeout: float) -> None:
    """Return once the launch stage ``launch`` (of ``meta``) is over and every node of ``job`` runs its function.

    Raises the cluster's own error as soon as the state fails (a node's start failed, the job was
    cancelled), the launch stage's error or its tasks' bad statuses once it is over, and a
    ``TimeoutError`` naming the nodes still waited for after ``timeout`` s.  When the stage is over,
    ``job.launched(meta, statuses)`` runs first: on Spark Connect the state becomes visible only then.
    """
    state = job.state
    deadline = time.monotonic() + timeout
    launched = False
    looked = 0.0
    while True:
        view = state.snapshot()
        if view.state in (cluster_state.C_FAILED, cluster_state.C_STOPPED):  # a node's start failed, or the job was cancelled
            raise error_for(view)
        if launch.done and not launched:
            launched = True
            if launch.error is not None:
                msg = f"starting the nodes failed: {python_error_line(launch.error)}"
                raise RuntimeError(msg)
            statuses = launch.result()
            job.launched(meta, statuses)
            bad = [s for s in statuses if not s.ok]
            if bad:
                lines = [f"{state.nodes[s.node].label}: {s.error}" for s in bad]
                raise RuntimeError("nodes did not start:\n" + "\n".join(lines))
            continue
        if launched and all(n.state in (cluster_state.RUNNING, cluster_state.FINISHED, cluster_state.STOPPED) for n in view.nodes):
            return
        if time.monotonic() > deadline:
            missing = waited_for([n for n in view.nodes if n.state not in (cluster_state.RUNNING, cluster_state.FINISHED)])
            waiting = launch.waiting() if hasattr(launch, "waiting") else ""
            stage = "" if launched else f" ({waiting or 'the launch stage is not over'})"
            msg = (f"reservation timed out after {timeout:.0f} s: waiting for {missing}{stage}. "
                   f"Are there enough free executor slots{job.reach_hint}?")
            raise TimeoutError(msg)
        looked = state.wait_a_change(0.1, looked)
