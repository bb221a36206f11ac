"""Issue 66, item 1: epochs of known length -- every node's dataset ends each epoch after the same number of batches.

The driver counts each partition's rows once per ``train()`` call (``driver/feeding/counts.py``), adds up each
node's share as partitions go out (``driver/feeding/shares.py``), and each node hears of its rows and the largest
share's; ``as_dataset`` then pads its share with empty batches up to the largest share's count, and TensorFlow's
per-step has-data check (a collective a step) is off for it (``executor/keras_node/known_length.py``).  The fast
tests hold each piece; the slow ones train with Keras under MultiWorkerMirroredStrategy on a real local-cluster with
uneven partitions (one empty, up to 200) on 1, 2 and 3 nodes, every row's id recorded by the step that trained it.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import cloudpickle
import numpy as np
import pytest

from tests.conftest import spark_fixture
from tests.server_abuse import SECRET
from tests.test_feed import serve
from tfos_nb.runtime.batches import columns
from tfos_nb.runtime.driver.feeding import counts
from tfos_nb.runtime.driver.feeding.shares import EpochShares
from tfos_nb.runtime.executor.feed.data_feed import DataFeed
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.executor.feeding.feeder import changed_rows
from tfos_nb.runtime.executor.keras_node import known_length
from tfos_nb.runtime.protocol import dataplane

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the node function ships by value

# -- the driver's shares ------------------------------------------------------------------------------------------


def test_each_node_hears_its_rows_and_the_largest_share_once_every_partition_went_out():
    shares = EpochShares()
    shares.count(1, {0: 100, 1: 0, 2: 37, 3: 250}, nodes=[0, 1, 2])
    shares.set_tasks(1, 4)
    for partition, node in ((0, 0), (1, 1), (2, 1)):
        shares.handed_out(1, partition, node)
        assert shares.expected(1, partition) == [100, 0, 37][partition]
    assert shares.for_node(0) == []  # partition 3 has not gone out
    shares.handed_out(1, 3, 0)
    assert shares.for_node(0) == [[1, 2, 350, 350]]
    assert shares.for_node(1) == [[1, 2, 37, 350]]
    assert shares.for_node(2) == [[1, 0, 0, 350]]  # a node given nothing pads the whole epoch
    assert shares.expected(2, 0) == -1  # an epoch not counted


def test_an_ended_epochs_shares_are_still_told_a_node_that_did_not_hear_of_them_in_time():
    """An epoch fed within a heartbeat ends before a node heard of its shares: it needs them to end the epoch."""
    shares = EpochShares()
    shares.count(1, {0: 10}, nodes=[0, 1])
    shares.handed_out(1, 0, 1)  # the stage's tasks never learnt: the epoch's job ended first
    shares.forget_through(1)
    assert shares.for_node(0) == [[1, 0, 0, 10]]
    for epoch in (2, 3, 4):
        shares.count(epoch, {0: 10}, nodes=[0, 1])
        shares.handed_out(epoch, 0, 0)
        shares.forget_through(epoch)
    assert [e for e, *_ in shares.for_node(0)] == [2, 3, 4]  # kept a while, not for ever


def test_a_resumed_epochs_count_leaves_out_the_rows_it_does_not_feed():
    assert counts.without_skipped({0: 100, 1: 50}, {0: [(0, 30), (90, 100)], 2: [(0, 5)]}) == {0: 60, 1: 50}


def test_a_partition_whose_rows_changed_since_the_count_is_named_in_one_sentence():
    msg = changed_rows(3, 2, 2500, 2400)
    assert "partition 3 of epoch 2 holds 2400 rows, but 2500 when they were counted before the first epoch" in msg
    assert "cache()" in msg and "TFOS_KNOWN_LENGTH=0" in msg and "\n" not in msg


# -- the node's dataset -----------------------------------------------------------------------------------------------


@pytest.fixture
def counted_node():
    yield from serve(FeedHub(label="worker:1"))


def _feed_counted(port: int, rows: list, gen: int = 1) -> threading.Thread:
    def run() -> None:
        header = {"partition": 0, "gen": gen, "mode": "train", "rows": len(rows)}
        sock = dataplane.client_connect("127.0.0.1", port, SECRET, header, 10)
        dataplane.send_frame(sock, dataplane.Kind.DATA, columns.encode_ipc(columns.rows_to_batch(rows)))
        dataplane.send_frame(sock, dataplane.Kind.END)
        while dataplane.recv_frame(sock)[0] not in (dataplane.Kind.DONE, dataplane.Kind.ERROR):
            pass
        sock.close()

    t = threading.Thread(target=run)
    t.start()
    return t


def _one_epoch(node: tuple, rows: int, most: int, told_rows: int | None = None, padding: bool = True) -> list[int]:
    """Batch sizes of one epoch of ``as_dataset(batch_size=32)`` over ``rows`` rows, the largest share ``most``."""
    hub, server = node
    feeder = _feed_counted(server.port, [([float(i)] * 3, i) for i in range(rows)])
    try:
        hub.set_plan(1, 1)
        hub.epoch_assigned(1, 1, rows if told_rows is None else told_rows, most)
        ds = DataFeed(hub).as_dataset(batch_size=32)
        known = getattr(ds, known_length.MARK)
        assert isinstance(known, known_length.Known) and not known.padding
        known.padding = padding  # what a multi-worker strategy's distribute does (the slow tests: for real)
        return [int(x.shape[0]) for x, _ in ds]
    finally:
        feeder.join(10)


def test_a_smaller_share_ends_its_epoch_with_empty_batches_up_to_the_largest_shares_count(counted_node):
    sizes = _one_epoch(counted_node, rows=50, most=130)
    assert sizes == [32, 18, 0, 0, 0]  # ceil(130 / 32) = 5 batches, as every peer's


def test_without_a_multi_worker_strategy_the_dataset_keeps_its_own_batches(counted_node):
    assert _one_epoch(counted_node, rows=50, most=130, padding=False) == [32, 18]


def test_a_share_that_differs_from_what_the_driver_dealt_fails_the_node_instead_of_stepping_apart(counted_node):
    import tensorflow as tf

    with pytest.raises(tf.errors.OpError, match="worker:1 read 50 rows of epoch 1, but the driver dealt "
                                                             "it 60 as train\\(\\) counted them"):
        _one_epoch(counted_node, rows=50, most=130, told_rows=60)


def test_tensorflow_keeps_its_check_for_a_dataset_not_marked_or_outside_a_multi_worker_strategy():
    import tensorflow as tf
    from tensorflow.python.distribute import input_lib

    known_length.install()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    marked = tf.data.Dataset.range(4).batch(2)
    known = known_length.Known()
    known_length.mark(marked, known)
    plain = tf.data.Dataset.range(4).batch(2)
    original = input_lib._enable_get_next_as_optional._tfos_nb_original
    for ds in (marked, plain):
        assert input_lib._enable_get_next_as_optional(strategy, ds, 2) == original(strategy, ds, 2)
    assert not known.padding


# -- Keras under MultiWorkerMirroredStrategy on a real cluster --------------------------------------------------------

spark = spark_fixture(3)


def _train_recording(args, ctx):
    """A data scientist's Keras program, plus a train_step that records the ids of the rows each step trained."""
    import json
    import os

    import tensorflow as tf

    from tfos_nb.runtime.executor.keras_node import known_length

    seen: list[int] = []

    def record(ids):
        seen.extend(int(i) for i in ids.numpy())
        return 0

    class Recording(tf.keras.Model):
        def train_step(self, data):
            (x, ids), y = data
            tf.py_function(record, [ids], tf.int32)
            return super().train_step((x, y))

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        features = tf.keras.Input((2,))
        model = Recording(inputs=features, outputs=tf.keras.layers.Dense(2)(features))
        model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = ctx.get_data_feed().as_dataset(batch_size=args["batch"], columns=((1, 0), 2))
    steps: list[int] = []
    epoch_rows: list[list[int]] = []

    class Steps(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            steps.append(0)
            epoch_rows.append([])

        def on_train_batch_end(self, batch, logs=None):
            steps[-1] += 1

        def on_epoch_end(self, epoch, logs=None):
            epoch_rows[-1] = list(seen)
            seen.clear()

    model.fit(ds, epochs=args["epochs"], verbose=0, callbacks=[Steps()])
    known = getattr(ds, known_length.MARK, None)
    out = {"steps": steps, "ids": epoch_rows, "known": known is not None and known.padding}
    with open(os.path.join(args["out"], f"{ctx.job_name}-{ctx.task_index}.json"), "w") as f:
        json.dump(out, f)


@pytest.mark.slow
@pytest.mark.parametrize(("nodes", "sizes", "batch"), [
    (2, [100, 0, 37, 250, 13], 32),
    (3, [int(n) for n in np.random.default_rng(66).integers(0, 12, 200)], 16),
    (1, [75], 32),
], ids=["2-nodes-5-uneven-partitions-one-empty", "3-nodes-200-partitions", "1-node-1-partition"])
def test_keras_steps_every_epoch_as_often_on_every_node_and_trains_every_row_once(spark, tmp_path, nodes, sizes,
                                                                                   batch):
    from tfos_nb import TFCluster

    ids = np.arange(sum(sizes))
    rows = [(int(i), [float(i % 7), float(p)], int(i % 2)) for p, n in enumerate(sizes)
            for i in ids[sum(sizes[:p]):sum(sizes[:p]) + n]]
    # one partition per given size, in that order (a partition with no row included)
    by_partition = spark.sparkContext.parallelize(
        [[r for r in rows if int(r[1][1]) == p] for p in range(len(sizes))], len(sizes)).flatMap(lambda part: part)
    df = spark.createDataFrame(by_partition, "id long, x array<double>, y int").cache()
    assert df.rdd.glom().map(len).collect() == sizes
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    epochs = 2
    cluster = TFCluster.run(spark.sparkContext, _train_recording, {"batch": batch, "epochs": epochs, "out": str(out)},
                            nodes, input_mode=TFCluster.InputMode.SPARK)
    try:
        cluster.train(df, num_epochs=epochs)
    finally:
        cluster.shutdown()
    got = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert len(got) == nodes
    assert all(g["known"] for g in got) == (nodes > 1)  # the check is off only under a multi-worker strategy
    for epoch in range(epochs):
        steps = {g["steps"][epoch] for g in got}
        assert len(steps) == 1, f"epoch {epoch + 1}: unequal steps {[g['steps'][epoch] for g in got]}"
        trained = sorted(i for g in got for i in g["ids"][epoch])
        assert trained == ids.tolist(), f"epoch {epoch + 1}: not every row once"


def _fit_once(args, ctx):
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ctx.get_data_feed().as_dataset(batch_size=32, columns=(0, 1)), epochs=2, verbose=0)


