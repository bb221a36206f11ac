"""The live view, fast tier: a node's phases seen from real threads' frames, the stall flag through the real
controller, stack dumps asked for and answered over heartbeats, the Spark Connect mirror, the panel, the magic."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import threading
import types

import pytest

from tests.conftest import ipython_with_tfos_nb, wait_until
from tests.panel_fakes import FakeDisplay
from tfos_nb.runtime.driver.connect import snapshot
from tfos_nb.runtime.driver.control import stacks, state
from tfos_nb.runtime.driver.control.controller import new_cluster
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.executor.process import phases
from tfos_nb.runtime.protocol import messages, pipes, remote
from tfos_nb.widgets import make_renderer, panel_html, panel_model, text_line
from tfos_nb.widgets._view import state_key


# -- the node process's phases, from a real thread's frames ------------------------------------------
class Gates:
    """Events a fake library's code waits on, so that the test decides when each call returns."""

    def __init__(self, names: list[str]) -> None:
        self.events = {n: threading.Event() for n in names}

    def wait(self, name: str) -> None:
        assert self.events[name].wait(30), f"gate {name} never opened"


def _load(path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_libraries(root) -> dict[str, types.ModuleType]:
    """Code that lives where TensorFlow's and Keras' does (by path), each call waiting on a gate."""
    files = {
        "tensorflow/fake_tf_import.py": "import _tfos_gates\n_tfos_gates.wait('import')\n",
        "tensorflow/python/distribute/collective_all_reduce_strategy.py":
            "import _tfos_gates\nclass CollectiveAllReduceStrategy:\n"
            "    def __init__(self):\n        _tfos_gates.wait('strategy')\n",
        "tf_keras/src/engine/training.py": "import _tfos_gates\ndef fit(step):\n    _tfos_gates.wait(step)\n",
        "keras/src/saving/saving_api.py": "import _tfos_gates\ndef save():\n    _tfos_gates.wait('save')\n",
    }
    for rel, code in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return {
        "strategy": _load(root / files_key(files, "strategy"), "fake_strategy"),
        "training": _load(root / files_key(files, "training"), "fake_training"),
        "saving": _load(root / files_key(files, "saving"), "fake_saving"),
    }


def files_key(files: dict[str, str], part: str) -> str:
    return next(k for k in files if part in k)


def test_watcher_follows_a_real_thread_through_the_phases(tmp_path, monkeypatch):
    gates = Gates(["import", "strategy", "first", "later", "save", "data"])
    monkeypatch.setitem(sys.modules, "_tfos_gates", gates)
    libs = fake_libraries(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "tensorflow"))
    sent: list[tuple[str, float]] = []
    hub = FeedHub()
    ready = threading.Event()

    def node_function() -> None:
        ready.wait()
        import fake_tf_import  # noqa: F401 - imports "TensorFlow"

        libs["strategy"].CollectiveAllReduceStrategy()
        libs["training"].fit("first")
        watcher.stepped(1)
        libs["training"].fit("later")
        libs["saving"].save()
        gates.wait("data")
        hub.take(10, True)  # no data comes: it waits until the hub closes

    thread = threading.Thread(target=node_function, name="node-function")
    thread.start()
    watcher = phases.PhaseWatcher(lambda phase, moved, where: sent.append((phase, moved)), sample_s=0.05,
                             thread=thread.ident)
    watcher.function_runs()
    watcher.start()
    try:
        ready.set()
        for phase, gate in [(phases.IMPORTING, "import"), (phases.STRATEGY, "strategy"), (phases.FIRST_STEP, "first"),
                            (phases.TRAINING, "later"), (phases.EXPORTING, "save"), (phases.TRAINING, "data")]:
            wait_until(lambda phase=phase: watcher.phase == phase, 10, 0.02, what=f"phase {phase}")
            assert sent[-1][0] == phase  # sent as soon as it changed
            gates.events[gate].set()
        wait_until(lambda: watcher.phase == phases.WAITING_FOR_DATA, 10, 0.02, what="waiting for data")
    finally:
        for event in gates.events.values():
            event.set()
        hub.close()
        thread.join(10)
        sys.modules.pop("fake_tf_import", None)
        watcher.set(phases.FINISHING)
        watcher.stop()
    seen = [phase for phase, _ in sent]
    expected = [phases.RUNNING, phases.IMPORTING, phases.STRATEGY, phases.FIRST_STEP, phases.TRAINING, phases.EXPORTING,
                phases.WAITING_FOR_DATA, phases.FINISHING]
    rest = iter(seen)
    assert all(phase in rest for phase in expected), seen  # in this order (other phases may come between)


