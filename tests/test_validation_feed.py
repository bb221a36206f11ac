"""Issue 50: validation data from a DataFrame, as named sets (``train(df, validation=val_df)``, ``qname``).

The cluster tests are a data scientist's notebook: ``train_df, val_df = df.randomSplit([0.8, 0.2])``, Keras'
``model.fit(train, validation_data=val, epochs=E)`` under MultiWorkerMirroredStrategy, the validation set in
fewer or more partitions than nodes (a node with no validation row of its own).  Keras' ``val_*`` values must be
the whole validation set's, every row once: the test evaluates the final weights on the collected set itself.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import numpy as np
import pytest

from tests.conftest import binary_frame, spark_fixture, start_cluster
from tfos_nb import TFCluster, TFNode

cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROWS, EPOCHS = 1200, 3

spark = spark_fixture(3)


def fit_with_validation(args, ctx):
    """Keras 3 (``import keras``), as its guides write ``fit`` with validation data, fed by tfos_nb."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    train = ctx.get_data_feed().as_dataset(batch_size=64, columns=(0, 1))
    val = ctx.get_data_feed(qname_in="validation").as_dataset(batch_size=50, columns=(0, 1))
    hist = model.fit(train, validation_data=val, epochs=args["epochs"], validation_freq=args["freq"],
                     callbacks=[ctx.progress_callback()], verbose=0)
    test = ctx.get_data_feed(qname_in="test").as_dataset(batch_size=50, columns=(0, 1))  # after fit: a third set
    tested = model.evaluate(test, verbose=0, return_dict=True)
    return {"history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
            "weights": [w.tolist() for w in model.get_weights()], "test": {k: float(v) for k, v in tested.items()}}


def _reference(weights, val_rows):
    """The final weights evaluated on the whole validation set, in one process: what val_* must be."""
    import keras

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    model.set_weights([np.array(w, dtype="float32") for w in weights])
    x = np.array([r.x for r in val_rows], dtype="float32")
    y = np.array([r.y for r in val_rows], dtype="float32")
    return model.evaluate(x, y, batch_size=len(y), verbose=0, return_dict=True)


@pytest.mark.slow
@pytest.mark.parametrize(("nodes", "val_partitions", "epochs", "freq"), [(2, 3, EPOCHS, 1), (3, 2, 4, 2)],
                         ids=["2-nodes-3-partitions", "3-nodes-2-partitions-every-2nd-epoch"])
