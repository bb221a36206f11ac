"""Waiting for a cluster's nodes to run their function, after the launch stage (classic and Spark Connect)."""

from __future__ import annotations

import time
from typing import Any

from . import state as S
from .errors import error_for, python_error_line


def await_running(state: S.ClusterState, job: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    statuses_checked = False
    while True:
        view = state.snapshot()
        if view.state == S.C_FAILED:
            raise error_for(view)
        if job.done and not statuses_checked:
            statuses_checked = True
            if job.error is not None:
                msg = f"starting the nodes failed: {python_error_line(job.error)}"
                raise RuntimeError(msg)
            bad = [s for s in job.result() if not s.get("ok")]
            if bad:
                roles = state.nodes
                lines = [f"{roles[s['node']].label}: {s.get('error')}" for s in bad]
                msg = "nodes did not start:\n" + "\n".join(lines)
                raise RuntimeError(msg)
        ready = all(n.state in (S.RUNNING, S.FINISHED, S.STOPPED) for n in view.nodes)
        if ready and job.done:
            return
        if time.monotonic() > deadline:
            missing = [f"{n.label} ({n.state})" for n in view.nodes if n.state not in (S.RUNNING, S.FINISHED)]
            msg = (
                f"reservation timed out after {timeout:.0f} s: waiting for {', '.join(missing)}. "
                "Are there enough free executors, and can executors reach the driver?"
            )
            raise TimeoutError(msg)
        with state.changed:
            state.changed.wait(0.1)
