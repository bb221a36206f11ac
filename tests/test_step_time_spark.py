"""Where each node's time goes, on a real cluster (real Spark local-cluster, real TensorFlow, a real IPython shell):
slowdowns injected one after another into one running training cell are each named, on the right node and in the
right category, in the panel's live state within 30 s.

The kinds, in turn: a slow Spark computation upstream of the feed (every node "waits for input"); a slow callback on
one node (that node is "outside steps", its peer, held in the collective, "waits on peers"); a slow step on one node
(a CPU-heavy op in its model: it "computes", its peer "waits on peers") — on the worker, then on the chief.  The test
says which kind runs through a small file the cell's callback, model and Spark function read; it ends the training
at a step both nodes agree on (MultiWorkerMirroredStrategy's steps are collective: a node stopping alone would
leave its peer in the collective).  ``TFOS_NB_SLOWDOWN_TRIALS`` sets the number of trials (5: each kind once).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from tests.conftest import global_shell_with, spark_fixture, wait_until
from tfos_nb.examples.digits import load_digits_arrays, to_dataframe
from tfos_nb.runtime import step_time

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = spark_fixture(2)
TRIALS = int(os.environ.get("TFOS_NB_SLOWDOWN_TRIALS", "5"))
EPOCHS = 10  # rows for ~2,000 steps a node: more than 20 trials take; a feed that ends first fails the test
DEADLINE_S = 30.0  # the bound: a slowdown is named within 30 s of its start
# (kind, node): what is slowed and where; "" = every node (the feed)
KINDS = (("feed", ""), ("callback", "worker:0"), ("compute", "worker:0"), ("callback", "chief:0"),
         ("compute", "chief:0"))

# a data scientist's cell: the quickstart's model behind a layer that can burn CPU, a callback that can sleep (a slow
# checkpoint, a remote logger); both do so only when the control file names this node
CELL = textwrap.dedent("""
    import json, time
    import numpy as np
    import tensorflow as tf
    from tfos_nb.examples.digits import build_model

    me = f"{ctx.job_name}:{ctx.task_index}"

    def slowed(kind):
        with open(args["control"]) as f:
            c = json.load(f)
        return c, c["kind"] == kind and c["node"] == me

    def burn():  # a slow step on this node: 0.1 s of CPU inside the model
        if slowed("compute")[1]:
            end = time.process_time() + 0.1
            while time.process_time() < end:
                pass
        return np.float32(0.0)

    class Slow(tf.keras.callbacks.Callback):
        steps = 0
        def on_train_batch_end(self, batch, logs=None):
            c, slow = slowed("callback")
            if slow:
                time.sleep(0.1)
            Slow.steps += 1
            if c["stop_at"] and Slow.steps >= c["stop_at"]:  # a step every node reaches: they stop together
                self.model.stop_training = True

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        mlp = build_model()
        model = tf.keras.Sequential([
            tf.keras.layers.Input((64,)),
            tf.keras.layers.Lambda(lambda x: x + tf.reshape(tf.numpy_function(burn, [], tf.float32), [])),
            mlp])
        model.compile(optimizer="adam", loss=mlp.loss, metrics=["accuracy"])
    feed = ctx.get_data_feed()
    model.fit(feed.as_dataset(batch_size=32), epochs=args["epochs"], verbose=0,
              callbacks=[ctx.progress_callback(), Slow()])
    feed.terminate()
""")


def control(path: Path, kind: str = "", node: str = "", stop_at: int = 0) -> None:
    """Say which slowdown runs (atomically: the readers never see half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": kind, "node": node, "stop_at": stop_at}))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def ip(spark):
    yield from global_shell_with(spark, "timed")


def expected(kind: str, node: str, label: str) -> str:
    """The category ``label`` should show while ``kind`` slows ``node``."""
    if kind == "feed":
        return "input"
    if label == node:
        return "compute" if kind == "compute" else "other"
    return "peers"


def test_injected_slowdowns_are_named_on_the_right_node_within_30_s(ip, spark, tmp_path):
    from pyspark.sql.functions import pandas_udf

    path = tmp_path / "control.json"
    control(path)
    ctl = str(path)

    @pandas_udf("long")
    def label(labels):  # an expensive column computed upstream of the feed: 0.05 s a batch of 8 rows, when asked
        with open(ctl) as f:
            if json.load(f)["kind"] == "feed":
                time.sleep(0.05)
        return labels

    x, y, _, _ = load_digits_arrays()
    df = to_dataframe(spark, np.tile(x, (8, 1)), np.tile(y, 8), partitions=2).cache()  # 14,376 rows an epoch
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "8")
    ip.user_ns["df"] = df.withColumn("label", label("label"))
    ip.user_ns["timed_args"] = {"control": ctl, "epochs": EPOCHS}
    ip.run_line_magic("config", 'TFOSMagics.renderer = "none"')
    try:
        ip.run_cell_magic("tfos_cluster", f"--workers 2 --data df --epochs {EPOCHS} --args timed_args --name timed "
                                          "--background", CELL)
        handle = ip.user_ns["timed"]

        def nodes() -> dict[str, object]:
            assert not handle.done, handle.result  # a cell that ended has nothing more to name
            view = handle.status()
            return {n.label: n for n in view.nodes} if view else {}

        wait_until(lambda: (now := nodes()) and all(n.time_shares for n in now.values()), 180, 0.25,
                   what="every node's first time shares (the cluster started and trained)")
        seen, started = [], time.monotonic()
        for trial in range(TRIALS):
            kind, node = KINDS[trial % len(KINDS)]
            control(path, kind, node)
            t0 = time.monotonic()
            want = {label: expected(kind, node, label) for label in nodes()}

            def named(want=want):
                now = nodes()
                return all(step_time.dominant(now[label].time_shares or {})[0] == cat for label, cat in want.items())

            wait_until(named, DEADLINE_S, 0.25, what=f"trial {trial}: {kind} on {node or 'the feed'} named as {want};"
                       f" the panel says { {lab: n.time_sentence for lab, n in nodes().items()} }")
            seen.append((kind, node, round(time.monotonic() - t0, 1),
                         {lab: {c: round(v, 2) for c, v in (n.time_shares or {}).items()} for lab, n in nodes().items()}))
        step = max(n.step or 0 for n in nodes().values())
        control(path, stop_at=step + 300)  # past every node's step now: both read it before they get there
        stopping = time.monotonic()
        handle.wait()
        print(f"\ntrials {stopping - started:.1f} s to step {step}, the end {time.monotonic() - stopping:.1f} s")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        control(path, stop_at=1)
    assert handle.state == "finished", handle.result
    for kind, node, took, sentences in seen:
        print(f"\n{kind:8} {node or 'feed':9} named after {took:4.1f} s: {sentences}")
    h = handle.history  # the panel's last figures are the history's last row's
    assert h["step"].notna().all()  # one row per report: the clocks a stuck step sent count in the next row
    for n in handle.status().nodes:
        rows = h[(h["node"] == n.label) & h["time_input"].notna()]
        last = {c: float(rows.iloc[-1][f"time_{c}"]) for c in step_time.CATEGORIES}
        assert last == pytest.approx(n.time_shares), (n.label, last, n.time_shares)
        assert sum(last.values()) == pytest.approx(1.0)
