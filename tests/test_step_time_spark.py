"""Where each node's time goes, on a real cluster (real Spark local-cluster, real TensorFlow, a real IPython shell):
a slow callback on one node is named on that node ("outside steps") and its peer, held in the collective, "waits
on peers"; a slow Spark computation upstream of the feed makes the nodes "wait for input".  What the panel says is
what ``NAME.history``'s ``time_*`` columns say at the last report.
"""

from __future__ import annotations

import sys
import textwrap
import time

import cloudpickle
import pytest

from tests.conftest import global_shell_with, spark_fixture
from tfos_nb.examples.digits import load_digits_arrays, to_dataframe
from tfos_nb.runtime import step_time

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = spark_fixture(2)

# a data scientist's cell: the quickstart's model, with a callback that sleeps on one node (a slow checkpoint, a
# remote logger) when asked
CELL = textwrap.dedent("""
    import time
    import tensorflow as tf
    from tfos_nb.examples.digits import build_model

    class Sleepy(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if f"{ctx.job_name}:{ctx.task_index}" == args["sleepy"]:
                time.sleep(args["sleep"])

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
    ds = ctx.get_data_feed().as_dataset(batch_size=32)
    model.fit(ds, epochs=args["epochs"], verbose=0, callbacks=[ctx.progress_callback(), Sleepy()])
""")


@pytest.fixture(scope="module")
def ip(spark):
    yield from global_shell_with(spark, "timed")


@pytest.fixture(scope="module")
def digits_df(spark):
    x, y, _, _ = load_digits_arrays()
    return to_dataframe(spark, x, y, partitions=4).cache()


def last_shares(handle, node: str) -> dict[str, float]:
    """The ``time_*`` columns of ``node``'s last row in ``NAME.history`` that has them."""
    h = handle.history
    rows = h[(h["node"] == node) & h["time_input"].notna()]
    assert len(rows), h
    last = rows.iloc[-1]
    return {c: float(last[f"time_{c}"]) for c in step_time.CATEGORIES}


def run_cell(ip, line: str, args: dict) -> object:
    ip.user_ns["timed_args"] = args
    ip.run_cell_magic("tfos_cluster", f"{line} --args timed_args --name timed", CELL)
    handle = ip.user_ns["timed"]
    assert handle.state == "finished", handle.result
    return handle


def test_a_slow_callback_is_named_on_its_node_and_its_peer_waits_on_it(ip, digits_df):
    ip.user_ns["df"] = digits_df
    ip.run_line_magic("config", 'TFOSMagics.renderer = "none"')
    handle = run_cell(ip, "--workers 2 --data df --epochs 2", {"sleepy": "worker:0", "sleep": 0.25, "epochs": 2})
    nodes = {n.label: n for n in handle.status().nodes}
    slow, peer = nodes["worker:0"], nodes["chief:0"]
    assert slow.time_sentence.startswith("outside steps "), (slow.time_sentence, slow.time_shares)
    assert peer.time_sentence.startswith("waits on peers "), (peer.time_sentence, peer.time_shares)
    for label, node in nodes.items():  # the panel's figures are the history's last row's
        shares = last_shares(handle, label)
        assert shares == pytest.approx(node.time_shares), (label, shares, node.time_shares)
        assert sum(shares.values()) == pytest.approx(1.0)
    print(f"\nslow callback: worker:0 {slow.time_sentence} {slow.time_shares}; chief:0 {peer.time_sentence}"
          f" {peer.time_shares}")


def test_a_slow_spark_computation_before_the_feed_makes_the_nodes_wait_for_input(ip, digits_df, spark):
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("long")
    def slow_label(labels):  # an expensive column (a feature computed upstream): 0.1 s a batch of 8 rows
        time.sleep(0.1)
        return labels

    slow = digits_df.withColumn("label", slow_label("label"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "8")
    try:
        ip.user_ns["df"] = slow
        handle = run_cell(ip, "--workers 2 --data df --epochs 1", {"sleepy": "", "sleep": 0, "epochs": 1})
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    for node in handle.status().nodes:
        assert node.time_sentence.startswith("waits for input "), (node.label, node.time_sentence, node.time_shares)
        assert last_shares(handle, node.label) == pytest.approx(node.time_shares)
        print(f"\nslow feed: {node.label} {node.time_sentence} {node.time_shares}")
