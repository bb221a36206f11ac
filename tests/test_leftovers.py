"""Nothing a node keeps on disk outlives it (issue 67, finding 4): its named sets and deterministic mode's early
partitions live in a private temporary folder its owner removes once it saw the node process end, however it
ended; a folder left by an owner that was itself killed is swept by the next start on the host.

Real node processes (``python -m tfos_nb.runtime node``, no TensorFlow: their function sleeps) fed over real data
connections, real owners (one in a separate process, killed with SIGKILL), and a folder made by uid ``nobody``.
Every folder lives under a temporary directory of the test's own, sticky and writable by all like ``/tmp``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import cloudpickle
import pytest

from tests.conftest import wait_until
from tests.server_abuse import SECRET, as_nobody, as_nobody_wait, writable_by_all
from tests.test_child_owner import SECRET as CONTROL_SECRET
from tests.test_child_owner import Driver, _gone
from tests.test_feed_turns import send_after
from tfos_nb.runtime.batches import columns
from tfos_nb.runtime.determinism import turns as feed_turns
from tfos_nb.runtime.executor.process.launch import child_env
from tfos_nb.runtime.executor.process.owner import ChildOwner
from tfos_nb.runtime.protocol import dataplane, messages
from tfos_nb.runtime.protocol.channel import ControlClient

SOURCE = '''
import time

def waits(args, ctx):
    time.sleep(600)
'''
FUNCS: dict = {"__name__": "tfos_test_leftover_functions"}
exec(compile(SOURCE, "<leftovers>", "exec"), FUNCS)  # pickled by value: the module is not importable in the child

# An owner in a process of its own: it starts a fed node and writes the node's pid, then waits to be killed.
OWNER = f'''
import os, sys, time
import cloudpickle
from tfos_nb.runtime.executor.process.launch import child_env
from tfos_nb.runtime.executor.process.owner import ChildOwner
from tfos_nb.runtime.protocol import messages
from tfos_nb.runtime.protocol.channel import ControlClient
{SOURCE}
base, host, port, pidfile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
owner = ChildOwner(ControlClient(messages.Codec(bytes.fromhex("{CONTROL_SECRET.hex()}"), "c1", "node1"), (host, port)),
                   1, "worker:1", hb_interval=0.05, driver_timeout=10)
meta = messages.LaunchMeta(cluster_id="c1", secret="{CONTROL_SECRET.hex()}", control=[host, port], hb_interval=0.05,
                           driver_timeout=10, env={{}}, keras="tf_keras", default_fs="file:///", driver_pid=os.getppid())
env = dict(child_env(meta), TMPDIR=base)
info = {{"node": 1, "job_name": "worker", "task_index": 1, "cluster_spec": {{"worker": ["127.0.0.1:1"] * 2}},
        "feed": True, "secret": "{SECRET.hex()}", "host": "127.0.0.1", "cluster_id": "c1"}}
owner.start("node", "c1", env, cloudpickle.dumps((waits, {{}})), info)
while not owner.running:
    owner.wake.wait(0.1)
with open(pidfile, "w") as f:
    f.write(str(owner.child.pid))
time.sleep(600)
'''


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.server.stop()


@pytest.fixture
def base():
    """A temporary directory like /tmp: sticky, every user may make folders in it."""
    with writable_by_all(0o1777) as d:
        yield d


def _node(driver: Driver, base, index: int = 0) -> ChildOwner:
    """A fed node process under an owner in this process, its TMPDIR's parent ``base``, running its function."""
    assert driver.server.address is not None
    client = ControlClient(messages.Codec(CONTROL_SECRET, "c1", f"node{index}"), driver.server.address, timeout=2)
    owner = ChildOwner(client, index, f"worker:{index}", hb_interval=0.05, driver_timeout=10)
    meta = messages.LaunchMeta(cluster_id="c1", secret=CONTROL_SECRET.hex(), control=list(driver.server.address),
                               hb_interval=0.05, driver_timeout=10, env={}, keras="tf_keras", default_fs="file:///",
                               driver_pid=os.getpid())
    env = dict(child_env(meta), TMPDIR=str(base))
    env[feed_turns.ENV_HOLD_MB] = "0"  # deterministic mode's early partitions go to disk at once
    info = {"node": index, "job_name": "worker", "task_index": index, "cluster_spec": {"worker": ["127.0.0.1:1"]},
            "feed": True, "secret": SECRET.hex(), "host": "127.0.0.1", "cluster_id": "c1"}
    owner.start("node", "c1", env, cloudpickle.dumps((FUNCS["waits"], {})), info)
    wait_until(lambda: owner.running and owner.data_port, timeout=60, what="the node process to start",
               proc=owner.child)
    return owner


