"""The data plane over real sockets: a DataServer + DataFeed and real feeder connections.

What anyone else who can reach the data port may send is ``test_feed_abuse.py``.
"""

import threading

import numpy as np
import pytest

from tests.conftest import wait_until
from tests.server_abuse import SECRET
from tfos_nb.runtime.batches import columns
from tfos_nb.runtime.batches import results as inference_results
from tfos_nb.runtime.executor.feed.data_feed import DataFeed
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.executor.feed.server import DataServer
from tfos_nb.runtime.protocol import dataplane


def serve(hub: FeedHub):
    """A node's data plane for ``hub``: (hub, its DataServer on loopback), closed after."""
    server = DataServer(hub, SECRET, "127.0.0.1").start()
    yield hub, server
    hub.close()
    server.stop()


@pytest.fixture
def node():
    yield from serve(FeedHub())


def send(port, rows, gen=1, mode="train", chunk=100, partition=0):
    sock = dataplane.client_connect("127.0.0.1", port, SECRET, {"partition": partition, "gen": gen, "mode": mode}, 10)
    for i in range(0, len(rows), chunk):
        dataplane.send_frame(sock, dataplane.Kind.DATA, columns.encode_ipc(columns.rows_to_batch(rows[i : i + chunk])))
    dataplane.send_frame(sock, dataplane.Kind.END)
    return sock


def feed_in_thread(port, rows, **kw):
    out = {}

    def run():
        sock = send(port, rows, **kw)
        frames = []
        while True:
            kind, payload = dataplane.recv_frame(sock)
            frames.append((kind, payload))
            if kind in (dataplane.Kind.DONE, dataplane.Kind.ERROR):
                break
        sock.close()
        out["frames"] = frames

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_batches_are_exact_and_feeder_is_acked_after_consumption(node):
    hub, server = node
    rows = [([float(i)] * 4, i) for i in range(250)]
    t, out = feed_in_thread(server.port, rows)
    feed = DataFeed(hub)
    sizes, labels = [], []

    def consume():
        while not feed.should_stop():
            cols = feed.next_batch_arrays(64)
            if cols:
                sizes.append(len(cols[1]))
                labels.extend(cols[1].tolist())

    consumer = threading.Thread(target=consume)
    consumer.start()
    t.join(10)  # the feeder is acked once its last row was taken, before the batch is full
    assert not t.is_alive()
    hub.stop()  # the end of the data: the last, partial batch is handed out
    consumer.join(10)
    assert sizes == [64, 64, 64, 58]
    assert labels == list(range(250))
    kind, payload = out["frames"][-1]
    assert kind is dataplane.Kind.DONE and dataplane.parse_json(payload) == {"rows": 250, "skipped": 0, "shared": 0}


def test_next_batch_returns_tensorflowonspark_rows(node):
    hub, server = node
    rows = [([1.0, 2.0], 7), ([3.0, 4.0], 8)]
    t, _ = feed_in_thread(server.port, rows)
    feed = DataFeed(hub, numpy_rows=False)
    got = feed.next_batch(2)
    t.join(10)
    assert got == [([1.0, 2.0], 7), ([3.0, 4.0], 8)]  # TensorFlowOnSpark's Python lists


def test_next_batch_rows_carry_numpy_arrays_by_default(node):
    import numpy as np

    hub, server = node
    rows = [([float(i), float(i) + 0.5], i) for i in range(5)]
    t, _ = feed_in_thread(server.port, rows)
    feed = DataFeed(hub)
    batch = feed.next_batch(3) + feed.next_batch(2)
    t.join(10)
    assert [type(r) for r in batch] == [tuple] * 5 and all(len(r) == 2 for r in batch)
    x, y = batch[4]
    assert isinstance(x, np.ndarray) and x.tolist() == [4.0, 4.5] and type(y) is int and y == 4
    np.testing.assert_array_equal(np.array([r[0] for r in batch]), [r[0] for r in rows])
    assert [int(r[1]) for r in batch] == list(range(5))


def test_input_mapping_returns_dict_by_tensor_name(node):
    hub, server = node
    rows = [{"img": [1.0, 2.0], "lbl": 1}, {"img": [3.0, 4.0], "lbl": 0}]
    t, _ = feed_in_thread(server.port, rows)
    feed = DataFeed(hub, input_mapping={"img": "x", "lbl": "y"})
    got = feed.next_batch(2)
    t.join(10)
    assert set(got) == {"x", "y"} and got["x"].shape == (2, 2) and got["y"].tolist() == [1, 0]


