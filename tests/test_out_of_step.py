"""Issue 41, item 1: a node that reads its feed out of step with the job ends in a named error, or trains correctly.

Nodes under MultiWorkerMirroredStrategy step together, so a node that iterates its ``as_dataset`` stream once
more than the job feeds (a full pass before ``fit``, a second dataset on the same feed) waits for an epoch
nobody sends while its peer waits for it in a step, holding rows of the last fed epoch: the feeding tasks of
that epoch wait for rows to be read, ``train()`` for them (a silent hang until ``feed_timeout`` before the
fix).  The node that read ahead is the one named — its role, what it asked for, what the job feeds — and the
error comes within seconds of the stall (the feed's ``AHEAD_S``), not at ``feed_timeout`` (here 150 s, so the
code before the fix fails the test in bounded time).  ``model.fit(epochs=E+1)`` on a job of E epochs reads the
extra epoch in step on every node: nothing is waited for, it gets no rows and training ends correctly.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from tests.conftest import binary_frame, spark_fixture, start_cluster
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = spark_fixture(2)
ROWS, EPOCHS = 1600, 3


@pytest.fixture(scope="module")
def train_df(spark):
    return binary_frame(spark, ROWS, 8, 2, 4)


def mwms_fun(args, ctx):
    """A Keras tutorial's MultiWorkerMirroredStrategy program, read from the feed; ``args["misstep"]`` says how
    it reads the stream out of step."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="adam", loss="binary_crossentropy")
    feed = ctx.get_data_feed()
    ds = feed.as_dataset(batch_size=64, columns=(0, 1))
    epochs = args["epochs"]
    if args["misstep"] == "pass_before_fit" and ctx.job_name == "chief":
        print("looked at", sum(int(x.shape[0]) for x, _ in ds), "rows before fit", flush=True)
    elif args["misstep"] == "second_dataset" and ctx.job_name == "chief":
        for _ in feed.as_dataset(batch_size=64, columns=(0, 1)):  # e.g. to count or plot the data first
            pass
    elif args["misstep"] == "one_epoch_more":
        epochs += 1
    hist = model.fit(ds, epochs=epochs, callbacks=[ctx.progress_callback()], verbose=0)
    print("fit done:", len(hist.history["loss"]), "epochs", flush=True)


@pytest.mark.parametrize("misstep", ["pass_before_fit", "second_dataset"])
def test_a_node_reading_ahead_of_the_job_is_named(sc, train_df, misstep, no_leaks):
    cluster = start_cluster(sc, mwms_fun, {"epochs": EPOCHS, "misstep": misstep}, 2,
                            input_mode=TFCluster.InputMode.SPARK, master_node="chief")
    with pytest.raises(Exception) as info:  # the message is what is asserted
        try:
            cluster.train(train_df, num_epochs=EPOCHS, feed_timeout=150)
        finally:
            cluster.shutdown(timeout=120)
    text = str(info.value)
    assert "chief:0" in text and "epoch 4" in text and f"feeds {EPOCHS} epochs" in text, text
    assert "worker:0 failed" not in text, text  # the chief is at fault, not its peer that waited for it
    chief = next(n for n in cluster.nodes if n.label == "chief:0")
    assert chief.state == "failed" and "epoch 4" in chief.error, (chief.state, chief.error)
    # it was the out-of-step check that ended it, not the feeding tasks' timeout
    assert "timed out" not in text and "feed_timeout" not in text, text


def test_one_epoch_more_than_fed_reads_nothing_and_trains_every_row_once(sc, train_df, no_leaks):
    cluster = start_cluster(sc, mwms_fun, {"epochs": EPOCHS, "misstep": "one_epoch_more"}, 2,
                            input_mode=TFCluster.InputMode.SPARK, master_node="chief")
    cluster.train(train_df, num_epochs=EPOCHS, feed_timeout=150)
    cluster.shutdown(timeout=120)
    assert cluster.last_feed == {"rows": EPOCHS * ROWS, "skipped": 0, "partitions": EPOCHS * 4,
                                 "shared": EPOCHS * ROWS}
    assert cluster.status().state == "finished"
    logs = cluster.logs(tail=None)
    assert all(any("fit done:" in line for line in lines) for lines in logs.values()), logs


def test_a_node_given_no_rows_trains_in_step_with_its_peer(sc, train_df, no_leaks):
    """One partition for two nodes: one node gets every row, the other none. Its ``as_dataset()`` has no row to
    build its signature from; it takes it from the DataFrame's schema (the driver sends it with the epochs) and
    steps with empty batches while its peer reads — it waited for a first row until ``feed_timeout`` before."""
    one = train_df.coalesce(1)
    cluster = start_cluster(sc, mwms_fun, {"epochs": 2, "misstep": None}, 2,
                            input_mode=TFCluster.InputMode.SPARK, master_node="chief")
    try:
        cluster.train(one, num_epochs=2, feed_timeout=150)
    finally:
        cluster.shutdown(timeout=120)
    assert cluster.last_feed == {"rows": 2 * ROWS, "skipped": 0, "partitions": 2, "shared": 2 * ROWS}
    assert cluster.status().state == "finished"
    logs = cluster.logs(tail=None)
    assert all(any("fit done: 2 epochs" in line for line in lines) for lines in logs.values()), logs