def test_training_is_reported_when_it_begins_not_at_the_next_sample():
    """A node whose training is shorter than a sampling interval still shows it trained (the CI run saw a chief
    go from "first step" to "finishing" with no "training" between)."""
    sent: list[str] = []
    watcher = phases.PhaseWatcher(lambda phase, moved, where: sent.append(phase), sample_s=3600)  # no sampling thread
    watcher.function_runs()
    watcher.stepped(0)  # Keras' step 0: training has not begun
    assert sent == [phases.RUNNING]
    watcher.stepped(1)
    watcher.stepped(2)
    watcher.set(phases.FINISHING)
    assert sent == [phases.RUNNING, phases.TRAINING, phases.FINISHING]


def test_a_sample_keeps_no_other_thread_s_data_alive():
    """A sample must not keep the stacks it looked at: every thread's frame stayed alive in a reference cycle until
    Python's cyclic collector ran, with its last locals once the thread ended (a feeding connection's last received
    batch), so a 1M-row node held 30-40 received frames (~100 MB) beyond its queue (B5)."""
    import gc
    import weakref

    class Batch:  # stands for a received frame in a feeding connection's locals
        pass

    gone = threading.Event()
    ready = threading.Event()
    refs: list[weakref.ref[Batch]] = []

    def reader() -> None:
        batch = Batch()
        refs.append(weakref.ref(batch))
        ready.set()
        gone.wait(60)  # blocked, as a connection waiting for room in the queue; then it ends with batch a local

    watcher = phases.PhaseWatcher(lambda phase, moved, where: None, sample_s=3600)  # no sampling thread: samples by hand
    thread = threading.Thread(target=reader)
    gc.disable()
    try:
        thread.start()
        assert ready.wait(60)
        watcher.sample()
        gone.set()
        thread.join(60)
        assert refs[0]() is None, "the sample's frames keep the thread's locals alive until the cyclic collector runs"
    finally:
        gone.set()
        gc.enable()


def test_classify_by_the_outermost_library_call():
    tf = "/site/tensorflow/python/eager/execute.py"
    fit = ("/site/tf_keras/src/engine/training.py", "fit")
    user = ("/work/train.py", "main_fun")
    assert phases.classify([user], stepped=False) == phases.RUNNING
    assert phases.classify([user, fit, (tf, "quick_execute")], stepped=False) == phases.FIRST_STEP
    assert phases.classify([user, fit, (tf, "quick_execute")], stepped=True) == phases.TRAINING
    assert phases.classify([user, ("<frozen importlib._bootstrap>", "_find_and_load"),
                       ("/site/tensorflow/__init__.py", "<module>")], stepped=False) == phases.IMPORTING
    assert phases.classify([user, ("<frozen importlib._bootstrap>", "_find_and_load"),
                       ("/site/numpy/__init__.py", "<module>")], stepped=False) == phases.RUNNING
    run = ("/site/tensorflow/python/distribute/distribute_lib.py", "run")
    assert phases.classify([user, run, (tf, "quick_execute")], stepped=False) == phases.FIRST_STEP
    assert phases.rank(phases.STRATEGY) > phases.rank(phases.RUNNING) and phases.rank(phases.WAITING_FOR_DATA) is None


