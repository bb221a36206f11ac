"""Issue 41, item 0: MLflow autologging on a stream-fed node, left at its defaults, as a data scientist writes it.

``mlflow.tensorflow.autolog()`` logs ``fit``'s dataset (``log_datasets=True``): its digest iterates the whole
dataset, which on the chief is ``as_dataset``'s one-pass stream of the DataFrame — an epoch consumed before
``fit``, and ``fit`` then waiting for rows the job never feeds (a 600 s hang before the fix).  The notebook
below is the one from the issue: an active run in the notebook, a DataFrame of 1,600 rows of 64 floats in 4
partitions, a 2-worker MultiWorkerMirroredStrategy cell that turns autologging on.  It must finish, in the one
run, with the DataFrame as the run's ``train`` input: MLflow's Spark record (schema, Spark's digest), the exact
row count; on a classic Spark session and on Spark Connect alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_tracking import Kernel, _streams, _text, client, mlflow_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

NOTEBOOK = """\
import os
os.environ["MLFLOW_TRACKING_URI"] = {url!r}
import mlflow
import numpy as np
%load_ext tfos_nb
%config TFOSMagics.renderer = 'text'
from tfos_nb.magics import spark_session

spark = spark_session(nodes=2)
mlflow.set_experiment("autolog-feed")
rng = np.random.default_rng(0)
x = rng.normal(size=(1600, 64)).astype("float32")
y = (x[:, :8].sum(axis=1) > 0).astype("float32")
df = spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(x, y)], "features array<float>, label float")
df = df.repartition(4)
xv = rng.normal(size=(400, 64)).astype("float32")
yv = (xv[:, :8].sum(axis=1) > 0).astype("float32")
val_df = spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(xv, yv)], "features array<float>, label float")
val_df = val_df.repartition(3)
run = mlflow.start_run(run_name="notebook")
"""

CELL = """\
%%tfos_cluster --workers 2 --data df --validation-data val_df --epochs 3 --name autolog --timeout 240
import mlflow
import tensorflow as tf

mlflow.tensorflow.autolog()  # log_datasets=True: MLflow's default
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
ds = ctx.get_data_feed().as_dataset(batch_size=64)
val = ctx.get_data_feed(qname_in="validation").as_dataset(batch_size=64)
model.fit(ds, validation_data=val, epochs=args.epochs, callbacks=[ctx.progress_callback()], verbose=0)
print("fit done on", ctx.job_name, flush=True)
"""


@pytest.mark.parametrize("connect", [False, True], ids=["classic", "spark-connect"])
def test_autolog_with_its_default_dataset_logging_trains_on_the_feed(mlflow_server, client, kernel_specs, tmp_path,  # noqa: F811
                                                                     monkeypatch, connect):
    env = {}
    if connect:  # the kernel starts a local Spark Connect server of its own (see test_connect_notebook)
        env["TFOS_NB_SPARK_CONNECT"] = "1"
        for name in ("SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE",
                     "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
            monkeypatch.delenv(name, raising=False)
    kernel = Kernel(kernel_specs, tmp_path, env)
    try:
        kernel.run(NOTEBOOK.format(url=mlflow_server), timeout=180)
        _, msgs = kernel.run(CELL, timeout=300)
        text = _text(msgs)
        assert text.count("fit done on") == 2, text[-3000:]
        assert kernel.value("type(spark).__module__") == (
            "pyspark.sql.connect.session" if connect else "pyspark.sql.session")
        run_id = kernel.value("run.info.run_id")
        expected = kernel.value("mlflow.data.from_spark(df).digest")  # MLflow's own digest of the DataFrame
        val_digest = kernel.value("mlflow.data.from_spark(val_df).digest")
        val_history = kernel.value("list(autolog.history.query('node == \"chief:0\"')['val_accuracy'].dropna())")
        kernel.run("mlflow.end_run()")
    finally:
        kernel.close()
    run = client.get_run(run_id)
    assert str(run.data.params.get("opt_name")).lower() == "adam", run.data.params  # autolog ran, on the chief
    assert run.data.tags["tfos_nb.outcome"] == "finished", run.data.tags
    inputs = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset
              for i in run.inputs.dataset_inputs}
    assert len(run.inputs.dataset_inputs) == 2 and sorted(inputs) == ["train", "validation"], inputs
    dataset = inputs["train"]
    assert inputs["validation"].digest == val_digest and json.loads(inputs["validation"].profile) == {"num_rows": 400}
    # Keras' validation values: logged by step in the run, the last equal to the history's (the panel's) last
    assert len(val_history) == 3, val_history
    assert [m.value for m in client.get_metric_history(run_id, "val_accuracy")][-1] == pytest.approx(val_history[-1])
    assert dataset.digest == expected and dataset.source_type == "code"
    assert json.loads(dataset.profile) == {"num_rows": 1600}
    columns = [c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]]
    assert columns == ["features", "label"], dataset.schema
    # the cell's output stays clean: MLflow did not warn that it failed to log the dataset
    assert "Failed to log training dataset" not in _streams(msgs), _streams(msgs)[-3000:]


GUARD = """
import os, types
import tensorflow as tf
from tfos_nb.runtime.executor.tracking import datasets as mlflow_datasets, node as mlflow_node

pulled = []
def gen():
    for i in range(4):
        pulled.append(i)
        yield [float(i)]
stream = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((None,), tf.float32))
setattr(stream, mlflow_datasets.MARK, True)  # as DataFeed.as_dataset marks its stream
derived = stream.map(lambda x: x * 2).batch(2).prefetch(1)  # what a user builds on it
mlflow_node.setup(types.SimpleNamespace(is_chief=True, mlflow_run_id=None))  # the chief: MLflow is imported after
import mlflow
import mlflow.tensorflow
try:
    mlflow.data.from_tensorflow(features=derived)  # by name, as MLflow's autologging calls it
    print("not refused")
except ValueError as exc:
    print("refused:", exc)
print("skipped:", mlflow.tensorflow._log_tensorflow_dataset(derived, None, "train"))
print("pulled:", len(pulled))
print("other:", type(mlflow.data.from_tensorflow(tf.data.Dataset.from_tensor_slices([1.0, 2.0]))).__name__)
"""


def test_mlflow_never_iterates_a_stream_fed_dataset_on_the_chief(tmp_path):
    """The guard alone, in a fresh interpreter as a chief's node has it: MLflow's constructor refuses a dataset built
    on a feed's stream, autologging's dataset step skips it, neither pulls a row; other datasets are MLflow's."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TFOS_MLFLOW_RUN_ID": "r0", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT),
           "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri()}
    out = subprocess.run([sys.executable, "-c", GUARD], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    from tfos_nb.runtime.executor.tracking.datasets import REFUSAL

    assert lines == [f"refused: {REFUSAL}", "skipped: None", "pulled: 0", "other: TensorFlowDataset"], out.stdout
