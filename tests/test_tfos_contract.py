"""TensorFlowOnSpark programs, written the way its examples and tests are, on real Spark and TensorFlow.

Covers the feed's early-stop contract, results as the nodes return them, and the
public-API behaviours of TensorFlowOnSpark's ``tests/test_TFCluster.py``.

One ``local-cluster[2,1,1024]`` session for the module.  Most node functions here
import no TensorFlow (the feed path does not need it), so a cluster starts in a
few seconds; the Keras ones are tiny (digits, one dense layer).
"""

from __future__ import annotations

import functools
import sys

import cloudpickle
import numpy as np
import pytest

from tests.conftest import NODE_ENV, StreamSource, spark_fixture, start_cluster, wait_until
from tfos_nb import TFCluster, TFNode
from tfos_nb.examples import digits

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPARK = TFCluster.InputMode.SPARK


spark = spark_fixture(2, callback_server=True)  # foreachBatch's py4j port is Spark's, not a leak


run = functools.partial(start_cluster, input_mode=SPARK)


# ---------------------------------------------------------------------------
# 1. The early-stop contract: a node that stops reading (terminate() or return) skips what is still routed to it
# ---------------------------------------------------------------------------


def read_then_stop(args, ctx):
    """Read ``args['rows']`` rows (per node, or a list by node), then terminate() (or just return); maybe crash."""
    feed = TFNode.DataFeed(ctx.mgr, False)
    want = args["rows"][ctx.worker_num] if isinstance(args["rows"], list) else args["rows"]
    got = 0
    while got < want and not feed.should_stop():
        batch = feed.next_batch(min(10, want - got))
        if not batch:
            break
        got += len(batch)
    print("read", got, flush=True)
    crash = args.get("crash") == ctx.worker_num
    if crash and args.get("crash_before_terminate"):
        raise ValueError(f"boom while reading, after {got} rows")
    if args.get("terminate", True):
        feed.terminate()
    if crash:
        raise ValueError(f"boom after terminate, after {got} rows")


CASES = {
    # name: (rows read per node before it stops, terminate()?, rows, partitions, num_epochs, input)
    "terminate mid-epoch 1": (20, True, 400, 8, 2, "rdd"),
    "terminate after epoch 1": (200, True, 400, 8, 3, "df"),
    "return without terminate": (50, False, 400, 8, 4, "df"),
    "one node done while the other still reads": ([10, 10**9], True, 400, 8, 2, "rdd"),
    "reads 10% then terminate": (500, True, 10000, 4, 1, "rdd"),  # the 10 % of 20,000 over 4 partitions
}


def source(sc, rows, parts, kind):
    rdd = sc.parallelize(rows, parts)
    return rdd if kind == "rdd" else rdd.toDF(["id", "x"])


@pytest.mark.parametrize("case", list(CASES))
def test_node_that_stops_reading_skips_the_rest(sc, case, no_leaks):
    read, terminate, total, parts, epochs, kind = CASES[case]
    rows = [(i, float(i)) for i in range(total)]
    with run(sc, read_then_stop, {"rows": read, "terminate": terminate}) as cluster:
        cluster.train(source(sc, rows, parts, kind), num_epochs=epochs)  # failed: "connection closed by peer"
        feed = dict(cluster.last_feed)
    assert feed["rows"] + feed["skipped"] == total * epochs, feed
    assert feed["skipped"] > 0 and feed["partitions"] == parts * epochs, feed
    assert cluster.status().state == "finished"


@pytest.mark.parametrize("before_terminate", [True, False], ids=["crash while reading", "crash after terminate"])
def test_node_crashing_in_the_same_window_is_that_nodes_error(sc, before_terminate, no_leaks):
    rows = [(i, float(i)) for i in range(400)]
    args = {"rows": 20, "crash": 0, "crash_before_terminate": before_terminate}
    with pytest.raises(TFCluster.TFClusterError) as err:  # from train(), or from shutdown() when train() ended first
        with run(sc, read_then_stop, args) as cluster:
            cluster.train(sc.parallelize(rows, 8), num_epochs=3)
    assert err.value.node == "worker:0", str(err.value)
    assert "ValueError: boom" in str(err.value)