def test_where_names_the_user_code_a_library_called_and_nothing_inside_the_library(tmp_path):
    """A Keras callback that sleeps is named (its function, file and line); a thread blocked inside TensorFlow's own
    code is not (the phase says where it is)."""
    keras_fit = tmp_path / "keras" / "src" / "trainers" / "fake_fit.py"
    keras_fit.parent.mkdir(parents=True)
    keras_fit.write_text("import threading\n"
                         "def fit(callback):\n    callback()\n"
                         "def step(gate):\n    gate.wait(30)\n")
    fake_fit = _load(keras_fit, "fake_keras_fit")
    gate = threading.Event()
    sent: list[str] = []

    def on_epoch_end() -> None:
        gate.wait(30)  # the user's callback waits (a sleep, a lock): stdlib frames under it are not its place

    for target, expected in [(lambda: fake_fit.fit(on_epoch_end), "on_epoch_end (test_live_view.py:"),
                             (lambda: fake_fit.step(gate), "")]:
        gate.clear()
        thread = threading.Thread(target=target)
        thread.start()
        try:
            watcher = phases.PhaseWatcher(lambda phase, moved, where: sent.append(where), sample_s=3600, thread=thread.ident)
            watcher.function_runs()
            wait_until(lambda: (f := sys._current_frames().get(thread.ident)) is not None and f.f_code.co_name == "wait"
                       and f.f_code.co_filename == threading.__file__, 10, 0.01, what="the thread waits in threading")
            watcher.sample()
            assert sent[-1].startswith(expected) if expected else sent[-1] == "", sent
            assert sent[-1].endswith(")") or not expected
        finally:
            gate.set()
            thread.join(10)


def test_phase_frame_on_the_report_pipe():
    frame = pipes.Phase(phase=phases.STRATEGY, moved_at=12.5, where="on_epoch_end (cell.py:12)", stacks=True)
    assert pipes.decode(pipes.encode(frame)) == frame


# -- the stall flag, through the real controller --------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def started_cluster(roles, stall_after=3.0):
    """A controller whose nodes registered and got their spec (real messages, a clock the test moves)."""
    ctl = new_cluster(roles, {}, JobOptions(name="stuck", num_gpus=0, heartbeat_timeout=60, stall_after=stall_after),
                      input_mode_spark=False, tensorboard=False, log_dir=None)
    clock = Clock()
    ctl.state.clock = ctl.clock = clock
    ctl.state._t0 = clock.t
    for i in range(len(roles)):
        assert ctl.handle(messages.Register(node=i, host="127.0.0.1", port=4000 + i, executor_id=str(i), pid=1)).ok
    for i in range(len(roles)):
        assert ctl.handle(messages.AwaitSpec(node=i)).ok
    return ctl, clock


def beat(ctl, node: int, phase: str, still: float = 0.0, **kw) -> messages.BeatCommand:
    reply = ctl.handle(messages.Heartbeat(node=node, state="running", phase={"phase": phase, "still_s": still}, **kw))
    assert reply.ok, reply.error
    return messages.BeatCommand.from_dict(reply.body)


def test_stall_names_the_phase_and_the_node_that_has_not_reached_it():
    ctl, clock = started_cluster([("ps", 0), ("chief", 0), ("worker", 0), ("worker", 1)])
    beat(ctl, 0, phases.RUNNING)
    beat(ctl, 1, phases.STRATEGY)
    beat(ctl, 2, phases.STRATEGY)
    beat(ctl, 3, phases.RUNNING, still=1.0)
    clock.t += 1.9
    assert ctl.state.snapshot().stalls == ()
    clock.t += 0.2
    view = ctl.state.snapshot()
    assert view.stalls == ("worker:1: no step for 3 s, in the node function",)
    clock.t += 1.0
    view = ctl.state.snapshot()
    expected = ("chief:0: no step for 3 s, building the strategy (its first collective) — "
                "worker:1 (running the node function) has not reached it")
    assert view.stalls[0] == expected
    assert view.nodes[1].stall == expected and view.nodes[1].phase == phases.STRATEGY
    assert view.nodes[0].stall is None  # ps nodes serve (server.join()): never flagged
    beat(ctl, 3, phases.STRATEGY)
    beat(ctl, 1, phases.TRAINING)  # it moved
    view = ctl.state.snapshot()
    assert [n.label for n in view.nodes if n.stall] == ["worker:0"]
    assert "has not reached" not in view.nodes[2].stall


