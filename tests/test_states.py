"""The node and cluster state machine (``driver/control/states.py``): its members, its tables, its one writer.

The tables are held to the code both ways: the driver's real paths (a controller on a test clock, parallel runs'
controller) make every transition the tables list and no other; an illegal one is refused before anything
changes; the Connect mirror follows the coordinator forward only; and no module but ``states.py`` writes a node's
or a cluster's ``state`` (read from the package's source with ``ast``, as ``test_layers.py`` reads its imports).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_input_ran_out import Cluster as FedPair
from tfos_nb.runtime.driver.connect import snapshot
from tfos_nb.runtime.driver.control import state, states
from tfos_nb.runtime.driver.control.controller import Controller
from tfos_nb.runtime.driver.control.states import CLUSTER_TRANSITIONS, NODE_TRANSITIONS, IllegalTransition
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.driver.parallel.control import RunController
from tfos_nb.runtime.driver.parallel.results import RunsState
from tfos_nb.runtime.executor.feed.plan import AHEAD_S
from tfos_nb.runtime.protocol import messages, remote

PACKAGE = Path(__file__).resolve().parent.parent / "tfos_nb"
MACHINE = PACKAGE / "runtime" / "driver" / "control" / "states.py"
ROLES = [("chief", 0), ("worker", 0)]
LIVE = (state.PENDING, state.REGISTERED, state.STARTING, state.RUNNING)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def controller(roles=ROLES, cls=Controller, st=None):
    st = st or state.ClusterState("c1", "demo", list(roles), clock=Clock())
    return st, cls(st, JobOptions(num_gpus=0, heartbeat_timeout=10.0), input_mode_spark=True, tensorboard=False,
                   log_dir=None)


def register(ctl, node):
    assert ctl.handle(messages.Register(node=node, host="h", port=1000 + node, executor_id=str(node), pid=10)).ok


def beat(ctl, node, said, **kw):
    return ctl.handle(messages.Heartbeat(node=node, state=said, **kw))


def with_chief_in(live):
    """A chief and a worker, the chief brought to ``live`` by the controller's own paths."""
    st, ctl = controller()
    if live != state.PENDING:
        register(ctl, 0)
    if live in (state.STARTING, state.RUNNING):
        register(ctl, 1)  # every node registered: the cluster forms
    if live == state.RUNNING:
        assert beat(ctl, 0, "running").ok
    assert st.nodes[0].state == live
    return st, ctl


# -- the members -------------------------------------------------------------------------------------------------
def test_terminal_states_know_they_are_terminal():
    assert {s for s in states.Node if s.terminal} == {state.FINISHED, state.FAILED, state.STOPPED} == state.TERMINAL
    assert {s for s in states.Cluster if s.terminal} == {state.C_FINISHED, state.C_FAILED, state.C_STOPPED}
    assert not any(s.terminal for s in LIVE) and not state.C_RESERVING.terminal and not state.C_RUNNING.terminal
    assert all(not CLUSTER_TRANSITIONS[s] for s in states.Cluster if s.terminal)  # a cluster ends once
    assert not NODE_TRANSITIONS[state.FAILED]


def test_a_state_is_its_string_in_comparisons_text_and_json():
    """The wire, the snapshots, the widgets and the tests keep reading strings."""
    assert state.RUNNING == "running" and "failed" in state.TERMINAL and state.C_RESERVING == "reserving"
    assert f"{state.C_FAILED}" == str(state.C_FAILED) == "%s" % state.C_FAILED == "failed"
    assert json.dumps({"state": state.STARTING, state.FINISHED: 1}) == '{"state": "starting", "finished": 1}'
    assert states.Node("running") is state.RUNNING and {state.FINISHED: "x"}.get("finished") == "x"


# -- refusals ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("record", "start", "to"), [
    ("node", state.FINISHED, state.RUNNING),
    ("node", state.FAILED, state.FINISHED),
    ("node", state.RUNNING, state.STARTING),
    ("node", state.STARTING, state.REGISTERED),
    ("cluster", state.C_FAILED, state.C_RUNNING),
    ("cluster", state.C_FINISHED, state.C_STOPPED),
    ("cluster", state.C_RUNNING, state.C_RESERVING),
])
def test_an_illegal_transition_is_refused_loudly_and_changes_nothing(record, start, to):
    st = state.ClusterState("c1", "demo", ROLES)
    target = st.nodes[1] if record == "node" else st
    target.state = start  # a test's shortcut to where the refusal is
    with pytest.raises(IllegalTransition, match=rf"{start} -> {to} \(why not\) is not a transition tfos_nb makes"):
        states.transition(target, to, why="why not")
    assert target.state == start


def test_a_record_starts_in_its_first_state_only():
    st = state.ClusterState("c1", "demo", ROLES)
    assert st.state is state.C_RESERVING and all(n.state is state.PENDING for n in st.nodes)
    fresh = state.NodeRecord.__new__(state.NodeRecord)
    fresh.job_name, fresh.task_index = "worker", 3
    with pytest.raises(IllegalTransition, match="worker:3 starts pending, not running"):
        states.transition(fresh, state.RUNNING, why="a guess")