def test_unknown_mapped_column_names_what_exists(node):
    hub, server = node
    t, _ = feed_in_thread(server.port, [{"a": 1}])
    feed = DataFeed(hub, input_mapping={"b": "x"})
    with pytest.raises(KeyError, match=r"\['b'\].*columns are \['a'\]"):
        feed.next_batch(1)
    feed.terminate()
    t.join(10)


def test_inference_results_route_back_in_order_per_partition(node):
    hub, server = node
    rows_a = [(float(i),) for i in range(30)]
    rows_b = [(float(100 + i),) for i in range(20)]
    ta, out_a = feed_in_thread(server.port, rows_a, mode="infer", partition=0)
    tb, out_b = feed_in_thread(server.port, rows_b, mode="infer", partition=1)
    feed = DataFeed(hub, train_mode=False)
    answered = 0
    while answered < 50:
        (x,) = feed.next_batch_arrays(16)
        feed.batch_results(x * 2)
        answered += len(x)
    ta.join(10)
    tb.join(10)
    for out, rows in ((out_a, rows_a), (out_b, rows_b)):
        results = []
        for kind, payload in out["frames"]:
            if kind is dataplane.Kind.RESULTS:
                results.extend(inference_results.result_rows(columns.decode_ipc(payload)))
        assert results == [r[0] * 2 for r in rows]
        assert out["frames"][-1][0] is dataplane.Kind.DONE


def test_wrong_number_of_results_is_a_clear_error(node):
    hub, server = node
    t, _ = feed_in_thread(server.port, [(1.0,), (2.0,)], mode="infer")
    feed = DataFeed(hub, train_mode=False)
    (x,) = feed.next_batch_arrays(2)
    with pytest.raises(ValueError, match="batch_results\\(\\) got 1 results for 2 input rows"):
        feed.batch_results([1])
    feed.batch_results([1, 2])
    t.join(10)


def test_epochs_end_dataset_iterations(node):
    hub, server = node
    feed = DataFeed(hub)
    t1, _ = feed_in_thread(server.port, [(1.0, 0)] * 10, gen=1)

    def driver():  # as the driver does: the epoch's job is done, tell the nodes
        t1.join(10)
        hub.end_epoch(1)

    threading.Thread(target=driver).start()
    epoch = [0]
    first = hub.take(100, True, epoch)
    assert sum(b.num_rows for _, b in first) == 10
    assert hub.take(100, True, epoch) == []  # the end of generation 1 ends the iteration
    t2, _ = feed_in_thread(server.port, [(2.0, 1)] * 5, gen=2)

    def driver_stop():
        t2.join(10)
        hub.stop()

    threading.Thread(target=driver_stop).start()
    epoch = [0]
    second = hub.take(100, True, epoch)
    assert sum(b.num_rows for _, b in second) == 5 and epoch == [2]
    assert feed.should_stop()


def test_the_next_epochs_data_waits_in_its_own_queue(node):
    """Two epochs in flight (the driver pipelines their jobs): each iteration reads only its epoch's rows.

    Epoch 2's feeder arrives first and fills its queue past the bound (40 one-row batches > 16):
    epoch 1's feeder must still get through, or the reader waiting for epoch 1 would wait for ever.
    """
    hub, server = node
    t2, out2 = feed_in_thread(server.port, [(2.0, i) for i in range(40)], gen=2, chunk=1, partition=1)
    assert wait_until(lambda: hub.queued_rows().get(2) == 16, 10), hub.queued_rows()  # blocked at the bound
    t1, out1 = feed_in_thread(server.port, [(1.0, i) for i in range(30)], gen=1, chunk=10, partition=0)

    def driver(t, epoch):  # as the driver does: the epoch's job is done, tell the nodes
        t.join(10)
        hub.end_epoch(epoch)

    threading.Thread(target=driver, args=(t1, 1)).start()
    epoch = [0]
    first = hub.take(100, True, epoch)
    assert epoch == [1] and [v for _, b in first for v in b.column(0).to_pylist()] == [1.0] * 30
    assert hub.take(100, True, epoch) == []  # epoch 1 ends although epoch 2's rows are there
    assert hub.queued_rows().get(2) == 16  # epoch 2's rows still wait (its feeder at the bound)
    threading.Thread(target=driver, args=(t2, 2)).start()
    epoch = [0]
    second = hub.take(100, True, epoch)
    assert epoch == [2] and [v for _, b in second for v in b.column(1).to_pylist()] == list(range(40))
    assert hub.take(100, True, epoch) == []
    for out in (out1, out2):
        assert out["frames"][-1][0] is dataplane.Kind.DONE