def fed_cluster(stall_after=3.0):
    """A fed (InputMode.SPARK) chief and worker, both serving their feed."""
    ctl = new_cluster([("chief", 0), ("worker", 0)], {},
                      JobOptions(name="fed", num_gpus=0, heartbeat_timeout=60, stall_after=stall_after),
                      input_mode_spark=True, tensorboard=False, log_dir=None)
    clock = Clock()
    ctl.state.clock = ctl.clock = clock
    ctl.state._t0 = clock.t
    for i in range(2):
        assert ctl.handle(messages.Register(node=i, host="127.0.0.1", port=4000 + i, executor_id=str(i), pid=1)).ok
    for i in range(2):
        assert ctl.handle(messages.AwaitSpec(node=i)).ok
        beat(ctl, i, phases.RUNNING, data_port=5000 + i)
    ctl.set_running()
    return ctl, clock


def assign(ctl, partition: int, executor: str) -> int:
    reply = ctl.handle(messages.FeedAssign(partition=partition, gen=1, host="127.0.0.1", executor_id=executor, mode="train"))
    assert reply.ok, reply.error
    return int(reply.body["node"])


def test_stall_says_which_feeding_task_waits_for_which_node():
    """Who waits for whom on the data path: a node that waits for data names the feeding task open to it (a feeder
    stalled mid-partition); a node that sits in its own code while a feeding task is open to it is named with its
    place in that code and the task that waits for it (a callback that sleeps: it stops reading)."""
    ctl, clock = fed_cluster()
    ctl.open_epoch()
    to_chief = assign(ctl, 2, "0")  # a partition goes to the node on its own executor when it can
    to_worker = assign(ctl, 3, "1")
    assert (to_chief, to_worker) == (0, 1)
    clock.t += 5
    beat(ctl, 0, phases.WAITING_FOR_DATA, still=4.0)
    ctl.handle(messages.Heartbeat(node=1, state="running",
                           phase={"phase": phases.TRAINING, "still_s": 4.0, "where": "on_epoch_end (cell.py:12)"}))
    view = ctl.state.snapshot()
    assert view.stalls == (
        "chief:0: no step for 4 s, waiting for data — it waits for the feeding task of partition 2 (executor 0, open 5 s)",
        "worker:0: no step for 4 s, training, in on_epoch_end (cell.py:12) — the feeding task of partition 3 "
        "(executor 1, open 5 s) waits for it to take rows")
    assert view.nodes[1].where == "on_epoch_end (cell.py:12)"
    # the feeding task of partition 2 ends: nothing sends to the chief, and the flag says so
    assert ctl.handle(messages.FeedRelease(partition=2, gen=1, node=0, rows=10)).ok
    assert ctl.state.snapshot().stalls[0] == ("chief:0: no step for 4 s, waiting for data — no feeding task is connected "
                                              "to it; the epoch waits for partition 3 at worker:0")
    assert ctl.handle(messages.FeedRelease(partition=3, gen=1, node=1, rows=10)).ok
    assert ctl.state.snapshot().stalls[0] == "chief:0: no step for 4 s, waiting for data — no feeding task is connected to it now"
    # once Spark says the epoch's stage has 6 tasks, the partitions whose task never asked for a node are named
    ctl.set_feed_tasks(1, 6)
    assert ctl.state.snapshot().stalls[0] == (
        "chief:0: no step for 4 s, waiting for data — no feeding task is connected to it; partitions 0, 1, 4, 5 reached "
        "no node yet (a Spark task waiting for a slot, or computing its first rows)")
    # the Spark Connect mirror carries the place and the open feeding tasks, and flags the same
    data = snapshot.take(ctl.state, snapshot.LogBook(2), [0, 0], [0, 0], [], 0)
    mirror_state = state.ClusterState("c", "mirror", [("chief", 0), ("worker", 0)])
    mirror_state.stall_after = 3.0
    snapshot.Mirror(mirror_state).apply(remote.ClusterSnapshot.from_dict(data.to_dict()))
    assert mirror_state.snapshot().stalls == ctl.state.snapshot().stalls


