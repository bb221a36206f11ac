"""Issue 41, item 1, on the data plane: nodes know which epochs the running ``train()`` feeds, and a bounded read
past them while the last is still being read is out of step (``FeedOutOfStep``, naming the node) instead of a
silent wait.  The whole job on a real cluster is ``test_out_of_step.py``."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from tests.server_abuse import SECRET
from tests.test_feed import feed_in_thread
from tfos_nb.runtime.executor.feed import plan as feed_plan
from tfos_nb.runtime.executor.feed.data_feed import DataFeed
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.executor.feed.plan import FeedOutOfStep, sample_row
from tfos_nb.runtime.executor.feed.server import DataServer
from tfos_nb.runtime.executor.feeding.batches import with_sample


@pytest.fixture
def chief():
    hub = FeedHub(label="chief:0")
    server = DataServer(hub, SECRET, "127.0.0.1").start()
    yield hub, server
    hub.close()
    server.stop()


def test_a_read_past_the_fed_epochs_while_the_last_is_read_elsewhere_is_named(chief, monkeypatch):
    monkeypatch.setattr(feed_plan, "AHEAD_S", 0.0)
    hub, _ = chief
    hub.set_plan(1, 3)
    hub.end_epoch(2)  # epoch 3's rows are still being read by the other nodes
    with pytest.raises(FeedOutOfStep) as info:
        hub.take(64, True, [4])
    assert str(info.value).startswith("chief:0 read its feed out of step: it asked for epoch 4, and the job feeds "
                                      "3 epochs; the other nodes still read epoch 3 and wait for chief:0")
    assert hub.out_of_step == str(info.value)


def test_a_second_train_call_names_its_own_epochs(chief, monkeypatch):
    monkeypatch.setattr(feed_plan, "AHEAD_S", 0.0)
    hub, _ = chief
    hub.set_plan(4, 5)
    hub.end_epoch(4)
    with pytest.raises(FeedOutOfStep, match=r"asked for epoch 6, and this train\(\) feeds epochs 4-5"):
        hub.take(64, True, [6])


def test_a_read_within_the_fed_epochs_or_after_all_were_read_waits_as_before(chief, monkeypatch):
    """Reading ahead is only out of step while the last fed epoch is open: the same read once it ended waits
    for the next train() (or the stop that ends it empty), and so does any read with no train() announced."""
    monkeypatch.setattr(feed_plan, "AHEAD_S", 0.0)
    hub, server = chief
    hub.set_plan(1, 2)
    t, _ = feed_in_thread(server.port, [(1.0, i) for i in range(5)], gen=2, partition=0)
    epoch = [2]
    assert sum(b.num_rows for _, b in hub.take(5, True, epoch)) == 5  # epoch 2 is fed: no question asked
    t.join(10)
    hub.end_epoch(2)  # every row of the call was read: a read past it waits (for the next train() or the stop)
    assert not hub.epochs.ahead(3)
    hub.stop()
    assert hub.take(64, True, [3]) == [] and hub.out_of_step is None
    hub.set_plan(0, 0)  # a stream's epoch: no plan, nothing is ahead
    assert hub.plan is None and not hub.epochs.ahead(9)


def test_a_node_given_no_row_builds_its_dataset_from_the_feeders_sample(chief):
    """A node that got no partition (or only empty ones) of the epoch it reads first has no row to build
    ``as_dataset``'s signature from: it takes a row of zeros shaped as the fed rows, from the first feeding task's
    sample (schema and value shapes, through the driver), once its share is known to be empty — and reads nothing."""
    tf = pytest.importorskip("tensorflow")
    hub, _ = chief
    schema = pa.schema([("x", pa.list_(pa.float32())), ("y", pa.float32()), ("tag", pa.string())])
    rows = pa.RecordBatch.from_pylist([{"x": [1.0] * 8, "y": 1.0, "tag": "a"}] * 3, schema=schema)
    batches, sample = with_sample([rows.slice(0, 0), rows])  # an empty first batch, as an empty partition's
    assert sum(b.num_rows for b in batches) == 3 and sample["shapes"] == [[8], [], []]
    zeros = sample_row(sample)
    assert zeros.to_pylist() == [{"x": [0.0] * 8, "y": 0.0, "tag": ""}]
    hub.set_plan(1, 2, sample)
    hub.epoch_assigned(1, 0)  # this node's share of epoch 1: no partition
    ds = DataFeed(hub).as_dataset(batch_size=4, columns=(0, 1))
    assert ds.element_spec == (tf.TensorSpec((None, 8), tf.float32), tf.TensorSpec((None,), tf.float32))
    assert list(ds) == [] and hub.rows == 0  # its epoch 1: empty, at once


def test_without_a_sample_a_node_waits_for_its_first_row(chief):
    hub, _ = chief
    hub.epoch_assigned(1, 0)
    hub.set_plan(1, 1, {"schema": "not hex", "shapes": []})  # nothing usable: no sample
    assert hub.sample is None
    hub.stop()
    assert hub.peek() is None  # it waited until the feed ended, as before


def test_a_node_whose_partitions_were_all_empty_builds_from_the_sample_of_this_call(chief):
    """Empty partitions connect and end (their end is queued for inference's sake): a share of only those is
    still empty. A second train() call's data may have another shape: the last call's sample is not used."""
    hub, server = chief
    schema = pa.schema([("x", pa.list_(pa.float32())), ("y", pa.float32())])
    rows = pa.RecordBatch.from_pylist([{"x": [1.0] * 8, "y": 1.0}], schema=schema)
    _, first = with_sample([rows])
    hub.set_plan(1, 1, first)
    hub.epochs.done = 1  # the first call's epoch, read and ended
    wide = pa.RecordBatch.from_pylist([{"x": [1.0] * 3, "y": 1.0}], schema=schema)
    _, second = with_sample([wide])
    hub.set_plan(2, 2, {})  # a new call; its sample is not known yet
    assert hub.sample is None
    hub.set_plan(2, 2, second)
    threads = [feed_in_thread(server.port, [], gen=2, partition=p)[0] for p in (0, 1)]  # two empty partitions
    for t in threads:
        t.join(10)
    hub.epoch_assigned(2, 2)
    assert hub.epochs.share_in(2) and hub.queued_rows() == {2: 0}  # both ended, no row queued (their ends are)
    got = hub.peek()
    assert got is hub.sample and got.to_pylist() == [{"x": [0.0] * 3, "y": 0.0}]


def test_a_share_known_before_its_calls_plan_waits_for_that_calls_sample(chief):
    """The next call's first share can reach the node before its plan: the last call's sample (another shape)
    must not stand in for the new data's; the read waits for the new call's."""
    hub, _ = chief
    schema = pa.schema([("x", pa.list_(pa.float32()))])
    _, old = with_sample([pa.RecordBatch.from_pylist([{"x": [1.0] * 8}], schema=schema)])
    _, new = with_sample([pa.RecordBatch.from_pylist([{"x": [1.0] * 3}], schema=schema)])
    hub.set_plan(1, 1, old)
    hub.epoch_assigned(1, 0)
    assert hub.take(64, True, [0]) == []  # the node read the last call's epoch (its share: nothing)
    hub.end_epoch(1)
    hub.epoch_assigned(2, 0)  # the new call's first epoch: no partition here; its plan not heard of yet
    got = {}
    reader = threading.Thread(target=lambda: got.update(batch=hub.peek()))
    reader.start()
    hub.set_plan(2, 2, new)
    reader.join(10)
    assert got["batch"].to_pylist() == [{"x": [0.0] * 3}]


def test_a_new_dataset_while_the_calls_last_epoch_is_read_elsewhere_is_named(chief, monkeypatch):
    """A node whose share of the last epoch is read (its fit ended before its peers') and that builds its next
    dataset waits in as_dataset's peek for an epoch nobody feeds: named, as a read past the plan is (found by the
    feed stress run: the chief in peek for the next trial, its two workers in the last trial's first step)."""
    monkeypatch.setattr(feed_plan, "AHEAD_S", 0.0)
    hub, _ = chief
    hub.set_plan(3, 3)
    hub.end_epoch(2)
    hub.epoch_assigned(3, 0)  # no partition of epoch 3 here
    assert hub.take(64, True, [0]) == []  # this node's share of epoch 3 is read (nothing)
    with pytest.raises(FeedOutOfStep, match=r"^chief:0 read its feed out of step: it asked for epoch 4"):
        hub.peek()


def test_an_epoch_whose_read_stopped_at_its_last_row_is_not_read_again(chief):
    """Keras (tf_keras) runs as many steps in later epochs as the first had, so an epoch's iterator can be dropped
    after its last row without asking once more (the end never seen here).  The next epoch's iterator must read
    the next epoch -- not the same one again, empty (found by the feed stress run: that node lagged one epoch
    and read the next train() call's rows into the last call's dataset)."""
    hub, server = chief
    hub.set_plan(1, 2)
    t, _ = feed_in_thread(server.port, [(1.0, i) for i in range(4)], gen=1, partition=0)
    first = [0]
    assert sum(b.num_rows for _, b in hub.take(4, True, first)) == 4 and first == [1]  # all of epoch 1; end not seen
    t.join(10)
    hub.epoch_assigned(1, 1)  # the share is in; the driver has not ended epoch 1 yet
    t, _ = feed_in_thread(server.port, [(2.0, i) for i in range(3)], gen=2, partition=1)
    second = [0]
    assert sum(b.num_rows for _, b in hub.take(3, True, second)) == 3 and second == [2]
    t.join(10)


def test_a_node_starting_after_its_empty_epoch_ended_reads_that_epoch_not_the_next(chief):
    """One read is one epoch: a node whose share of an epoch was empty and whose read begins after the driver
    ended that epoch (its peers took every row) reads it, empty, and its next read the next epoch -- it does not
    skip it and lag its peers by an epoch (found by the feed stress run: worker:1 read epochs 3-6 of a call
    feeding 2-5, the last with the next call's rows)."""
    hub, server = chief
    hub.set_plan(2, 5)
    hub.epochs.done = 1
    hub.epoch_assigned(2, 0)
    hub.end_epoch(2)  # epoch 2 read in full elsewhere before this node's first read of the call
    first = [0]
    assert hub.take(64, True, first) == [] and first == [2]
    t, _ = feed_in_thread(server.port, [(1.0, i) for i in range(3)], gen=3, partition=0)
    second = [0]
    assert sum(b.num_rows for _, b in hub.take(3, True, second)) == 3 and second == [3]
    t.join(10)


def test_a_training_partition_cut_short_is_told_once_its_rows_are_in_and_one_that_ended_is_not():
    """A feeder that dies mid-partition (its connection breaks before END): the node tells the driver which
    partition, and how many of its rows arrived (``on_drop``), once it has read them; a partition that ended, an
    inference partition and a cut made by the node's own close are not told."""
    import socket as so

    from tests.conftest import wait_until
    from tests.test_feed import send
    from tfos_nb.runtime.batches import columns
    from tfos_nb.runtime.protocol import dataplane

    told: list[tuple[int, int, int]] = []
    hub = FeedHub(label="worker:0", on_drop=lambda c: told.append((c.gen, c.partition, c.received)))
    server = DataServer(hub, SECRET, "127.0.0.1").start()
    try:
        rows = [([float(i)] * 4, i) for i in range(250)]
        cut = dataplane.client_connect("127.0.0.1", server.port, SECRET, {"partition": 7, "gen": 1, "mode": "train"}, 10)
        dataplane.send_frame(cut, dataplane.Kind.DATA, columns.encode_ipc(columns.rows_to_batch(rows[:100])))
        cut.shutdown(so.SHUT_RDWR)  # the feeder is gone mid-partition
        cut.close()
        whole = send(server.port, rows, partition=8)  # a partition that ends
        infer = dataplane.client_connect("127.0.0.1", server.port, SECRET, {"partition": 9, "gen": 0, "mode": "infer"}, 10)
        infer.close()
        taken = 0
        while taken < 350:
            taken += sum(b.num_rows for _, b in hub.take(50, True))
        assert wait_until(lambda: told == [(1, 7, 100)], 10), told  # the reader thread tells it as it ends
        whole.close()
    finally:
        hub.close()
        server.stop()
    assert told == [(1, 7, 100)]  # neither the ended partition, the inference one, nor the node's own close


def test_the_plan_from_the_heartbeat_thread_imports_nothing_the_users_function_may_be_importing():
    """The supervisor's heartbeat thread hands the node its plan while the user's function imports on the main
    thread (tf_keras imports pandas): building the sample row there (pyarrow's first ``pa.array`` imports pandas)
    raced that import ("partially initialized module 'pandas'", seen in a recovery run). The plan keeps the
    sample as it came; the reader builds the row when it needs it."""
    import subprocess
    import sys
    code = (
        "import sys, pyarrow as pa\n"
        "from tfos_nb.runtime.executor.feed.hub import FeedHub\n"
        "schema = pa.schema([('x', pa.list_(pa.float32(), 2))])\n"
        "sample = {'schema': bytes(schema.serialize()).hex(), 'shapes': [[2]]}  # as a feeding task tells it\n"
        "assert 'pandas' not in sys.modules, 'pandas imported before the plan'\n"
        "hub = FeedHub(label='chief:0')\n"
        "hub.set_plan(1, 1, sample)\n"
        "print('pandas' in sys.modules)\n"
        "hub.epoch_assigned(1, 0)\n"
        "print(hub.peek().num_rows)\n"
        "hub.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "1"], out.stderr


def test_an_epochs_share_complete_after_the_next_epochs_still_reaches_the_node(chief):
    """Two epochs in flight: the next epoch's partitions can all go out before this one's last (a feeding task
    of this epoch waited for a slot), so the driver's heartbeat answer says the next epoch's shares first.  Each
    epoch's share must still reach the node: the supervisor relayed only epochs past the last it relayed, so
    epoch 2's never did, and a node given none of epoch 2 waited for it while its peer waited in a collective
    for it, until the feed timed out (seen under load in ``test_mwms_trains_on_partitions_of_unequal_size``:
    both partitions of epoch 2 went to worker:1 and both of epoch 3 to worker:0)."""
    import dataclasses
    import io
    import types

    from tests.test_launch_meta import _meta
    from tfos_nb.runtime.driver.feeding.shares import EpochShares
    from tfos_nb.runtime.executor.process.supervisor import Supervisor
    from tfos_nb.runtime.protocol import messages, pipes

    sup = Supervisor(_meta(node=0, watch_jvm=False, roles=[["worker", 0], ["worker", 1]]).to_dict(), b"")
    pipe = io.BytesIO()
    sup.child = types.SimpleNamespace(stdin=pipe)  # what the supervisor writes to its node process
    shares = EpochShares()
    try:
        shares.set_tasks(2, 2)
        shares.set_tasks(3, 2)
        shares.handed_out(2, 0, 1)  # epoch 2's first partition to worker:1; its second waits for a slot
        shares.handed_out(3, 0, 0)
        shares.handed_out(3, 1, 0)  # all of epoch 3 went out, both partitions to worker:0
        sup.on_reply(messages.BeatCommand(epochs_assigned=shares.for_node(0)))
        shares.handed_out(2, 1, 1)  # epoch 2's second partition, to worker:1 too: worker:0 gets none of epoch 2
        sup.on_reply(messages.BeatCommand(epochs_assigned=shares.for_node(0)))
        sup.on_reply(messages.BeatCommand(epochs_assigned=shares.for_node(0)))  # said again: relayed once
    finally:
        sup.client.close()
        if sup.port_socket is not None:
            sup.port_socket.close()
    pipe.seek(0)
    frames = []
    while pipe.tell() < len(pipe.getvalue()):
        frames.append(pipes.read(pipe))
    assigned = [dataclasses.asdict(f) for f in frames if isinstance(f, pipes.EpochAssigned)]
    assert [(a["epoch"], a["partitions"]) for a in assigned] == [(3, 2), (2, 0)]

    hub, _ = chief  # the node: its read of epoch 2 ends at once (nothing of it came here), not waiting for rows
    hub.set_plan(1, 3)
    hub.end_epoch(1)
    for a in assigned:
        hub.epoch_assigned(a["epoch"], a["partitions"], a["rows"], a["most"])
    first, second = [0], [0]
    assert hub.take(32, True, first) == [] and first == [1]  # epoch 1, read here before (ended)
    assert hub.take(32, True, second) == [] and second == [2]
