"""Issue 67, finding 8: a node whose input runs out before its peers' under a synchronous strategy is named, with
its numbers, instead of a job that hangs until ``shutdown()``'s timeout.

The node's feed says when a read waits past the running ``train()``'s epochs, and how many rows of the last one it
read (``pipes.FeedPast``, carried by the heartbeat); the driver, once every row of those epochs was taken from the
feeds, fails that node when its peers sit in a step, unmoved, waiting for it in a collective.  The whole program on
a real cluster (MultiWorkerMirroredStrategy, ``fit`` asking more steps than fed) is in ``test_faults.py``.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from tests.conftest import wait_until
from tests.server_abuse import SECRET
from tests.test_feed import feed_in_thread
from tfos_nb.runtime.driver.control import state
from tfos_nb.runtime.driver.control.controller import Controller
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.executor.feed import plan as feed_plan
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.executor.feed.plan import AHEAD_S, FeedOutOfStep
from tfos_nb.runtime.executor.feed.server import DataServer
from tfos_nb.runtime.protocol import messages


@contextlib.contextmanager
def _fed_and_read(label: str, rows: int, **hub_args):
    """A node's feed hub of a train() of one epoch, its ``rows`` rows fed and read (as_dataset's first pass)."""
    hub = FeedHub(label=label, **hub_args)
    server = DataServer(hub, SECRET, "127.0.0.1").start()
    try:
        hub.set_plan(1, 1)
        t, _ = feed_in_thread(server.port, [(1.0, i) for i in range(rows)], gen=1, partition=0)
        assert sum(b.num_rows for _, b in hub.take(rows, True, [0])) == rows
        t.join(10)
        yield hub
    finally:
        hub.close()
        server.stop()


def test_a_read_past_the_fed_epochs_is_told_with_the_rows_the_node_read():
    told: list[tuple[int, int]] = []
    with _fed_and_read("worker:0", 5, on_past=lambda epoch, rows: told.append((epoch, rows))) as hub:
        hub.end_epoch(1)  # every row of the call was taken
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(hub.take(64, True, [0])))  # .repeat(): one more pass
        reader.start()
        assert wait_until(lambda: told, 10, interval=0.02), "no FeedPast"
        assert told == [(2, 5)]  # once, with the rows of epoch 1 it read
        hub.stop()
        reader.join(10)
        assert got == [[]]  # the stop ends it empty, as before


def test_a_read_past_the_fed_epochs_that_the_stop_ends_at_once_is_told_too():
    """The node ran out after shutdown's stop came (its peer took its rows into its pipeline, train() returned):
    its read ends at once, empty, and its peer still waits for it in a step: the driver must hear of it."""
    told: list[tuple[int, int]] = []
    with _fed_and_read("chief:0", 3, on_past=lambda epoch, rows: told.append((epoch, rows))) as hub:
        hub.end_epoch(1)
        hub.stop()
        assert hub.take(64, True, [0]) == []
        assert told == [(2, 3)]


def test_the_out_of_step_error_says_how_many_rows_the_node_read(monkeypatch):
    monkeypatch.setattr(feed_plan, "AHEAD_S", 0.0)
    with _fed_and_read("chief:0", 7) as hub:
        hub.epoch_assigned(1, 1)  # its share of epoch 1 was that one partition
        with pytest.raises(FeedOutOfStep) as info:  # epoch 1 still read elsewhere (not ended)
            hub.take(64, True, [0])
        assert "its input ran out before theirs: it had read all 7 rows fed to it in epoch 1 and asked for more" \
            in str(info.value)
        assert "repeats (.repeat()), or fit asks more steps (steps_per_epoch) than its rows hold" in str(info.value)


class Cluster:
    """A chief and a worker, fed, with the driver's controller on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.st = state.ClusterState("c1", "c1", [("chief", 0), ("worker", 0)])
        self.st.clock = lambda: self.now
        for i, n in enumerate(self.st.nodes):
            n.state, n.data_port, n.host = state.RUNNING, 4000 + i, "h"
        self.ctl = Controller(self.st, JobOptions(num_gpus=0, heartbeat_timeout=600), input_mode_spark=True,
                              tensorboard=False, log_dir=None)
        self.ctl.open_epoch(remaining=0)  # train(df, num_epochs=1)

    def beat(self, node: int, phase: str, still_s: float, past: list[int] | None = None) -> None:
        feed = {"past": past} if past else {}
        self.ctl.handle(messages.Heartbeat(node=node, state="running", feed=feed,
                                           phase={"phase": phase, "still_s": still_s}))

    def at(self, t: float) -> None:
        self.now = t
        self.ctl.tick()


def test_a_node_past_the_fed_epochs_while_its_peer_waits_in_a_step_is_named():
    """The chief read its 64 rows and asked for more (its dataset repeats); the worker took the rest of the epoch
    into its pipeline and waits in a step's collective for the chief.  Nothing moves again, not even after the
    stop (it only moves the chief to other collectives): the chief is named, with its numbers."""
    c = Cluster()
    c.ctl.end_epoch(1)
    c.beat(0, "waiting for data", 0.0, past=[2, 64])
    c.beat(1, "training", 0.0)
    c.at(AHEAD_S / 2)
    assert c.st.state != state.C_FAILED
    c.now = AHEAD_S + 0.5
    c.beat(1, "training", AHEAD_S + 0.5)  # the worker has not moved since
    c.at(AHEAD_S + 0.5)
    assert c.st.state == state.C_FAILED and c.st.kill_requested
    chief, worker = c.st.nodes
    assert chief.state == state.FAILED and worker.state == state.RUNNING
    assert chief.error.startswith("FeedOutOfStep: chief:0 read its feed out of step: it asked for epoch 2, and the "
                                  "job feeds 1 epochs; worker:0 took its rows of epoch 1 but is still in a step, "
                                  "waiting for chief:0 to step with it; its input ran out before theirs: it had "
                                  "read all 64 rows fed to it in epoch 1 and asked for more."), chief.error


@pytest.mark.parametrize("case", ["all past", "peer moves", "epoch still read"])
def test_reads_past_the_fed_epochs_in_step_or_while_peers_move_are_not_named(case):
    """Every node asking for one more epoch together (``fit(epochs=E + 1)``) waits for the next train() or the
    stop, as before; a peer that still steps may yet reach its end; while the last epoch is still read somewhere,
    the node's own feed names a node that read ahead (``FeedHub._ahead``), not the driver."""
    c = Cluster()
    if case != "epoch still read":
        c.ctl.end_epoch(1)
    c.beat(0, "waiting for data", 0.0, past=[2, 64])
    if case == "all past":
        c.beat(1, "waiting for data", 0.0, past=[2, 256])
    for t in (AHEAD_S / 2, AHEAD_S + 1, 3 * AHEAD_S):
        c.now = t
        if case == "peer moves":
            c.beat(1, "training", 0.2)
        elif case == "epoch still read":
            c.beat(1, "training", t)
        c.at(t)
    assert c.st.state != state.C_FAILED, [n.error for n in c.st.nodes]