def test_phases_the_driver_knows_before_the_node_process_runs():
    ctl = new_cluster([("chief", 0), ("worker", 0)], {},
                      JobOptions(name="forming", num_gpus=0, heartbeat_timeout=60, stall_after=2),
                      input_mode_spark=False, tensorboard=False, log_dir=None)
    clock = Clock()
    ctl.state.clock = ctl.clock = clock
    ctl.state._t0 = clock.t
    assert [n.phase for n in ctl.state.snapshot().nodes] == [phases.REGISTERING, phases.REGISTERING]
    assert ctl.handle(messages.Register(node=0, host="127.0.0.1", port=4000, executor_id="0", pid=1)).ok
    clock.t += 2.5
    view = ctl.state.snapshot()
    assert [n.phase for n in view.nodes] == [phases.WAITING_FOR_SPEC, phases.REGISTERING]
    assert view.stalls == (
        "chief:0: no step for 2 s, waiting for the cluster spec — worker:0 (registering) has not reached it",
        "worker:0: no step for 2 s, still registering (its launch task has not started its supervisor)")


@pytest.mark.parametrize("bad", [-1, "2", True])
def test_stall_after_is_checked(bad):
    with pytest.raises(ValueError, match="stall_after must be a number of seconds"):
        JobOptions(stall_after=bad)


def test_no_stall_flag_when_off_or_ended():
    ctl, clock = started_cluster([("chief", 0)], stall_after=0)
    beat(ctl, 0, phases.STRATEGY)
    clock.t += 1000
    assert ctl.state.snapshot().stalls == ()
    ctl.state.stall_after = 5.0
    assert ctl.state.snapshot().stalls
    ctl.cancel("test")
    assert ctl.state.snapshot().stalls == ()


# -- stack dumps over heartbeats ------------------------------------------------------------------------
def test_stacks_are_asked_with_a_beat_reply_and_come_back_with_the_next_beat():
    ctl, _ = started_cluster([("chief", 0), ("worker", 0)])
    assert beat(ctl, 0, phases.RUNNING).stacks == 0
    got: dict[str, str] = {}
    asker = threading.Thread(target=lambda: got.update(stacks.collect(ctl.state, ctl, "worker:0", timeout=10)))
    asker.start()
    wanted = wait_until(lambda: beat(ctl, 1, phases.RUNNING).stacks, 5, 0.01, what="the ask")
    assert beat(ctl, 0, phases.RUNNING).stacks == 0  # only the node asked
    beat(ctl, 1, phases.RUNNING, stacks={"id": wanted, "text": 'File "train.py", line 7 in wait_for_release'})
    asker.join(10)
    assert got == {"worker:0": 'File "train.py", line 7 in wait_for_release'}
    with pytest.raises(KeyError, match="no node 'worker:5'"):
        stacks.collect(ctl.state, ctl, "worker:5")
    assert "did not answer within 0 s" in stacks.collect(ctl.state, ctl, "chief:0", timeout=0.01)["chief:0"]