def test_tfestimator_epochs_over_nodes_that_terminate(sc, no_leaks):
    from tfos_nb.pipeline import TFEstimator, TFModel

    df = sc.parallelize([(i, float(i)) for i in range(400)], 8).toDF(["id", "x"])
    est = TFEstimator(read_then_stop, {"rows": 20}, env=NODE_ENV).setInputMapping({"id": "id", "x": "x"})
    model = est.setClusterSize(2).setEpochs(3).fit(df)  # the same train path: failed the same way
    assert isinstance(model, TFModel)


def Source(root):  # a StreamSource of this module's rows
    return StreamSource(root, "id LONG, x DOUBLE", lambda i: {"id": i, "x": i / 10})


def stream_reader(args, ctx):
    """TensorFlowOnSpark's streaming example's node: read until should_stop() — here it stops after a few rows."""
    feed = TFNode.DataFeed(ctx.mgr)
    seen = 0
    while not feed.should_stop() and seen < args["rows"]:
        batch = feed.next_batch(10)
        assert all(isinstance(r.id, int) for r in batch)  # a streaming DataFrame's rows, fields by name
        seen += len(batch)
    feed.terminate()
    print("seen", seen, flush=True)


def test_training_stream_skips_what_stopped_nodes_no_longer_read(spark, tmp_path, no_leaks):
    src = Source(tmp_path)
    for _ in range(3):
        src.write(50)
    cluster = run(spark.sparkContext, stream_reader, {"rows": 30})
    try:
        feed = cluster.train_stream(src.stream(spark))
        feed.process_all_available()  # every micro-batch fed or skipped, none failed
        assert feed.rows + feed.skipped == 150 and feed.skipped >= 90, feed.stats
        cluster.request_stop()  # TensorFlowOnSpark's reservation.Client(...).request_stop()
        assert not feed.is_active and cluster.streams == ()
    finally:
        cluster.shutdown(timeout=-1)  # -1: wait for ever (TensorFlowOnSpark)
    assert [n.state for n in cluster.nodes] == ["finished", "finished"]


def mnist_spark_fun(args, ctx):
    """TensorFlowOnSpark's examples/mnist/keras/mnist_spark.py, on digits (8x8) with a one-layer model."""
    import numpy as np
    import tensorflow as tf

    from tfos_nb import TFNode

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf_feed = TFNode.DataFeed(ctx.mgr, False)

    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch) > 0:
                example = batch[0]
                yield np.array(example[0]).astype(np.float32), np.reshape(np.array(example[1], np.float32), (1,))
            else:
                return

    ds = tf.data.Dataset.from_generator(
        rdd_generator, output_signature=(tf.TensorSpec([64], tf.float32), tf.TensorSpec([1], tf.float32))
    ).batch(args["batch_size"])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(10, activation="softmax", input_shape=(64,))])
        model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.SGD(0.5),
                      metrics=["accuracy"])
    # As the example: stop at 90 % of the steps the data allows, so no worker runs out of data.
    steps_per_epoch_per_worker = args["rows"] / args["batch_size"] / ctx.num_workers
    hist = model.fit(ds, epochs=args["epochs"], steps_per_epoch=int(steps_per_epoch_per_worker * 0.9), verbose=0)
    if ctx.job_name == "chief":
        np.save(args["export"], np.asarray(hist.history["loss"]))
    tf_feed.terminate()