def test_a_beat_the_table_refuses_answers_an_error_and_the_node_keeps_its_state():
    """The control server's channel answers a handler's exception as a failed reply (and logs it): the server
    lives on.  No supervisor says ``starting`` after ``running`` (its flag is set once)."""
    st, ctl = with_chief_in(state.RUNNING)
    with pytest.raises(IllegalTransition, match="chief:0: running -> starting"):
        beat(ctl, 0, "starting")
    assert st.nodes[0].state == state.RUNNING


# -- the mirror ------------------------------------------------------------------------------------------------------
def test_the_mirror_takes_any_state_ahead_and_keeps_a_newer_one():
    st = state.ClusterState("c1", "demo", ROLES)
    node = st.nodes[0]
    assert states.transition(node, state.RUNNING, why="snapshot", mirror=True)  # several transitions at once
    assert states.transition(node, state.FAILED, why="snapshot", mirror=True)
    assert not states.transition(node, state.RUNNING, why="an older snapshot", mirror=True)
    assert node.state == state.FAILED
    assert states.transition(st, state.C_RUNNING, why="the start is over")
    assert not states.transition(st, state.C_RESERVING, why="a snapshot taken before", mirror=True)
    assert st.state == state.C_RUNNING


def test_a_snapshot_older_than_the_notebooks_own_transition_does_not_take_it_back():
    """``RemoteController.set_running`` moves the mirror once the coordinator took it; a snapshot the poller asked
    for before then says reserving, and the mirror stays running."""
    coord, ctl = controller()
    stale = remote.ClusterSnapshot.from_dict(json.loads(json.dumps(
        snapshot.take(coord, snapshot.LogBook(2), [0, 0], [0, 0], [], 0).to_dict())))
    mirror_state, local = controller()
    local.set_running()
    snapshot.Mirror(mirror_state).apply(stale)
    assert mirror_state.state == state.C_RUNNING
    ctl.cancel("done")
    snapshot.Mirror(mirror_state).apply(snapshot.take(coord, snapshot.LogBook(2), [0, 0], [0, 0], [], 0))
    assert mirror_state.state == state.C_STOPPED  # then the coordinator's end


# -- the tables against the code --------------------------------------------------------------------------------------
def _beats():
    """A heartbeat moves a live node to what its supervisor says (all but back to starting)."""
    for live in LIVE:
        for said in ("starting", "running", "finished", "failed", "stopped"):
            if live == state.RUNNING and said == "starting":
                continue
            st, ctl = with_chief_in(live)
            assert beat(ctl, 0, said, error="ValueError: x" if said == "failed" else None).ok
            assert st.nodes[0].state == said


def _ticks():
    """A silent node fails at the tick (registered, starting or running; a pending one is waited for)."""
    for live in (state.REGISTERED, state.STARTING, state.RUNNING):
        st, ctl = with_chief_in(live)
        st.clock.t += 11
        ctl.tick()
        assert st.nodes[0].state == state.FAILED and st.state == state.C_FAILED


def _teardowns():
    """Live nodes are stopped when the teardown is over; the job ends finished or stopped, while it reserved or
    once it ran."""
    for live in LIVE:
        st, ctl = with_chief_in(live)
        assert ctl.finish(lambda nodes: False) == state.C_STOPPED and st.nodes[0].state == state.STOPPED
    st, ctl = controller()
    for i in (0, 1):
        assert beat(ctl, i, "finished").ok  # done before the start said it was over
    assert ctl.finish(lambda nodes: True) == state.C_FINISHED
    st, ctl = controller()
    ctl.set_running()
    assert ctl.finish(lambda nodes: True) == state.C_FINISHED


def _the_job_ends():
    """Cancelled or failed while it reserves or once it runs; it runs once every node does."""
    for ran in (False, True):
        st, ctl = controller()
        if ran:
            for i in (0, 1):
                register(ctl, i)
            for i in (0, 1):
                assert beat(ctl, i, "running").ok
            assert st.state == state.C_RUNNING
        ctl.cancel("■")
        assert st.state == state.C_STOPPED
        st, ctl = controller()
        if ran:
            ctl.set_running()
        ctl.fail("the notebook was lost")
        assert st.state == state.C_FAILED


def _input_ran_out():
    """A node whose input ran out before its peer's fails (it ran, or its function returned meanwhile)."""
    for end in (state.RUNNING, state.FINISHED):
        c = FedPair()
        c.ctl.end_epoch(1)
        c.beat(0, "waiting for data", 0.0, past=[2, 64])
        if end == state.FINISHED:
            assert beat(c.ctl, 0, "finished").ok
        c.beat(1, "training", 0.0)
        c.now = AHEAD_S + 0.5
        c.beat(1, "training", AHEAD_S + 0.5)
        c.at(AHEAD_S + 0.5)
        assert c.st.nodes[0].state == state.FAILED