def test_stacks_of_nodes_without_a_process_say_why():
    ctl = new_cluster([("chief", 0)], {}, JobOptions(num_gpus=0, heartbeat_timeout=60), input_mode_spark=False,
                      tensorboard=False, log_dir=None)
    assert stacks.collect(ctl.state, ctl) == {"chief:0": "(chief:0 has no process yet: registering)"}


def test_a_stall_line_names_a_few_of_the_hundreds_of_nodes_that_have_not_reached_it_and_counts_the_rest():
    from tfos_nb.runtime.driver.control.stalls import NAMED_BEHIND

    ctl, clock = started_cluster([("chief", 0)] + [("worker", i) for i in range(200)])
    beat(ctl, 0, phases.STRATEGY, still=5.0)
    for i in range(1, 201):
        beat(ctl, i, phases.IMPORTING)
    line = ctl.state.snapshot().stalls[0]
    named = ", ".join(f"worker:{i} (importing TensorFlow)" for i in range(NAMED_BEHIND))
    assert line.endswith(f"— {named} and {200 - NAMED_BEHIND} more have not reached it"), line


# -- Spark Connect: the mirror gets the phases, and flags stalls itself ---------------------------------
def test_connect_mirror_carries_phases_and_stalls():
    ctl, clock = started_cluster([("chief", 0), ("worker", 0)])
    beat(ctl, 0, phases.FIRST_STEP, still=4.0)
    beat(ctl, 1, phases.IMPORTING)
    data = snapshot.take(ctl.state, snapshot.LogBook(2), [0, 0], [0, 0], [], 0)
    mirror_state = state.ClusterState("c", "mirror", [("chief", 0), ("worker", 0)])
    mirror_state.stall_after = 3.0
    snapshot.Mirror(mirror_state).apply(data)
    view = mirror_state.snapshot()
    assert [n.phase for n in view.nodes] == [phases.FIRST_STEP, phases.IMPORTING]
    assert view.stalls == ("chief:0: no step for 4 s, in the first step (the first collective) — "
                           "worker:0 (importing TensorFlow) has not reached it",)


# -- the panel ---------------------------------------------------------------------------------------------
def stalled_view():
    ctl, clock = started_cluster([("chief", 0), ("worker", 0)])
    beat(ctl, 0, phases.STRATEGY, still=5.0)
    beat(ctl, 1, phases.RUNNING)
    return ctl.state.snapshot()


def test_panel_html_and_text_show_the_phase_and_the_stall():
    model = panel_model(stalled_view())
    html = panel_html(model)
    assert ">running</span> <span" in html and "building the strategy</span>" in html
    assert "&#9888; chief:0: no step for 5 s, building the strategy (its first collective) — worker:0 " in html
    line = text_line(model)
    assert "chief:0 running (building the strategy)" in line and "worker:0 running (running the node function)" in line
    assert "— STALLED: chief:0: no step for 5 s" in line
    quieter = dict(model, rows=[dict(r, phase=phases.TRAINING) for r in model["rows"]])
    assert state_key(quieter) != state_key(model)  # a new phase is a state change for the text back-end


def test_widget_panel_state_column_shows_the_phase(test_comm):
    r = make_renderer("widget", display=FakeDisplay())
    r.update(stalled_view())
    table = r.backend.panel.table.value
    assert "building the strategy</span>" in table and "running the node function</span>" in table
    assert "no step for 5 s" in table and "has not reached it" in table


# -- %tfos_stack: bad input is a UsageError ----------------------------------------------------------------
@pytest.fixture(scope="module")
def ip():
    return ipython_with_tfos_nb()


@pytest.mark.parametrize(("line", "message"), [
    ("", "the following arguments are required: name"),
    ("nosuch", "no cluster named nosuch"),
])
def test_tfos_stack_bad_input(ip, line, message):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("tfos_stack", line)