def test_mnist_spark_keras_example_shape(sc, tmp_path, no_leaks):
    xtr, ytr, _, _ = digits.load_digits_arrays()
    rows = list(zip(xtr.tolist(), ytr.tolist()))
    export = str(tmp_path / "losses.npy")
    args = {"batch_size": 32, "epochs": 4, "rows": len(rows), "export": export}
    cluster = TFCluster.run(sc, mnist_spark_fun, args, 2, num_ps=0, input_mode=SPARK, master_node="chief",
                            env=NODE_ENV)
    cluster.train(sc.parallelize(rows, 8), args["epochs"])  # failed in epoch 2: "connection closed by peer"
    cluster.shutdown()
    assert cluster.last_feed["skipped"] > 0 and cluster.last_feed["rows"] >= 0.9 * 4 * len(rows) * 0.9
    losses = np.load(export)
    assert len(losses) == 4 and losses[-1] < losses[0], losses


# ---------------------------------------------------------------------------
# TensorFlowOnSpark's tests/test_TFCluster.py, behaviour by behaviour
# ---------------------------------------------------------------------------


def basic_tf_fun(args, ctx):
    import tensorflow as tf

    x = tf.constant(args["x"])
    y = tf.constant(args["y"])
    assert tf.math.add(x, y).numpy() == 3
    feed = TFNode.DataFeed(ctx.mgr, False)  # InputMode.TENSORFLOW: an empty feed, not an error
    assert feed.should_stop() and feed.next_batch(5) == []


def test_basic_tf(sc, no_leaks):
    cluster = TFCluster.run(sc, basic_tf_fun, tf_args={"x": 1, "y": 2}, num_executors=2, num_ps=0, env=NODE_ENV)
    cluster.shutdown(timeout=-1)
    assert [n.state for n in cluster.nodes] == ["finished", "finished"], [n.error for n in cluster.nodes]


def square_fun(args, ctx):
    """test_inputmode_spark's node; DataFrame rows (id, x) are answered with per-row tuples (id, x*x)."""
    import tensorflow as tf

    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(batch_size=10)
        if not batch:
            continue
        if hasattr(batch[0], "id"):
            tf_feed.batch_results([(r.id, int(r.x) ** 2) for r in batch])
        else:
            tf_feed.batch_results(tf.math.square(batch).numpy())


def test_inputmode_spark_results_keep_their_type_and_map_onto_schemas(spark, sc, tmp_path, no_leaks):
    import time

    cluster = run(sc, square_fun, {})
    try:
        rdd_out = cluster.inference(sc.parallelize([[x] for x in range(1000)], 10))
        assert rdd_out.sum() == sum(x * x for x in range(1000))  # numpy rows, as the nodes answered
        # Spark runs the uncached inference again for each action, also after one stopped reading early.
        t0 = time.monotonic()
        assert [int(v[0]) for v in rdd_out.take(3)] == [0, 1, 4]
        assert rdd_out.count() == 1000
        assert time.monotonic() - t0 < 60  # was: a hang of more than 300 s
        df = sc.parallelize([(i, i) for i in range(100)], 4).toDF(["id", "x"])
        out = cluster.inference(df, schema="id LONG, y LONG")  # failed: UNSUPPORTED_ARROWTYPE FixedSizeList(2)
        assert sorted(tuple(r) for r in out.collect()) == [(i, i * i) for i in range(100)]
        with pytest.raises(Exception, match=r"rows have 2 value\(s\) but the schema has 3 column"):
            cluster.inference(df, schema="id LONG, y LONG, z LONG").collect()
        stream = Source(tmp_path)
        stream.write(40)
        query = cluster.inference_stream(stream.stream(spark), "id LONG, y LONG", "memory", query_name="squares")
        query.process_all_available()
        got = sorted(tuple(r) for r in spark.sql("SELECT * FROM squares").collect())
        assert got == [(i, int(i / 10) ** 2) for i in range(40)]
        query.stop()
    finally:
        cluster.shutdown()


def square_unguarded_fun(args, ctx):
    """test_inputmode_spark's node as TensorFlowOnSpark writes it: every batch is answered, an empty one too."""
    import numpy as np

    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    # what the loop below answers when next_batch() found nothing yet (a loaded machine): made certain here
    tf_feed.batch_results(np.square(np.array([])))
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(batch_size=10)
        tf_feed.batch_results(np.square(np.array(batch)))


