"""``as_dataset``'s tf.data pipeline, with real TensorFlow over a real DataServer and feeder connection (the data
plane itself is ``test_feed.py``)."""

import threading

from tests.conftest import import_or_skip
from tests.test_feed import feed_in_thread, node  # noqa: F401 - node is a fixture
from tfos_nb.runtime.executor.feed import DataFeed


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
