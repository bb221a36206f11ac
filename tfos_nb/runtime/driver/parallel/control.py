"""The driver's control of parallel runs: registration without cluster formation, recording outcomes,
and the checks made before the runs start (their arguments, whether a barrier stage fits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...protocol import messages
from ...protocol.bodies import BeatReport
from ..control import state, states
from ..control.controller import Controller
from ..launch.slots import available_slots, connect_slots, fixed_slots, wait_for_slots


class RunController(Controller):
    """The cluster controller's heartbeat handling; registration without cluster formation.

    Also the writer of what each run's Spark task returned (:meth:`record_outcome`).
    """

    def _register(self, msg: messages.Register) -> messages.Reply:
        st = self.state
        reply = messages.Reply(ok=True)
        with st.lock:
            node = self.state.node(msg.node)
            if node is None:
                return messages.Reply(ok=False, error=f"no run {msg.node}")
            if st.kill_requested or st.ended:
                return messages.Reply(ok=False, error=f"runs {st.state}: {node.label} not started")
            if node.state != state.PENDING:
                error = f"{node.label} was started twice (Spark retried its task: executor lost?); runs are not retried"
                self._fail(error)
                reply = messages.Reply(ok=False, error=error)
            else:
                states.transition(node, state.STARTING, why="its run registered")
                node.host, node.pid, node.executor_id = msg.host, msg.pid, msg.executor_id
                node.working_dir = msg.working_dir
                node.gpus = list(msg.gpus)
                node.last_heartbeat = self.clock()
                if st.state == state.C_RESERVING:
                    states.transition(st, state.C_RUNNING, why="a run started")
        st.notify()
        return reply

    def record_outcome(self, index: int, status: dict[str, Any], metrics: dict[str, Any] | None) -> None:
        """What run ``index``'s task returned: its status, and (it succeeded) the scalars of its value."""
        st = self.state
        node = st.nodes[index]
        report = status.get("report") or {}
        with st.lock:
            node.host = node.host or status.get("host", "")
            node.executor_id = node.executor_id or status.get("executor_id", "")
            if report:
                st.update_progress(node, BeatReport.from_dict(report))  # the task's result row, read as a beat's
            if not status.get("ok"):
                if node.state != state.FAILED:
                    states.transition(node, state.FAILED, why="its Spark task failed")
                    node.failed_at = st.clock()
                    node.error = node.error or status.get("error") or "failed"
                    node.tail = node.tail or list(status.get("tail") or [])
                self._fail(f"{node.label} failed")
            else:
                node.metrics.update(metrics or {})
                states.transition(node, state.FINISHED, why="its Spark task returned")
        st.notify()


def can_gang_schedule(sc: Any, n: int) -> bool:
    """Whether a barrier stage of ``n`` tasks can start now (waits a little for executors to come up)."""
    if str(sc.getConf().get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return False  # Spark refuses barrier stages under dynamic allocation
    slots, _ = available_slots(sc)
    if slots >= n:
        return True
    fixed = fixed_slots(sc)
    if fixed is not None and fixed < n:
        return False
    try:
        wait_for_slots(sc, n, 60)
    except RuntimeError:
        return False
    return True


def classic_gang(sc: Any, n: int) -> tuple[bool | None, int, int]:
    """(whether a barrier stage of ``n`` tasks can start now, task slots, executors) on a classic SparkContext."""
    fits = can_gang_schedule(sc, n)
    return (fits, *available_slots(sc))


def connect_gang(spark: Any, n: int) -> tuple[bool | None, int, int]:
    """The same on Spark Connect, from the session's configuration (all a Connect client can see); ``None``:
    it does not say."""
    known = connect_slots(spark)
    if known is None:
        return None, 0, 0
    return known[0] >= n, *known


def barrier_refusal(n: int, slots: int, executors: int) -> str:
    """Why ``use_barrier=True`` cannot run ``n`` runs as one barrier stage."""
    return (f"use_barrier=True runs the {n} runs as one barrier stage, which needs {n} task slots; this Spark "
            f"application has {slots} on {executors} executor(s). Pass use_barrier=False to run them in waves, "
            "or give Spark more executors.")


def runs_args(tf_args: Any, num_executors: int | None, per_run: bool = False) -> tuple[list[Any], list[dict[str, Any]] | None]:
    """(args of each run, the grid's dicts or None): a list of dicts is a grid, one dict per run."""
    if per_run and not (isinstance(tf_args, (list, tuple)) and tf_args):
        msg = f"per_run=True needs a non-empty list of run arguments, got {type(tf_args).__name__}"
        raise ValueError(msg)
    is_grid = isinstance(tf_args, (list, tuple)) and len(tf_args) > 0 and all(isinstance(a, Mapping) for a in tf_args)
    is_grid = is_grid or per_run
    if num_executors is not None and (
        not isinstance(num_executors, int) or isinstance(num_executors, bool) or num_executors < 1
    ):
        msg = f"num_executors must be a positive integer (the number of runs), got {num_executors!r}"
        raise ValueError(msg)
    if is_grid:
        if num_executors is not None and num_executors != len(tf_args):
            msg = (
                f"tf_args is a list of {len(tf_args)} dicts (one per run) but num_executors={num_executors}: "
                "give one dict per run, or num_executors=None"
            )
            raise ValueError(msg)
        return list(tf_args), [dict(a) for a in tf_args] if all(isinstance(a, Mapping) for a in tf_args) else None
    if num_executors is None:
        msg = "num_executors (the number of runs) is needed unless tf_args is a list of dicts, one per run"
        raise ValueError(msg)
    return [tf_args] * num_executors, None
