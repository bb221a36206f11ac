"""Issue 43, item 2: Keras 3's own multi-process API, ``keras.distribution`` with the JAX backend, on tfos_nb's nodes.

Every training node gets ``KERAS_DISTRIBUTION_JOB_ADDRESSES/NUM_PROCESSES/PROCESS_ID`` from the cluster spec, so a
cell written as Keras' distribution guide writes it (``keras.distribution.initialize()`` with no arguments, then
``DataParallel``) forms one JAX job across the nodes.  The nodes read equal shards of their own
(InputMode.TENSORFLOW): the trained weights equal one process's on the same global batches.  A fed node's share of an
epoch varies, which JAX's collectives cannot take (they wait with no error), so ``as_dataset`` refuses it in one
sentence, whichever of ``initialize()`` and ``as_dataset()`` comes first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, binary_frame, spark_fixture, start_cluster
from tfos_nb import TFCluster
from tfos_nb.runtime.driver.errors import TFClusterError
from tfos_nb.runtime.executor.feed.data_feed import JAX_REFUSED
from tfos_nb.runtime.executor.process.supervisor import keras_distribution_env

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
ROWS, BATCH, EPOCHS = 384, 32, 3  # per process: 12 batches an epoch on every node
JAX_ENV = {**NODE_ENV, "KERAS_BACKEND": "jax"}


def test_each_trainer_gets_its_process_id_and_the_chief_coordinates():
    spec = {"chief": ["h0:1"], "worker": ["h1:2", "h2:3"], "ps": ["h3:4"], "evaluator": ["h4:5"]}
    addresses = "h0:1,h1:2,h2:3"
    assert keras_distribution_env(spec, "chief", 0) == {"KERAS_DISTRIBUTION_JOB_ADDRESSES": addresses,
                                                        "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
                                                        "KERAS_DISTRIBUTION_PROCESS_ID": "0"}
    assert keras_distribution_env(spec, "worker", 1)["KERAS_DISTRIBUTION_PROCESS_ID"] == "2"
    assert keras_distribution_env({"worker": ["h1:2", "h2:3"]}, "worker", 0)["KERAS_DISTRIBUTION_PROCESS_ID"] == "0"
    assert keras_distribution_env(spec, "ps", 0) == {} and keras_distribution_env(spec, "evaluator", 0) == {}


def shard(process: int) -> tuple:
    """Process ``process``'s rows: its own seeded shard, the same in the reference run."""
    import numpy as np

    x = np.random.default_rng(100 + process).normal(size=(ROWS, 16)).astype("float32")
    return x, (x[:, :4].sum(axis=1) > 0).astype("float32")


def build_model():
    import keras

    keras.utils.set_random_seed(7)  # the same initial weights on every process and in the reference
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", metrics=["accuracy"])
    return model


def jax_fun(args, ctx):
    """Keras' distribution guide, as a cell: initialize(), DataParallel, fit on this process's shard."""
    import os

    if args["backend_in_cell"]:  # as a notebook cell chooses it, before the first import of Keras
        os.environ["KERAS_BACKEND"] = "jax"
    import keras
    import numpy as np
    import tensorflow as tf

    keras.distribution.initialize()  # the addresses, the number of processes and this one's id: tfos_nb's env
    import jax

    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    x, y = shard(jax.process_index())
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    model = build_model()
    hist = model.fit(ds, epochs=args["epochs"], verbose=0, callbacks=[ctx.progress_callback()])
    evaluated = model.evaluate(ds, verbose=0, return_dict=True)
    # saving gathers the variables across the processes (a collective): every process saves, the chief's copy kept
    import tempfile

    if ctx.job_name == "chief":
        model.save(args["path"])
    else:
        with tempfile.TemporaryDirectory() as scratch:
            model.save(os.path.join(scratch, "model.keras"))
    return {"backend": keras.backend.backend(), "processes": jax.process_count(), "process": jax.process_index(),
            "history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
            "evaluate": {k: float(v) for k, v in evaluated.items()},
            "weights": [np.asarray(w).tolist() for w in model.get_weights()]}


REFERENCE = """
import json, sys
import numpy as np
import tensorflow as tf
from tests import test_keras_jax as t
n, epochs = int(sys.argv[1]), int(sys.argv[2])
shards = [t.shard(p) for p in range(n)]
# DataParallel's global batch i: every process's batch i, in process order
x = np.concatenate([np.concatenate([s[0][i:i + t.BATCH] for s in shards]) for i in range(0, t.ROWS, t.BATCH)])
y = np.concatenate([np.concatenate([s[1][i:i + t.BATCH] for s in shards]) for i in range(0, t.ROWS, t.BATCH)])
model = t.build_model()
hist = model.fit(x, y, batch_size=n * t.BATCH, epochs=epochs, shuffle=False, verbose=0)
print(json.dumps({"loss": [float(v) for v in hist.history["loss"]],
                  "weights": [np.asarray(w).tolist() for w in model.get_weights()]}))
"""