def test_tfos_stack_refuses_a_bad_node_and_a_cluster_not_running(ip):
    from IPython.core.error import UsageError

    from tfos_nb.magics import ClusterHandle
    from tfos_nb.runtime.driver.options import ClusterShape

    magics = ip.magics_manager.registry["TFOSMagics"]
    handle = ClusterHandle("idle", sc=None, fn=lambda a, c: None, args={}, shape=ClusterShape(1, chief="chief"))
    magics.handles["idle"] = handle
    try:
        with pytest.raises(UsageError, match="--node takes ROLE:INDEX, e.g. worker:1; got 'worker'"):
            ip.run_line_magic("tfos_stack", "idle --node worker")
        with pytest.raises(UsageError, match="cluster idle is .*: no node process to show"):
            ip.run_line_magic("tfos_stack", "idle")
    finally:
        del magics.handles["idle"]
    assert textwrap.dedent(magics.tfos_stack.__doc__ or "").strip()


# -- a node process frozen in C code (holding the GIL): its phase from a stack dump ----------------------
FROZEN_CHILD = """
import faulthandler, os, re, signal, sys
faulthandler.register(signal.SIGUSR2, file=int(sys.argv[1]), all_threads=True, chain=False)
sys.path.insert(0, sys.argv[2])
from tensorflow.python.distribute.collective_all_reduce_strategy import CollectiveAllReduceStrategy
CollectiveAllReduceStrategy()
"""
FROZEN_STRATEGY = """
import re, sys
class CollectiveAllReduceStrategy:
    def __init__(self):
        print("frozen", flush=True)
        re.match(r"(a+)+$", "a" * 40 + "b")  # C code that holds the GIL (as TensorFlow's first collective does)
"""


def test_a_process_frozen_in_c_code_is_read_from_its_stack_dump(tmp_path):
    import subprocess
    import tempfile
    import time

    from tfos_nb.runtime.executor.process.owner import ChildOwner

    strategy = tmp_path / "tensorflow" / "python" / "distribute" / "collective_all_reduce_strategy.py"
    strategy.parent.mkdir(parents=True)
    for folder in (strategy.parent, strategy.parent.parent, strategy.parent.parent.parent):
        (folder / "__init__.py").write_text("")
    strategy.write_text(FROZEN_STRATEGY)
    owner = ChildOwner(None, 0, "chief:0", 1.0, 60.0)  # type: ignore[arg-type] - no driver: no heartbeats here
    owner._stacks = tempfile.TemporaryFile()
    fd = owner._stacks.fileno()
    owner.child = subprocess.Popen([sys.executable, "-c", FROZEN_CHILD, str(fd), str(tmp_path)], pass_fds=(fd,),
                                   stdout=subprocess.PIPE, text=True, start_new_session=True)  # as ChildOwner starts it
    try:
        assert owner.child.stdout is not None and owner.child.stdout.readline() == "frozen\n"
        owner.stacks_ready = True
        owner.phase = {"phase": phases.IMPORTING, "moved_at": 12.5}  # the last frame its watcher could send
        owner.read_frozen_phase()
        assert owner.phase == {"phase": phases.IMPORTING, "moved_at": 12.5}  # not silent for long yet
        owner.phase_at = time.monotonic() - phases.FROZEN_S - 0.1
        owner.read_frozen_phase()
        assert owner.phase == {"phase": phases.STRATEGY, "moved_at": 12.5}, owner.phase  # it has not moved since
        assert owner.phases_seen == [phases.STRATEGY]
    finally:
        owner.kill(grace=0)
    assert owner.child.poll() is not None  # the child spinning in C is gone, not left to the rest of the run


def test_the_watcher_sends_even_when_nothing_moves():
    """Its owner tells a frozen process by its silence: a healthy, blocked one still sends every TICK_S."""
    sent: list[float] = []
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(30,), name="blocked")
    thread.start()
    watcher = phases.PhaseWatcher(lambda phase, moved, where: sent.append(moved), sample_s=0.05, thread=thread.ident)
    watcher.function_runs()
    watcher.start()
    try:
        wait_until(lambda: len(sent) >= 3, 5, 0.02, what="three frames")  # one a second (TICK_S)
        assert len(set(sent)) == 1  # the same moved_at: it did not move
    finally:
        release.set()
        watcher.stop()
        thread.join(10)