def test_inputmode_spark_node_answering_an_empty_batch_goes_on(sc, no_leaks):
    # was: batch_results() of the empty array raised IndexError in columns._flat_lists, the node died
    cluster = run(sc, square_unguarded_fun, {})
    try:
        assert cluster.inference(sc.parallelize([[x] for x in range(100)], 4)).sum() == sum(x * x for x in range(100))
    finally:
        cluster.shutdown()
    assert [n.state for n in cluster.nodes] == ["finished", "finished"], [n.error for n in cluster.nodes]


def failing_feed_fun(args, ctx):
    import time

    import tensorflow as tf

    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(10)
        if len(batch) > 0:
            tf_feed.batch_results(tf.math.square(batch).numpy())
            if args["early"]:
                raise Exception("FAKE exception during feeding")
    time.sleep(2)  # post-feed work, then the failure
    raise Exception("FAKE exception after feeding")


def test_inputmode_spark_exception(sc, no_leaks):
    rdd = sc.parallelize([[x] for x in range(1000)], 10)
    cluster = run(sc, failing_feed_fun, {"early": True})
    try:
        # TensorFlowOnSpark's test passes feed_timeout=1: on a loaded machine no batch then reaches a node
        # within the second, the node sees an ended feed and raises its *after* feeding error (issue 18);
        # with room to deliver, the node always fails while fed and the feeders carry its error
        with pytest.raises(Exception):  # noqa: B017 - as TensorFlowOnSpark's test: the node's error
            cluster.inference(rdd, feed_timeout=60).count()
    finally:
        with pytest.raises(TFCluster.TFClusterError, match="FAKE exception during feeding") as err:
            cluster.shutdown()
    assert err.value.node in ("worker:0", "worker:1")


def test_inputmode_spark_late_exception(sc, no_leaks):
    rdd = sc.parallelize([[x] for x in range(1000)], 10)
    cluster = run(sc, failing_feed_fun, {"early": False})
    try:
        assert cluster.inference(rdd).count() == 1000
    finally:
        with pytest.raises(TFCluster.TFClusterError, match="FAKE exception after feeding") as err:
            cluster.shutdown(grace_secs=5)
    assert err.value.node in ("worker:0", "worker:1")


# ---------------------------------------------------------------------------
# Issue 17: feeding defaults and forms
# ---------------------------------------------------------------------------


def row_reader(args, ctx):
    feed = TFNode.DataFeed(ctx.mgr, False)
    if ctx.job_name == "ps":  # a ps node gets an empty feed (TensorFlowOnSpark's examples make one everywhere)
        assert feed.should_stop() and feed.next_batch(5) == []
        return
    seen = 0
    while not feed.should_stop():
        for row in feed.next_batch(100):
            assert type(row).__name__ == "Row" and row.label == row["label"] == row[1], row
            seen += 1
    print("rows seen", seen, flush=True)


def test_df_rdd_rows_arrive_as_rows_and_train_feeds_ten_times_by_default(spark, sc, no_leaks):
    from pyspark.streaming import StreamingContext

    df = sc.parallelize([(float(i), i % 10) for i in range(50)], 2).toDF(["x", "label"])
    ssc = StreamingContext(sc, 1)
    cluster = run(sc, row_reader, {}, num_ps=1)
    try:
        dstream = ssc.queueStream([sc.parallelize([1, 2])])
        with pytest.raises(TypeError, match=r"train_stream\(\)"):  # DStreams: refused up front
            cluster.train(dstream, feed_timeout=60)
        cluster.train(df.rdd)  # TensorFlowOnSpark's default: 10 epochs
        assert cluster.last_feed == {"rows": 500, "skipped": 0, "partitions": 20, "shared": 500}
    finally:
        cluster.shutdown(ssc)  # a StreamingContext is accepted (and stopped)
    assert wait_until(lambda: "rows seen 500" in cluster.logs("worker:0")["worker:0"], 5)
    assert [n.state for n in cluster.nodes] == ["finished", "finished"], [n.error for n in cluster.nodes]