def _parallel_runs():
    """A run starts at its registration; its Spark task's outcome is the last word, also on a run the teardown
    stopped first (Spark Connect's order) or one whose function returned; a run that never started fails."""
    def runs():
        return controller([("run", 0), ("run", 1)], RunController, RunsState("r", "runs", 2, None, None, None))

    st, ctl = runs()
    register(ctl, 0)
    assert st.nodes[0].state == state.STARTING and st.state == state.C_RUNNING
    ctl.finish(lambda nodes: False)
    ctl.record_outcome(0, {"ok": True}, {"loss": 1.0})
    ctl.record_outcome(1, {"ok": False, "error": "no result came back"}, None)
    assert [n.state for n in st.nodes] == [state.FINISHED, state.FAILED]  # from stopped
    st, ctl = runs()
    assert beat(ctl, 0, "finished").ok
    ctl.record_outcome(0, {"ok": False, "error": "its value did not pickle"}, None)
    ctl.record_outcome(1, {"ok": False, "error": "no result came back"}, None)
    assert [n.state for n in st.nodes] == [state.FAILED, state.FAILED]  # from finished, from pending


PATHS: list[Callable[[], None]] = [_beats, _ticks, _teardowns, _the_job_ends, _input_ran_out, _parallel_runs]


def _listed(kind, table):
    # (kind, from, to) in plain strings: a node's and a cluster's "failed" are equal strings
    return {(kind, str(a), str(b)) for a, tos in table.items() for b in tos}


def test_the_code_makes_every_transition_the_tables_allow_and_no_other(monkeypatch):
    made: set[tuple[str, str, str]] = set()
    transition = states.transition

    def recorded(record, to, *, why, mirror=False):
        before = getattr(record, "state", None)
        changed = transition(record, to, why=why, mirror=mirror)
        if changed and before is not None:
            made.add((type(to).__name__, str(before), str(to)))
        return changed

    monkeypatch.setattr(states, "transition", recorded)
    for path in PATHS:
        path()
    assert sorted(made) == sorted(_listed("Node", NODE_TRANSITIONS) | _listed("Cluster", CLUSTER_TRANSITIONS))


# -- one writer --------------------------------------------------------------------------------------------------------
#: what a state's value is spelt as in the source: a member or an alias in state.py
STATE_NAMES = {s.name for s in (*states.Node, *states.Cluster)} | {f"C_{s.name}" for s in states.Cluster}
HOLDERS = ("NodeRecord", "ClusterState")  # the classes whose ``state`` is a state (and their subclasses)


def _names_a_state(value: ast.expr) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
               or isinstance(n, ast.Attribute) and n.attr in STATE_NAMES
               or isinstance(n, ast.Name) and n.id in STATE_NAMES for n in ast.walk(value))


def state_writes(source: str) -> list[int]:
    """Lines that write a ``.state`` other than :func:`states.transition`: an assignment to ``x.state`` (a tuple's
    part too) or ``setattr(x, "state", ...)``.  ``self.state = ...`` in an ``__init__`` binds the ClusterState an
    object works on (a controller, a job, the mirror) unless its class holds a state or the value names one."""
    lines: list[int] = []

    def visit(node: ast.AST, cls: ast.ClassDef | None, func: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            cls, func = node, None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while any(isinstance(t, (ast.Tuple, ast.List, ast.Starred)) for t in targets):
            targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else
                                                    [t.value] if isinstance(t, ast.Starred) else [t])]
        for t in targets:
            if not (isinstance(t, ast.Attribute) and t.attr == "state"):
                continue
            holder = cls is not None and (cls.name in HOLDERS or any(
                isinstance(b, (ast.Name, ast.Attribute)) and ast.unparse(b).split(".")[-1] in HOLDERS for b in cls.bases))
            binds = (func == "__init__" and isinstance(t.value, ast.Name) and t.value.id == "self" and not holder
                     and isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
                     and not _names_a_state(node.value))
            if not binds:
                lines.append(t.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "state":
            lines.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, cls, func)

    visit(ast.parse(source), None, None)
    return sorted(lines)


def test_the_writes_check_finds_every_kind_of_write():
    source = '''
class Controller:
    def __init__(self, state):
        self.state = state
        self.other.state = state
    def fail(self, n, st):
        n.state = "failed"
        n.state, n.failed_at = FAILED, 1
        st.state = cluster_state.C_FAILED
        setattr(n, "state", "x")
class Job:
    def __init__(self, job):
        self.state = job.state
        self.state = cluster_state.C_RUNNING
class RunsState(state.ClusterState):
    def __init__(self):
        self.state = make()
'''
    assert state_writes(source) == [5, 7, 8, 9, 10, 14, 17]


def test_no_module_but_the_state_machine_writes_a_state():
    found = {p.relative_to(PACKAGE.parent).as_posix(): state_writes(p.read_text())
             for p in sorted(PACKAGE.rglob("*.py")) if p != MACHINE}
    assert {path: lines for path, lines in found.items() if lines} == {}, "write it with states.transition"
    assert state_writes(MACHINE.read_text()) != []  # the check sees the one writer
