"""Issue 41, item 1, on the data plane: nodes know which epochs the running ``train()`` feeds, and a bounded read
past them while the last is still being read is out of step (``FeedOutOfStep``, naming the node) instead of a
silent wait.  The whole job on a real cluster is ``test_out_of_step.py``."""

from __future__ import annotations

import pytest

from tests.server_abuse import SECRET
from tests.test_feed import feed_in_thread
from tfos_nb.runtime.executor import feed_hub
from tfos_nb.runtime.executor.data_server import DataServer
from tfos_nb.runtime.executor.feed_hub import FeedHub, FeedOutOfStep


@pytest.fixture
def chief():
    hub = FeedHub(label="chief:0")
    server = DataServer(hub, SECRET, "127.0.0.1").start()
    yield hub, server
    hub.close()
    server.stop()


def test_a_read_past_the_fed_epochs_while_the_last_is_read_elsewhere_is_named(chief, monkeypatch):
    monkeypatch.setattr(feed_hub, "AHEAD_S", 0.0)
    hub, _ = chief
    hub.set_plan(1, 3)
    hub.end_epoch(2)  # epoch 3's rows are still being read by the other nodes
    with pytest.raises(FeedOutOfStep) as info:
        hub.take(64, True, [4])
    assert str(info.value).startswith("chief:0 read its feed out of step: it asked for epoch 4, and the job feeds "
                                      "3 epochs; the other nodes still read epoch 3 and wait for chief:0")
    assert hub.out_of_step == str(info.value)


def test_a_second_train_call_names_its_own_epochs(chief, monkeypatch):
    monkeypatch.setattr(feed_hub, "AHEAD_S", 0.0)
    hub, _ = chief
    hub.set_plan(4, 5)
    hub.end_epoch(4)
    with pytest.raises(FeedOutOfStep, match=r"asked for epoch 6, and this train\(\) feeds epochs 4-5"):
        hub.take(64, True, [6])


def test_a_read_within_the_fed_epochs_or_after_all_were_read_waits_as_before(chief, monkeypatch):
    """Reading ahead is only out of step while the last fed epoch is open: the same read once it ended waits
    for the next train() (or the stop that ends it empty), and so does any read with no train() announced."""
    monkeypatch.setattr(feed_hub, "AHEAD_S", 0.0)
    hub, server = chief
    hub.set_plan(1, 2)
    t, _ = feed_in_thread(server.port, [(1.0, i) for i in range(5)], gen=2, partition=0)
    epoch = [2]
    assert sum(b.num_rows for _, b in hub.take(5, True, epoch)) == 5  # epoch 2 is fed: no question asked
    t.join(10)
    hub.end_epoch(2)  # every row of the call was read: a read past it waits (for the next train() or the stop)
    assert not hub._ahead(3)
    hub.stop()
    assert hub.take(64, True, [3]) == [] and hub.out_of_step is None
    hub.set_plan(0, 0)  # a stream's epoch: no plan, nothing is ahead
    assert hub.plan is None and not hub._ahead(9)
