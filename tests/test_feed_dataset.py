"""``as_dataset``'s tf.data pipeline, with real TensorFlow over a real DataServer and feeder connection (the data
plane itself is ``test_feed.py``)."""

import threading

from tests.conftest import import_or_skip, wait_until
from tests.server_abuse import SECRET
from tests.test_feed import feed_in_thread, node  # noqa: F401 - node is a fixture
from tfos_nb.runtime.batches import columns
from tfos_nb.runtime.executor.feed.data_feed import DataFeed
from tfos_nb.runtime.protocol import dataplane


def test_as_dataset_runs_without_tf_data_autotuning_down_to_the_strategys_device_prefetch(node):  # noqa: F811
    """An autotuned tf.data iterator's deletion -- Keras makes one an epoch, and MultiWorkerMirroredStrategy one per
    device for each -- waits for its tuning thread's sleep, seconds late in a run (2.1-2.5 s measured after the last
    step of a 2-worker fit). Nothing in as_dataset's pipeline is tuned: its dataset, and the per-device datasets the
    strategy's iterator makes on this GPU-less machine, run without autotuning; the rows still come through."""
    tf = import_or_skip("tensorflow")
    from tensorflow.python.data.ops import multi_device_iterator_ops

    hub, server = node
    t, _ = feed_in_thread(server.port, [([float(i)] * 3, i) for i in range(10)], gen=1)
    ds = DataFeed(hub).as_dataset(batch_size=4)
    assert ds.options().autotune.enabled is False
    device_iterator = multi_device_iterator_ops.OwnedMultiDeviceIterator(tf.data.Dataset.range(3), ["/cpu:0"])
    assert device_iterator._device_iterators[0]._dataset.options().autotune.enabled is False

    def driver():  # as the driver does: the epoch's job is done, tell the nodes
        t.join(10)
        hub.end_epoch(1)

    threading.Thread(target=driver).start()
    assert sorted(int(i) for _, ids in ds for i in ids.numpy()) == list(range(10))


def test_as_dataset_hands_tf_data_the_batches_already_here_in_one_call_with_the_same_boundaries(node):  # noqa: F811
    """The generator's per-call cost (a Python call, a tensor made from numpy) is paid once for up to
    ``feed.CHUNK`` batches when they are all queued: tf.data slices them again. The batches are those of a batch a
    call: whole batches, the share's short one last. Before, a call took one batch: 32 rows taken for the first."""
    import_or_skip("tensorflow")
    hub, server = node
    t, _ = feed_in_thread(server.port, [([float(i)] * 3, i) for i in range(300)], gen=1)
    wait_until(lambda: hub.ready(300, [1]), 30, what="the feeder's 300 rows queued on the node")
    it = iter(DataFeed(hub).as_dataset(batch_size=32))
    first = next(it)
    assert hub.rows == 256, hub.rows  # CHUNK (8) whole batches in one call; 44 rows left queued
    hub.epoch_assigned(1, 1)  # the driver: epoch 1 went out, one partition to this node
    sizes = [int(first[1].shape[0])] + [int(ids.shape[0]) for _, ids in it]
    assert sizes == [32] * 9 + [12], sizes
    assert hub.rows == 300
    t.join(10)


def test_as_dataset_never_waits_for_a_later_batch_to_hand_over_the_one_here(node):  # noqa: F811
    """A chunk takes more batches only when they are queued: with 40 rows here and the partition still open, the
    first 32 are handed over at once (waiting for 8 batches would stall a step on rows Spark has not sent)."""
    import_or_skip("tensorflow")
    hub, server = node
    sock = dataplane.client_connect("127.0.0.1", server.port, SECRET, {"partition": 0, "gen": 1, "mode": "train"}, 10)
    rows = [([float(i)] * 3, i) for i in range(100)]
    dataplane.send_frame(sock, dataplane.Kind.DATA, columns.encode_ipc(columns.rows_to_batch(rows[:40])))
    got: list = []
    it = iter(DataFeed(hub).as_dataset(batch_size=32))
    reader = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
    reader.start()
    reader.join(30)  # the hub has the rows: a read of 32 returns at once
    assert got and [int(i) for i in got[0][1].numpy()] == list(range(32)), got
    assert hub.rows == 32
    dataplane.send_frame(sock, dataplane.Kind.DATA, columns.encode_ipc(columns.rows_to_batch(rows[40:])))
    dataplane.send_frame(sock, dataplane.Kind.END)
    hub.epoch_assigned(1, 1)
    assert [int(i) for _, ids in it for i in ids.numpy()] == list(range(32, 100))
    sock.close()