def take_in_thread(hub, n, epoch):
    out = {}
    t = threading.Thread(target=lambda: out.update(pieces=hub.take(n, True, epoch)))
    t.start()
    return t, out


def test_an_epochs_read_ends_at_this_nodes_share_not_at_the_epochs_end(node):
    """Nodes with unequal shares of an epoch step together (MultiWorkerMirroredStrategy): a node must end its
    read once its share is in, not wait for the epoch's end, which waits for rows only its peers can read."""
    hub, server = node
    hub.epoch_assigned(1, 2)  # the driver: all of epoch 1's partitions went out, two of them to this node
    epoch = [0]
    reader, got = take_in_thread(hub, 100, epoch)
    t1, out1 = feed_in_thread(server.port, [(1.0, i) for i in range(10)], gen=1, partition=0)
    t1.join(10)
    assert out1["frames"][-1][0] is dataplane.Kind.DONE  # all 10 taken; the read goes on: one of the two partitions is in
    t2, _ = feed_in_thread(server.port, [(1.0, i) for i in range(10, 15)], gen=1, partition=3)
    reader.join(10)
    assert not reader.is_alive(), "the read waited for the end of the epoch"
    assert epoch == [1] and sorted(v for _, b in got["pieces"] for v in b.column(1).to_pylist()) == list(range(15))
    t2.join(10)
    # The next read is the next epoch's, although the driver has not ended epoch 1 yet.
    t3, _ = feed_in_thread(server.port, [(2.0, 7)] * 3, gen=2, partition=0)
    hub.epoch_assigned(2, 1)
    epoch = [0]
    assert sum(b.num_rows for _, b in hub.take(100, True, epoch)) == 3 and epoch == [2]
    t3.join(10)
    assert hub.epoch_done == 0


def test_a_node_with_no_share_of_an_epoch_reads_an_empty_iteration(node):
    hub, server = node
    hub.epoch_assigned(1, 0)
    t2, _ = feed_in_thread(server.port, [(2.0, 0)] * 4, gen=2, partition=0)
    assert wait_until(lambda: hub.queued_rows().get(2) == 4, 10)
    epoch = [0]
    assert hub.take(100, True, epoch) == [] and epoch == [1]  # epoch 1: nothing, at once
    hub.epoch_assigned(2, 1)
    epoch = [0]
    assert sum(b.num_rows for _, b in hub.take(100, True, epoch)) == 4 and epoch == [2]
    t2.join(10)


def test_a_reader_starts_with_the_oldest_epoch_not_yet_ended(node):
    """The next epoch's partition reaches this node before this epoch's: the iteration still starts with this one."""
    hub, server = node
    t2, _ = feed_in_thread(server.port, [(2.0, 0)] * 5, gen=2, partition=1)
    assert wait_until(lambda: hub.queued_rows().get(2) == 5, 10)
    t1, _ = feed_in_thread(server.port, [(1.0, 0)] * 7, gen=1, partition=0)
    threading.Thread(target=lambda: (t1.join(10), hub.end_epoch(1))).start()
    epoch = [0]
    assert sum(b.num_rows for _, b in hub.take(100, True, epoch)) == 7 and epoch == [1]
    threading.Thread(target=lambda: (t2.join(10), hub.end_epoch(2))).start()
    epoch = [0]
    assert sum(b.num_rows for _, b in hub.take(100, True, epoch)) == 5 and epoch == [2]


def test_next_batch_reads_across_epochs_oldest_first(node):
    hub, server = node
    t2, _ = feed_in_thread(server.port, [(2.0, 0)] * 4, gen=2, partition=1)
    assert wait_until(lambda: hub.queued_rows().get(2) == 4, 10)
    t1, _ = feed_in_thread(server.port, [(1.0, 0)] * 3, gen=1, partition=0)
    assert wait_until(lambda: hub.queued_rows().get(1) == 3, 10)
    rows = DataFeed(hub).next_batch(7)
    assert [r[0] for r in rows] == [1.0] * 3 + [2.0] * 4
    t1.join(10), t2.join(10)
    assert not t1.is_alive() and not t2.is_alive()


def test_terminate_with_the_next_epoch_queued_skips_each_row_once(node):
    hub, server = node
    t1, out1 = feed_in_thread(server.port, [(1.0, i) for i in range(300)], gen=1, chunk=50, partition=0)
    t2, out2 = feed_in_thread(server.port, [(2.0, i) for i in range(200)], gen=2, chunk=50, partition=1)
    assert wait_until(lambda: hub.queued_rows().get(2) == 200 and hub.queued_rows().get(1) == 300, 10)
    feed = DataFeed(hub)
    assert len(feed.next_batch(70)) == 70
    feed.terminate()
    t1.join(10), t2.join(10)
    a1, a2 = (dataplane.parse_json(out["frames"][-1][1]) for out in (out1, out2))
    assert a1 == {"rows": 70, "skipped": 230, "shared": 0} and a2 == {"rows": 0, "skipped": 200, "shared": 0}
    assert hub.rows == 70 and hub.skipped == 430