def test_fit_validates_on_the_whole_validation_set_every_epoch(sc, spark, nodes, val_partitions, epochs, freq,
                                                               no_leaks):
    """Keras validates at the epochs validation_freq says (every 2nd: the set's rows wait on the nodes, nothing
    waits for them); each time on the whole set."""
    df = binary_frame(spark, ROWS, 16, 4, 6)
    train_df, val_df, test_df = df.randomSplit([0.7, 0.2, 0.1], seed=7)
    train_df, val_df, test_df = train_df.cache(), val_df.repartition(val_partitions).cache(), test_df.cache()
    val_rows, test_rows = val_df.collect(), test_df.collect()
    cluster = start_cluster(sc, fit_with_validation, {"epochs": epochs, "freq": freq}, nodes,
                            input_mode=TFCluster.InputMode.SPARK, master_node="chief")
    try:
        cluster.train(train_df, num_epochs=epochs, feed_timeout=120, validation=val_df, feeds={"test": test_df})
        held = cluster._controller.set_rows("validation")
    finally:
        cluster.shutdown(timeout=240)
    assert cluster.status().state == "finished"
    values = cluster.state.values()
    chief = values["chief:0"]
    history = chief["history"]
    assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"], history
    validated = [e for e in range(1, epochs + 1) if e % freq == 0]  # Keras' epochs (from 1) that validate
    assert len(history["loss"]) == epochs and len(history["val_loss"]) == len(validated), history
    assert all(v["history"] == history for v in values.values())  # one model: the same values on every node
    # every validation row once, on some node; fed once, not once per epoch
    assert cluster.last_sets["validation"] == {"rows": len(val_rows), "skipped": 0,
                                                 "partitions": val_partitions, "shared": len(val_rows)}
    assert cluster.last_sets["test"]["rows"] == len(test_rows)
    assert sum(held.values()) == len(val_rows) and len(held) <= min(nodes, val_partitions), held
    ref = _reference(chief["weights"], val_rows)
    assert history["val_accuracy"][-1] == pytest.approx(ref["accuracy"], abs=1e-6), (history, ref)
    assert history["val_loss"][-1] == pytest.approx(ref["loss"], rel=1e-4), (history, ref)
    tested = _reference(chief["weights"], test_rows)  # model.evaluate on the fed test set, after fit
    assert chief["test"]["accuracy"] == pytest.approx(tested["accuracy"], abs=1e-6), (chief["test"], tested)
    assert chief["test"]["loss"] == pytest.approx(tested["loss"], rel=1e-4), (chief["test"], tested)
    # the panel's epoch reports are Keras' own values, val_* included
    ends = {m["epoch"]: m for role, _, _, _, _, m in cluster.state.history() if role == "chief" and "val_loss" in m}
    assert sorted(ends) == validated, ends
    for i, epoch in enumerate(validated):
        for key in ("val_loss", "val_accuracy"):
            assert ends[epoch][key] == pytest.approx(history[key][i], rel=1e-6), (epoch, ends, history)


def tfos_two_queues(args, ctx):
    """A TensorFlowOnSpark program reading two queues with TFNode.DataFeed: the validation rows, then training."""
    val_feed = TFNode.DataFeed(ctx.mgr, True, qname_in="validation")
    val_ids = []
    while not val_feed.should_stop():
        batch = val_feed.next_batch(7)
        val_ids.extend(int(row[0]) for row in batch)
    again_feed = ctx.get_data_feed(qname_in="validation")  # a new DataFeed reads the set from its first row
    again = [len(b[0]) for b in iter(lambda: again_feed.next_batch_arrays(1000), ())]
    train_feed = TFNode.DataFeed(ctx.mgr, True)
    train_ids = []
    while not train_feed.should_stop():
        batch = train_feed.next_batch(10)
        if not batch:
            break
        train_ids.extend(int(row[0]) for row in batch)
    return {"val": val_ids, "again": again, "train": train_ids}