def test_dump_phase_takes_the_main_thread_of_a_real_faulthandler_dump(tmp_path, monkeypatch):
    import faulthandler

    gates = Gates(["strategy"])
    monkeypatch.setitem(sys.modules, "_tfos_gates", gates)
    libs = fake_libraries(tmp_path)
    node = threading.Thread(target=libs["strategy"].CollectiveAllReduceStrategy, name="node-function")
    node.start()
    try:
        wait_until(lambda: phases.classify(phases._frames(sys._current_frames()[node.ident]), False) == phases.STRATEGY, 10, 0.01,
                   what="the strategy's constructor")
        with open(tmp_path / "dump", "w+") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            text = f.read()
    finally:
        gates.events["strategy"].set()
        node.join(10)
    threads = phases.dump_threads(text)
    init = (str(tmp_path / "tensorflow/python/distribute/collective_all_reduce_strategy.py"), "__init__")
    node_frames = next(t for t in threads if init in t)
    assert node_frames[0][0].endswith("threading.py") and node_frames[-1][1] == "wait"  # outermost first
    # the main thread is the one threading did not start: here the test's, in no library call
    assert phases.dump_phase(text, phases.IMPORTING) == phases.RUNNING


def test_the_cell_handle_shows_the_stacks_while_its_cluster_starts_and_runs():
    """``handle.stacks()`` / ``%tfos_stack`` ask the attempt's cluster while it runs (and its start's job before
    ``run()`` returned), not only once its shutdown returned (real controller, job and TFCluster; no Spark)."""
    from tfos_nb.magics import ClusterHandle
    from tfos_nb.runtime.driver.cluster import InputMode, TFCluster
    from tfos_nb.runtime.driver.job import DriverJob
    from tfos_nb.runtime.driver.options import ClusterShape

    ctl, _ = started_cluster([("chief", 0)])
    beat(ctl, 0, phases.STRATEGY)
    up = threading.Event()

    def start(sc, fn, args, shape, options, **kwargs):
        job = DriverJob(None, ctl.state, ctl, nodes_outlive_jobs=True, linger_s=1.0, join_s=1.0)
        job.announce(log_callback=options.log_callback, on_state=options.on_state, on_start=options.on_start)
        assert up.wait(30)  # run() returns once the nodes run: until then the handle has only the job
        return TFCluster(job, {}, InputMode.TENSORFLOW, 1)

    def answer(text: str) -> dict[str, str]:
        got: dict[str, str] = {}
        asker = threading.Thread(target=lambda: got.update(handle.stacks("chief:0")))
        asker.start()
        wanted = wait_until(lambda: beat(ctl, 0, phases.STRATEGY).stacks, 5, 0.01, what="the ask")
        beat(ctl, 0, phases.STRATEGY, stacks={"id": wanted, "text": text})
        asker.join(10)
        return got

    handle = ClusterHandle("live", sc=None, fn=None, args=None, shape=ClusterShape(1, chief="chief"),
                           start_cluster=start, background=True)
    handle.start()
    try:
        wait_until(lambda: handle._starting is not None, 10, 0.01, what="the start")
        assert answer("in __init__ (starting)") == {"chief:0": "in __init__ (starting)"}
        up.set()
        wait_until(lambda: handle.cluster is not None, 10, 0.01, what="the cluster")
        assert answer("in __init__ (running)") == {"chief:0": "in __init__ (running)"}
        assert ctl.handle(messages.Heartbeat(node=0, state="finished", exit_code=0)).ok
        handle.wait(10)
    finally:
        up.set()
        handle.shutdown()
    assert handle.state == "finished", handle.error
    with pytest.raises(RuntimeError, match="cluster live is finished: no node process to show"):
        handle.stacks()