@pytest.mark.slow
def test_a_dataframe_whose_rows_change_between_reads_is_named_in_one_sentence_not_a_hang(spark, monkeypatch):
    """Counted although not cached (``TFOS_KNOWN_LENGTH=always``): its non-deterministic filter keeps other rows in
    the feed than in the count."""
    from pyspark.sql import functions as F

    from tfos_nb import TFCluster

    monkeypatch.setenv(counts.ENV, "always")
    coin = F.udf(lambda i: __import__("random").random() < 0.5, "boolean").asNondeterministic()
    df = spark.range(0, 4000, numPartitions=4).where(coin("id")).select(
        F.array(F.col("id").cast("double"), F.lit(1.0)).alias("x"), (F.col("id") % 2).cast("int").alias("y"))
    cluster = TFCluster.run(spark.sparkContext, _fit_once, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        with pytest.raises(RuntimeError, match=r"partition \d of epoch 1 holds .* rows, but \d+ when they were "
                                               r"counted before the first epoch"):
            cluster.train(df, num_epochs=2)
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_only_what_spark_holds_is_counted_unless_asked_so_the_users_code_never_runs_twice(spark, monkeypatch):
    """A count of uncached data runs its upstream code again (the files read twice, every UDF and mapPartitions
    function again, a blocking one where no node waits: the feed-stalls test hung on it)."""
    df = spark.range(10, numPartitions=2)
    rdd = spark.sparkContext.parallelize(range(10), 2)
    assert not counts.counts(df) and not counts.counts(rdd)
    cached_df, cached_rdd = df.cache(), spark.sparkContext.parallelize(range(10), 2).cache()
    try:
        assert counts.counts(cached_df) and counts.counts(cached_rdd)
        monkeypatch.setenv(counts.ENV, "always")
        assert counts.counts(df) and counts.counts(rdd)
        monkeypatch.setenv(counts.ENV, "0")
        assert not counts.counts(cached_df) and not counts.counts(cached_rdd)
    finally:
        cached_df.unpersist()
        cached_rdd.unpersist()


@pytest.mark.slow
def test_spark_waits_for_no_executor_while_train_feeds_and_the_users_setting_comes_back(spark):
    """Issue 66, item 2: with more partitions than slots a feeding task waited 3 s (``spark.locality.wait``) for
    the busy executor that caches its partition while every node waited for its rows (timeline: asks 2-4 s after
    the slot freed; 8 cached partitions trained 2.4x as long as 2)."""
    from tfos_nb.runtime.driver.feeding.batch import LOCALITY_WAITS, no_locality_wait

    conf = spark.sparkContext._jsc.sc().conf()
    conf.set("spark.locality.wait.node", "5s")  # a user's own setting; the other two unset
    conf.remove("spark.locality.wait.process")
    try:
        with no_locality_wait(spark.sparkContext):
            assert [conf.get(k) for k in LOCALITY_WAITS] == ["0", "0", "0"]
        assert conf.get("spark.locality.wait.node") == "5s"
        assert not conf.contains("spark.locality.wait.process")
    finally:
        conf.remove("spark.locality.wait.node")


@pytest.mark.slow
def test_cached_data_is_counted_once_until_it_is_cached_anew_or_a_call_on_it_failed(spark, monkeypatch):
    """A count is a Spark job (half a second or more here, a fifth of benchmark B1's feed; an RDD's unpickles every
    row): the next ``train()`` on the same cached DataFrame or RDD uses the counts of the first; a DataFrame cached
    anew (its data may have changed) or after a call on it failed, it is counted again; uncached data is never
    kept."""
    jobs = []
    real = counts._partition_rows
    monkeypatch.setattr(counts, "_partition_rows", lambda data, run: jobs.append(1) or real(data, run))

    def run(action):
        return action()

    df = spark.range(0, 1000, numPartitions=3).cache()
    try:
        first = counts.partition_rows(df, run)
        assert sum(first.values()) == 1000 and len(jobs) == 1
        assert counts.partition_rows(df, run) == first and len(jobs) == 1  # kept
        assert counts.partition_rows(spark.range(0, 1000, numPartitions=3).cache(), run) == first
        assert len(jobs) == 1  # the same plan: the same cached data
        counts.forget(df)
        assert counts.partition_rows(df, run) == first and len(jobs) == 2
        df.unpersist(blocking=True)
        df.cache()
        assert counts.partition_rows(df, run) == first and len(jobs) == 3  # cached anew
    finally:
        df.unpersist()
    plain = spark.range(0, 10, numPartitions=2)
    counts.partition_rows(plain, run)
    counts.partition_rows(plain, run)
    assert len(jobs) == 5
    rdd = spark.sparkContext.parallelize(range(100), 4)  # an RDD: counted in Python, every row unpickled
    assert counts.partition_rows(rdd, run) == {0: 25, 1: 25, 2: 25, 3: 25} and len(jobs) == 6
    rdd.cache()
    try:
        assert counts.partition_rows(rdd, run) == {0: 25, 1: 25, 2: 25, 3: 25} and len(jobs) == 7
        assert counts.partition_rows(rdd, run) == {0: 25, 1: 25, 2: 25, 3: 25} and len(jobs) == 7  # kept
        counts.forget(rdd)
        assert counts.partition_rows(rdd, run) == {0: 25, 1: 25, 2: 25, 3: 25} and len(jobs) == 8
    finally:
        rdd.unpersist()