def _supervise(owner: ChildOwner) -> tuple[str, int | None]:
    """What a node's supervisor does with its node process (``Supervisor.run``): supervise it, then end it."""
    try:
        return owner.supervise()
    finally:
        owner.kill(grace=1)


def _rows_on_disk(base) -> list[str]:
    """The Arrow files under ``base``: a named set's partitions (``.arrow``), spilled partitions (``.arrows``)."""
    return sorted(os.path.relpath(os.path.join(d, f), base) for d, _, files in os.walk(base) for f in files
                  if f.endswith((".arrow", ".arrows")))


def _send_set(port: int, rows: list[tuple[float, int]]) -> tuple[dataplane.Kind, dict]:
    """A feeder of partition 0 of the named set 'validation' (version 1)."""
    header = {"partition": 0, "gen": 1, "mode": "train", "feed": "validation"}
    sock = dataplane.client_connect("127.0.0.1", port, SECRET, header, 10)
    dataplane.send_frame(sock, dataplane.Kind.DATA, columns.encode_ipc(columns.rows_to_batch(rows)))
    dataplane.send_frame(sock, dataplane.Kind.END)
    kind, payload = dataplane.recv_frame(sock)
    sock.close()
    return kind, dataplane.parse_json(payload)


def test_a_node_killed_by_sigkill_leaves_no_rows_on_disk_once_its_owner_saw_it_end(driver, base):
    """A node holds a validation set's partition and an early partition of deterministic mode on disk, and is
    killed with SIGKILL (a retried attempt's end): once its owner saw it end, neither file nor folder is left."""
    owner = _node(driver, base)
    try:
        assert _send_set(owner.data_port, [(1.0, i) for i in range(50)])[0] is dataplane.Kind.DONE
        # partition 2 of epoch 1 is read after partition 0, which has not come: kept aside, past a budget of 0 bytes
        assert send_after(owner.data_port, [(2.0, i) for i in range(50)], 2, 0)[0] is dataplane.Kind.DONE
        kept = _rows_on_disk(base)
        assert [p for p in kept if p.endswith(".arrow")] and [p for p in kept if p.endswith(".arrows")], kept
        assert owner.child is not None
        os.kill(owner.child.pid, signal.SIGKILL)
    finally:
        outcome, code = _supervise(owner)
    assert outcome == "failed" and code == -signal.SIGKILL
    assert _rows_on_disk(base) == []
    assert os.listdir(base) == []


def test_the_next_start_sweeps_what_a_killed_owner_left_and_nothing_else(driver, base, tmp_path):
    """An owner killed with SIGKILL (its node then ends itself) leaves its node's folder: the next node started on
    the host removes it.  A live owner's folder, another user's folder and a link named like a left folder stay."""
    as_nobody()
    live = _node(driver, base, index=0)
    try:
        before = set(os.listdir(base))
        pidfile = tmp_path / "node.pid"
        assert driver.server.address is not None
        host, port = driver.server.address
        killed = subprocess.Popen([sys.executable, "-c", OWNER, str(base), host, str(port), str(pidfile)])
        try:
            wait_until(lambda: pidfile.exists() and pidfile.read_text(), timeout=60, what="the other owner's node",
                       proc=killed)
        finally:
            killed.kill()
            killed.wait(timeout=10)
        node_pid = int(pidfile.read_text())
        assert wait_until(lambda: _gone(node_pid), timeout=10), "the node outlived its owner"
        left = set(os.listdir(base)) - before
        assert left, "the killed owner's node left nothing to sweep"

        def others_folder() -> None:  # as nobody: a folder named as ours would be, its lock file free
            os.mkdir(os.path.join(base, "tfos_nb-child-nobody"), 0o700)
            for name in (".owner.lock", "rows.arrow"):
                os.close(os.open(os.path.join(base, "tfos_nb-child-nobody", name), os.O_WRONLY | os.O_CREAT, 0o600))

        as_nobody_wait(others_folder)
        target = tmp_path / "elsewhere"
        target.mkdir()
        for name in (".owner.lock", "rows.arrow"):
            (target / name).write_text("")
        os.symlink(target, base / "tfos_nb-child-link")

        nxt = _node(driver, base, index=1)  # its start sweeps
        try:
            assert not left & set(os.listdir(base)), "what the killed owner left is still there"
            assert before <= set(os.listdir(base)), "a live owner's folder was removed"
            assert sorted(os.listdir(base / "tfos_nb-child-nobody")) == [".owner.lock", "rows.arrow"]
            assert os.path.islink(base / "tfos_nb-child-link") and sorted(os.listdir(target)) == [".owner.lock",
                                                                                                    "rows.arrow"]
        finally:
            nxt.kill(grace=1)
    finally:
        live.kill(grace=1)
    assert sorted(os.listdir(base)) == ["tfos_nb-child-link", "tfos_nb-child-nobody"]

