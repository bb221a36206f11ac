"""Model parallelism: a ParameterServerStrategy embedding table sharded across two ps nodes (real Spark, real TF)."""

from __future__ import annotations

import json
import sys
import time

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, spark_fixture
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS, DIM = 100_000, 32


spark = spark_fixture(5)


def sharded_embedding_fun(args, ctx):
    """ps/workers serve; the chief shards the table over the ps nodes and trains through the coordinator."""
    import json
    import os

    import numpy as np
    import tensorflow as tf

    if ctx.job_name in ("ps", "worker"):
        spec = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
        tf.distribute.Server(spec, job_name=ctx.job_name, task_index=ctx.task_index, start=True).join()
        return
    num_ps = len(ctx.cluster_spec["ps"])
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=num_ps
    )
    strategy = tf.distribute.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver(), variable_partitioner=partitioner
    )
    rows, dim = args["rows"], args["dim"]
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Embedding(rows, dim), tf.keras.layers.Dense(1)])
        model.build((None,))
        optimizer = tf.keras.optimizers.SGD(learning_rate=args["lr"])
    table = model.layers[0].embeddings
    shards = [{"device": v.device, "shape": list(v.shape)} for v in table.variables]
    print("shards", json.dumps(shards))

    def dataset_fn():
        rng = np.random.default_rng(0)
        ids = rng.choice(rows, size=256, replace=False)  # spread over the whole table: every shard is used
        target = ((ids * 37) % 11).astype("float32") / 10.0 - 0.5
        return tf.data.Dataset.from_tensor_slices((ids, target)).shuffle(256).repeat().batch(64)

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(it):
        def step(ids, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(ids, training=True)[:, 0] - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        ids, y = next(it)
        return strategy.run(step, args=(ids, y))

    losses = []
    for epoch in range(args["epochs"]):
        results = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(args["steps"])]
        coordinator.join()
        losses.append(float(np.mean([r.fetch() for r in results])))
        ctx.report(step=(epoch + 1) * args["steps"], loss=losses[-1], first_loss=losses[0], shards=json.dumps(shards))
        print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}")


def test_embedding_table_is_sharded_across_two_ps_and_loss_goes_down(sc, no_leaks):
    args = {"rows": ROWS, "dim": DIM, "lr": 0.5, "epochs": 3, "steps": 20}
    t0 = time.monotonic()
    cluster = TFCluster.run(sc, sharded_embedding_fun, args, 5, num_ps=2, master_node="chief", env=NODE_ENV)
    assert sorted(n.label for n in cluster.nodes) == ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    cluster.shutdown(timeout=240)
    states = {n.label: n.state for n in cluster.nodes}
    assert states["chief:0"] == "finished", states
    chief = next(n for n in cluster.nodes if n.label == "chief:0")
    shards = json.loads(chief.metrics["shards"])
    assert len(shards) == 2, shards
    tasks = sorted(int(s["device"].split("/job:ps/")[1].split("task:")[1].split("/")[0]) for s in shards)
    assert tasks == [0, 1], shards  # one shard on each ps node
    assert all("/job:ps/" in s["device"] for s in shards), shards
    assert all(s["shape"][1] == DIM and 0 < s["shape"][0] < ROWS for s in shards), shards  # none holds all
    assert sum(s["shape"][0] for s in shards) == ROWS
    assert chief.metrics["loss"] < 0.7 * chief.metrics["first_loss"], chief.metrics
    assert chief.step == args["epochs"] * args["steps"]
    assert time.monotonic() - t0 < 240
