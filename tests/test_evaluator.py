"""The evaluator node (``TFCluster.run(..., eval_node=True)``) on real Spark with real TensorFlow.

The contract (``TFCluster.shutdown``): shutdown waits for the chief/workers, then gives the
evaluator up to ``grace_secs`` to evaluate the last checkpoint, ending the wait as soon as
its function returns; an evaluator still running then is stopped and shows ``stopped``.
Its reports are in the cluster's history under role ``evaluator``.  (The cell's
``--evaluator`` is tested in ``test_magics.py``.)
"""

from __future__ import annotations

import sys
import threading
import time

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, spark_fixture
from tfos_nb import TFCluster
from tfos_nb.runtime.driver.control import state

pytestmark = pytest.mark.slow
# Node functions defined here travel by value (executors cannot import this test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = spark_fixture(3)  # chief + worker + evaluator

EPOCHS = 3
#: the evaluator's grace: far more than it takes to notice the last checkpoint (checkpoints_iterator polls every
#: second) and evaluate 128 rows, so a shutdown that waited it out is told apart from one that ended with it
GRACE_S = 60.0


def sidecar_fun(args, ctx):
    """chief/worker: MWMS training, a checkpoint per epoch; evaluator: Keras' SidecarEvaluator on those checkpoints."""
    import json
    import os

    import numpy as np
    import tensorflow as tf

    def model_and_data():
        x = np.random.default_rng(0).normal(size=(128, 8)).astype("float32")
        y = (x.sum(axis=1) > 0).astype("int64")
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(2)])
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model, tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

    if ctx.job_name == "evaluator":
        model, ds = model_and_data()

        class Report(tf.keras.callbacks.Callback):
            def on_test_end(self, logs=None):  # the checkpoint's training step (restored) and its metrics
                step = int(self.model.optimizer.iterations.numpy())
                ctx.report(step=step, **{f"val_{k}": float(v) for k, v in (logs or {}).items()})
                print(f"evaluated step {step}", flush=True)

        evaluator = tf.keras.utils.SidecarEvaluator(model, ds, args["ckpt"], max_evaluations=args["epochs"],
                                                    callbacks=[Report()])
        evaluator.start()  # returns after the checkpoint of the last epoch
        return {"tf_config": json.loads(os.environ["TF_CONFIG"])}
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, ds = model_and_data()
    save = tf.keras.callbacks.ModelCheckpoint(os.path.join(args["ckpt"], "ckpt-{epoch}"), save_weights_only=True)
    model.fit(ds, epochs=args["epochs"], verbose=0, callbacks=[save, ctx.progress_callback()])
    return int(model.optimizer.iterations.numpy())


def test_sidecar_evaluator_reports_to_the_history_and_ends_the_grace(sc, tmp_path, no_leaks):
    trained_at: list[float] = []  # when every chief/worker had finished, by the driver's clock
    lock = threading.Lock()

    def on_state(st: state.ClusterState) -> None:
        with lock:
            if not trained_at and all(n.state == state.FINISHED for n in st.nodes if n.job_name != "evaluator"):
                trained_at.append(time.monotonic())

    args = {"ckpt": str(tmp_path / "ckpt"), "epochs": EPOCHS}
    cluster = TFCluster.run(sc, sidecar_fun, args, 3, master_node="chief", eval_node=True, env=NODE_ENV,
                            on_state=on_state)
    assert [(n.job_name, n.task_index) for n in cluster.nodes] == [("chief", 0), ("worker", 0), ("evaluator", 0)]
    assert [n.label for n in cluster.nodes] == ["chief:0", "worker:0", "evaluator:0"]
    cluster.shutdown(grace_secs=GRACE_S, timeout=300)
    ended = time.monotonic()

    states = {n.label: n.state for n in cluster.nodes}
    assert states == {"chief:0": "finished", "worker:0": "finished", "evaluator:0": "finished"}, (
        states, cluster.logs("evaluator:0", tail=30))
    assert cluster.status().state == "finished"
    # the evaluator returned by itself once it evaluated the last checkpoint: shutdown did not wait out the grace
    assert trained_at and ended - trained_at[0] < GRACE_S / 2, ended - trained_at[0]

    values = cluster.state.values()
    steps = values["chief:0"]  # the optimizer's steps after the last epoch
    assert isinstance(steps, int) and steps > 0
    tf_config = values["evaluator:0"]["tf_config"]  # the evaluator is no part of the training cluster
    assert tf_config["task"] == {"type": "evaluator", "index": 0}
    assert set(tf_config["cluster"]) == {"chief", "worker"}

    evaluated = [(step, metrics) for role, _i, _n, _t, step, metrics in cluster.state.history() if role == "evaluator"]
    assert evaluated, cluster.logs("evaluator:0", tail=30)
    assert all({"val_loss", "val_accuracy"} <= set(metrics) for _, metrics in evaluated), evaluated
    assert evaluated[-1][0] == steps, (evaluated, steps)  # the last checkpoint's evaluation is there
    evaluator = next(n for n in cluster.nodes if n.job_name == "evaluator")
    assert evaluator.step == steps and "val_loss" in evaluator.metrics
    assert f"evaluated step {steps}" in cluster.logs("evaluator:0", tail=None)["evaluator:0"]