def reference(nodes: int) -> dict:
    """One JAX process on the same global batches."""
    env = {**os.environ, **JAX_ENV, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", REFERENCE, str(nodes), str(EPOCHS)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


spark = spark_fixture(3)


@pytest.mark.parametrize(("nodes", "backend_in_cell"), [(2, True), (3, False)],
                         ids=["2-nodes-backend-set-in-the-function", "3-nodes-backend-in-env"])
def test_keras_distribution_with_jax_trains_across_the_nodes_as_one_process_would(sc, tmp_path, nodes,
                                                                                  backend_in_cell, no_leaks):
    import numpy as np

    path = str(tmp_path / "model.keras")
    args = {"epochs": EPOCHS, "path": path, "backend_in_cell": backend_in_cell}
    cluster = start_cluster(sc, jax_fun, args, nodes, env=NODE_ENV if backend_in_cell else JAX_ENV,
                            input_mode=TFCluster.InputMode.TENSORFLOW, master_node="chief")
    cluster.shutdown(timeout=240)
    assert cluster.status().state == "finished"
    values = cluster.state.values()
    assert sorted(v["process"] for v in values.values()) == list(range(nodes))
    assert all(v["backend"] == "jax" and v["processes"] == nodes for v in values.values()), values
    chief = values["chief:0"]
    # one model: the same history, evaluation and weights on every process
    assert all(v["history"] == chief["history"] and v["evaluate"] == chief["evaluate"] for v in values.values())
    assert all(v["weights"] == chief["weights"] for v in values.values())
    # ... equal to one process trained on the same global batches
    ref = reference(nodes)
    assert chief["history"]["loss"] == pytest.approx(ref["loss"], rel=1e-4), (chief["history"], ref["loss"])
    for got, want in zip(chief["weights"], ref["weights"]):
        assert np.allclose(got, want, atol=1e-4)
    assert chief["history"]["loss"][-1] < chief["history"]["loss"][0]
    # what the panel shows is Keras' own: each epoch's last report equals History
    last = {m["epoch"]: m for role, _, _, _, _, m in cluster.state.history() if role == "chief" and "loss" in m}
    assert sorted(last) == list(range(1, EPOCHS + 1)), last
    for epoch, metrics in last.items():
        assert metrics["loss"] == pytest.approx(chief["history"]["loss"][epoch - 1], rel=1e-6)
    # the chief's .keras file loads in a plain JAX process and holds the trained weights
    load = ("import json, sys, keras, numpy as np\nm = keras.models.load_model(sys.argv[1])\n"
            "print(json.dumps([np.asarray(w).tolist() for w in m.get_weights()]))")
    env = {**os.environ, **JAX_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", load, path], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    for got, want in zip(json.loads(out.stdout.splitlines()[-1]), chief["weights"]):
        assert np.allclose(got, want)
    # the node output the user reads carries no native log lines of JAX's (gloo's join) or TensorFlow's
    from tfos_nb.runtime.noise import quiet_lines

    shown = quiet_lines(cluster.logs("chief:0")["chief:0"])
    assert not [line for line in shown if "Gloo" in line or "cuInit" in line], shown


def fed_jax_fun(args, ctx):
    import keras
    import tensorflow as tf

    if args["initialize_first"]:
        keras.distribution.initialize()
        ds = ctx.get_data_feed().as_dataset(batch_size=BATCH, columns=(0, 1))
    else:
        ds = ctx.get_data_feed().as_dataset(batch_size=BATCH, columns=(0, 1))
        keras.distribution.initialize()
    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    model = build_model()
    model.fit(ds, epochs=1, verbose=0)
    del tf


@pytest.fixture(scope="module")
def train_df(spark):
    return binary_frame(spark, 600, 16, 4, 3)


@pytest.mark.parametrize("initialize_first", [True, False], ids=["initialize-then-as_dataset",
                                                                  "as_dataset-then-initialize"])
def test_a_fed_jax_job_is_refused_in_one_sentence_not_hung(sc, train_df, initialize_first, no_leaks):
    cluster = start_cluster(sc, fed_jax_fun, {"initialize_first": initialize_first}, 2, env=JAX_ENV,
                            input_mode=TFCluster.InputMode.SPARK, master_node="chief")
    t0 = time.monotonic()
    with pytest.raises(TFClusterError) as info:  # the cluster's error, from train() or shutdown()
        try:
            cluster.train(train_df, num_epochs=1, feed_timeout=120)
        finally:
            cluster.shutdown(timeout=120)
    elapsed = time.monotonic() - t0
    assert JAX_REFUSED in str(info.value), str(info.value)[-3000:]
    assert elapsed < 120, elapsed  # ended by the nodes' own error, not by the feed_timeout