def test_terminate_skips_remaining_data_and_releases_feeders(node):
    hub, server = node
    rows = [(float(i), i) for i in range(5000)]
    t, out = feed_in_thread(server.port, rows, chunk=50)
    feed = DataFeed(hub)
    feed.next_batch(10)
    feed.terminate()
    t.join(10)
    assert not t.is_alive()
    done = dataplane.parse_json(out["frames"][-1][1])
    assert out["frames"][-1][0] is dataplane.Kind.DONE and done["skipped"] > 0 and done["rows"] >= 10


def test_unauthenticated_feeder_is_refused(node):
    _, server = node
    with pytest.raises((dataplane.DataPlaneError, OSError)):
        sock = dataplane.client_connect("127.0.0.1", server.port, b"w" * 32, {"partition": 0}, 5)
        dataplane.recv_frame(sock)


def test_a_failed_node_answers_its_feeders_with_its_error_not_an_ack(node):
    hub, server = node
    t, out = feed_in_thread(server.port, [(float(i), i) for i in range(500)], chunk=50)
    DataFeed(hub).next_batch(10)
    hub.close(error="worker:1 failed: ValueError: boom")  # what node.main does when the function raises
    t.join(10)
    kind, payload = out["frames"][-1]
    assert kind is dataplane.Kind.ERROR and dataplane.parse_json(payload) == {"error": "worker:1 failed: ValueError: boom",
                                                        "node_failed": True}


def test_terminate_tells_the_driver_once(node):
    closed = []
    hub = FeedHub(on_close=lambda: closed.append(1))
    DataFeed(hub).terminate()
    DataFeed(hub).terminate()
    hub.close(error="worker:0 failed: later")  # a failure after terminate() is still a failure
    assert closed == [1] and hub.error == "worker:0 failed: later"


def test_empty_feed_on_nodes_that_are_not_fed():
    from tfos_nb import TFNode

    feed = TFNode.DataFeed(None, False)  # ctx.mgr on a ps node, or in InputMode.TENSORFLOW
    assert feed.should_stop() and feed.next_batch(8) == []
    feed.batch_results([])
    feed.terminate()


EMPTY_RESULTS = {
    "list": [],
    "float array": np.empty(0),  # what tf.math.square(batch).numpy() gives for an empty batch
    "2-D array": np.empty((0, 3), np.float32),
    "object array": np.array([], dtype=object),
    "dict of lists": {"y": []},
    "dict of arrays": {"y": np.empty(0), "z": np.empty((0, 2))},
}


@pytest.mark.parametrize("case", list(EMPTY_RESULTS))
def test_results_of_an_empty_batch_answer_nothing(node, case):
    """A node that got an empty next_batch() (nothing had arrived yet) and answers it keeps going: in
    TensorFlowOnSpark's own test_inputmode_spark, batch_results() of an empty array raised IndexError and the node
    died, failing the inference."""
    hub, server = node
    feed = DataFeed(hub, train_mode=False)
    feed.batch_results(EMPTY_RESULTS[case])  # no rows taken: nothing to answer
    rows = [(float(i),) for i in range(12)]
    t, out = feed_in_thread(server.port, rows, mode="infer")
    answered = 0
    while answered < len(rows):
        (x,) = feed.next_batch_arrays(5)
        feed.batch_results(x * 2)
        feed.batch_results(EMPTY_RESULTS[case])  # after a full answer, again nothing pending
        answered += len(x)
    t.join(10)
    results = [r for kind, payload in out["frames"] if kind is dataplane.Kind.RESULTS
               for r in inference_results.result_rows(columns.decode_ipc(payload))]
    assert results == [r[0] * 2 for r in rows]
    assert out["frames"][-1][0] is dataplane.Kind.DONE


def test_empty_results_with_rows_pending_are_a_clear_error(node):
    hub, server = node
    t, _ = feed_in_thread(server.port, [(1.0,), (2.0,)], mode="infer")
    feed = DataFeed(hub, train_mode=False)
    (x,) = feed.next_batch_arrays(2)
    with pytest.raises(ValueError, match="batch_results\\(\\) got 0 results for 2 input rows"):
        feed.batch_results(np.empty(0))
    feed.batch_results(x)
    t.join(10)