@pytest.mark.slow
def test_a_tensorflowonspark_program_feeds_and_reads_two_queues(sc, no_leaks):
    val_rdd = sc.parallelize([(i,) for i in range(90)], 4)
    train_rdd = sc.parallelize([(1000 + i,) for i in range(200)], 4)
    cluster = start_cluster(sc, tfos_two_queues, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        cluster.train(val_rdd, 2, feed_timeout=120, qname="validation")  # TFoS: two epochs of this queue
        cluster.train(train_rdd, 1, feed_timeout=120)
    finally:
        cluster.shutdown(timeout=120)
    values = cluster.state.values().values()
    val_ids = sorted(i for v in values for i in v["val"])
    assert val_ids == sorted(list(range(90)) * 2)  # each node its own share, twice (num_epochs=2), nothing more
    assert all(sum(v["again"]) == len(v["val"]) for v in values)  # a new DataFeed reads the set again
    assert sorted(i for v in values for i in v["train"]) == list(range(1000, 1200))  # none in the training feed
    assert cluster.last_sets == {"validation": {"rows": 90, "skipped": 0, "partitions": 4, "shared": 90}}


def reads_an_unfed_set(args, ctx):
    ctx.get_data_feed(qname_in="test").as_dataset(batch_size=8)


@pytest.mark.slow
def test_a_node_reading_a_set_nobody_feeds_is_named_not_waited_on(sc, spark, no_leaks):
    train_df = spark.range(40).selectExpr("cast(id as float) as x")
    cluster = start_cluster(sc, reads_an_unfed_set, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    with pytest.raises(Exception) as err:
        try:
            cluster.train(train_df, 1, feed_timeout=60, validation=spark.range(10).selectExpr("cast(id as float) as x"))
        finally:
            cluster.shutdown(timeout=60)
    text = str(err.value)
    assert "reads the feed 'test', which the running train() does not feed (it feeds 'input', 'validation')" in text, text
    assert cluster.status().state == "failed"


@pytest.mark.slow
def test_a_set_whose_columns_differ_is_refused_before_any_job(spark):
    from tfos_nb.runtime.driver.feeding.named_sets import named_sets

    train_df = spark.range(4).selectExpr("cast(id as float) as x", "id as y")
    with pytest.raises(ValueError, match=r"^the set 'validation' has columns \(y bigint, x float\) and the training "
                                         r"data \(x float, y bigint\): the nodes read both the same way"):
        named_sets(train_df, "input", train_df.select("y", "x"), None)
    with pytest.raises(ValueError, match="'input' is the training feed's name"):
        named_sets(train_df, "input", None, {"input": train_df})
    with pytest.raises(ValueError, match="a feed's name is letters"):
        named_sets(train_df, "input", None, {"../x": train_df})
    with pytest.raises(ValueError, match=r"train\(qname='validation'\) feeds its data as that named set"):
        named_sets(train_df, "validation", train_df, None)
    assert list(named_sets(train_df, "input", train_df, {"test": train_df})) == ["validation", "test"]


def test_spool_keeps_each_partition_once(tmp_path):
    """The node's sets without Spark: a connection cut short leaves nothing, a retry replaces its partition."""
    import socket

    import pyarrow as pa

    from tfos_nb.runtime.executor.feed.conn import Conn
    from tfos_nb.runtime.executor.feed.named_sets import NamedFeeds, NamedReader

    feeds = NamedFeeds("worker:0", lambda: False, root=str(tmp_path))

    def conn(partition):
        a, b = socket.socketpair()
        b.close()
        return Conn(a, {"partition": partition, "gen": 1, "feed": "validation"})

    def batch(*ids):
        return pa.record_batch([pa.array(list(ids), pa.int64())], names=["id"])

    first = conn(0)
    feeds.put(first, 1, batch(1, 2))
    feeds.drop(first, "broken")  # cut short: nothing kept
    for _ in range(2):  # Spark's retry, and a second retry after a success: the file is replaced, not added
        again = conn(0)
        feeds.put(again, 1, batch(1, 2))
        feeds.put(again, 1, batch(3))
        feeds.end_conn(again)
    other = conn(2)
    feeds.put(other, 1, batch(7))
    feeds.end_conn(other)
    assert sorted(os.listdir(tmp_path / "validation" / "1")) == ["p0.arrow", "p2.arrow"]
    feeds.update({"validation": {"version": 1, "parts": [2, 0], "passes": 2, "sample": {}}})
    reader = NamedReader(feeds, "validation")
    pass_one, pass_two = [0], [0]
    assert [b.column(0).to_pylist() for _, b in reader.take(3, True, pass_one)] == [[1, 2], [3]]
    assert [b.column(0).to_pylist() for _, b in reader.take(3, True, pass_two)] == [[1, 2], [3]]  # its own pass
    assert reader.take(3, True, pass_one) == []  # cut short (validation_steps): it ended when the next began
    assert [b.column(0).to_pylist() for _, b in reader.take(3, True, pass_two)] == [[7]]
    assert reader.take(3, True, pass_two) == []
    rows = []
    while not reader.drained():
        rows += [v for _, b in reader.take(2, True) for v in b.column(0).to_pylist()]
    assert rows == [1, 2, 3, 7] * 2  # passes=2: a sequential read goes through the set twice
    # the rows handed to TensorFlow live in this process's memory, never in a read-only map of the file: TensorFlow
    # writes into an input tensor's buffer when it reuses it (the autolog notebook's node died of SIGSEGV)
    held = [b for _, b in NamedReader(feeds, "validation").take(10, True, [0])]
    files = {str(p) for p in (tmp_path / "validation" / "1").iterdir()}
    assert held and not [name for name in _mappings(held) if name in files], _mappings(held)
    # the next train() call feeds the set again while a pass over this one is still read (the nodes validate the
    # previous call's last epoch): that pass reads on; versions before the previous one go once a newer one is in
    reading = NamedReader(feeds, "validation")
    in_flight = [0]
    assert [b.column(0).to_pylist() for _, b in reading.take(2, True, in_flight)] == [[1, 2]]
    for version in (2, 3):
        again = conn(0)
        again.gen = version
        feeds.update({"validation": {"version": version, "parts": None, "passes": 1, "sample": {}}})
        feeds.put(again, version, batch(10 * version))
        feeds.end_conn(again)
        feeds.update({"validation": {"version": version, "parts": [0], "passes": 1, "sample": {}}})
        if version == 2:
            assert [b.column(0).to_pylist() for _, b in reading.take(5, True, in_flight)] == [[3], [7]]
    assert sorted(os.listdir(tmp_path / "validation")) == ["2", "3"]
    assert [b.column(0).to_pylist() for _, b in reading.take(5, True, [0])] == [[30]]
    feeds.update({"test": {"version": 4, "parts": [], "passes": 1, "sample": {}}})  # no partition of it came here
    feeds.close()
    assert not tmp_path.exists()


def test_passes_cut_short_are_freed_when_the_next_begins(tmp_path):
    """Keras' ``validation_steps`` stops each epoch's pass over the set early: the pass before is freed when the
    next begins (its file closed, its batch dropped), so 60 epochs keep one pass and one file open, not 60; a full
    pass still reads every row once."""
    import socket

    import pyarrow as pa

    from tfos_nb.runtime.executor.feed.conn import Conn
    from tfos_nb.runtime.executor.feed.named_sets import NamedFeeds, NamedReader

    feeds = NamedFeeds("worker:0", lambda: False, root=str(tmp_path))
    for partition in (0, 1):
        a, b = socket.socketpair()
        b.close()
        conn = Conn(a, {"partition": partition, "gen": 1, "feed": "validation"})
        for lo in range(0, 40, 10):
            feeds.put(conn, 1, pa.record_batch([pa.array(range(100 * partition + lo, 100 * partition + lo + 10))],
                                               names=["id"]))
        feeds.end_conn(conn)
    feeds.update({"validation": {"version": 1, "parts": [0, 1], "passes": 1, "sample": {}}})
    reader = NamedReader(feeds, "validation")

    def open_files():  # this process's descriptors on the set's files
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
            except OSError:  # closed meanwhile
                pass
        return n

    before = open_files()
    for _ in range(60):
        assert [b.num_rows for _, b in reader.take(15, True, [0])] == [10, 5]  # a step's batch, then Keras stops
    assert open_files() - before <= 1 and len(reader._passes) <= 1
    whole, rows = [0], []
    while pieces := reader.take(15, True, whole):
        rows += [v for _, b in pieces for v in b.column(0).to_pylist()]
    assert rows == [*range(40), *range(100, 140)]
    assert open_files() == before and reader._passes == {}
    feeds.close()


def _mappings(batches):
    """The file each batch buffer's memory is mapped from ('' for anonymous memory), from /proc/self/maps."""
    regions = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            regions.append((start, end, parts[5].strip() if len(parts) > 5 else ""))
    names = []
    for batch in batches:
        for column in batch.columns:
            for buf in column.buffers():
                if buf is not None and buf.size:
                    names += [name for start, end, name in regions if start <= buf.address < end]
    return names
