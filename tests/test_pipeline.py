"""The Spark ML pipeline API (TFEstimator / TFModel) on real Spark (local-cluster) and real TensorFlow.

One Pipeline (VectorAssembler -> TFEstimator) is fitted once for the module on
scikit-learn's digits; the other tests reuse its SavedModel and checkpoint.
The persistence test runs last: it stops the module's Spark session and loads
the saved PipelineModel in a fresh one.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import numpy as np
import pytest

from tests.conftest import NODE_ENV, spark_session
from tfos_nb.examples import digits
from tfos_nb.pipeline import TFEstimator, TFModel

pytestmark = pytest.mark.slow
# Functions defined here travel by value (executors cannot import this test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

COLS = [f"p{i}" for i in range(digits.FEATURES)]


def build_model():
    """The digits MLP with named input/output, so mappings can name them."""
    import tensorflow as tf

    inp = tf.keras.layers.Input((digits.FEATURES,), name="features")
    hidden = tf.keras.layers.Dense(64, activation="relu")(inp)
    out = tf.keras.layers.Dense(digits.CLASSES, name="logits")(hidden)
    return tf.keras.Model(inp, out)


def train_fn(args, ctx):
    import tempfile

    import tensorflow as tf

    from tfos_nb import compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=args.learning_rate),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = ctx.get_data_feed().as_dataset(batch_size=args.batch_size)
    model.fit(ds, epochs=args.epochs, verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.is_chief)
    # Under MultiWorkerMirroredStrategy every worker saves; only the chief's copy is kept.
    target = args.model_dir if ctx.is_chief else tempfile.mkdtemp()
    tf.train.Checkpoint(model=model).save(os.path.join(target, "ckpt"))
    if not ctx.is_chief:  # and a worker's copy is removed, as TensorFlow's guide does
        tf.io.gfile.rmtree(target)


def frame(spark, x, y, partitions, ids=False):
    import pandas as pd

    pdf = pd.DataFrame(x.astype(np.float64), columns=COLS)
    pdf["label"] = y
    if ids:
        pdf["id"] = np.arange(len(y))
    return spark.createDataFrame(pdf).repartition(partitions)


class Session:
    spark = None


@pytest.fixture(scope="module")
def session():
    holder = Session()
    holder.spark = spark_session(3)
    yield holder
    holder.spark.stop()


@pytest.fixture(scope="module")
def data(session):
    xtr, ytr, xte, yte = digits.load_digits_arrays()
    train = frame(session.spark, xtr, ytr, 4).cache()
    train.count()
    return train, xte, yte


@pytest.fixture(scope="module")
def fitted(session, data, tmp_path_factory):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    train, _, _ = data
    root = tmp_path_factory.mktemp("pipeline")
    est = TFEstimator(train_fn, {"learning_rate": 0.01}, model_fn=build_model, env=NODE_ENV)
    est.setInputMapping({"features": "features", "label": "label"}).setClusterSize(2).setEpochs(4)
    est.setBatchSize(32).setExportDir(str(root / "export")).setModelDir(str(root / "ckpt"))
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=COLS, outputCol="features"), est])
    model = pipeline.fit(train)
    return pipeline, model, root


def test_input_mode_and_args():
    est = TFEstimator(train_fn, {"a": 1}, inputMode="TENSORFLOW", protocol="RING", epochs=3)
    args = est.merged_args()
    assert args.a == 1 and args["epochs"] == 3 and args.protocol == "ring" and args.input_mode == 0
    assert args.batch_size == 100 and args.cluster_size == 1 and args.master_node == "chief"
    with pytest.raises(ValueError, match="RDMA"):
        est.setProtocol("grpc+verbs")


def test_fit_transform_accuracy(session, data, fitted, no_leaks):
    _, model, root = fitted
    _, xte, yte = data
    tfmodel = model.stages[-1]
    assert isinstance(tfmodel, TFModel)
    assert tfmodel.getExportDir() == str(root / "export") and tfmodel.getInputMapping() == {"features": "features"}
    out = model.transform(frame(session.spark, xte, yte, 3)).select("label", "logits").collect()
    logits = np.array([r.logits for r in out], dtype=np.float32)
    assert logits.shape == (len(yte), digits.CLASSES)
    acc = float(np.mean(logits.argmax(1) == np.array([r.label for r in out])))
    assert acc >= 0.9, acc


def _signature_tensors(export):
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(export, "saved_model.pb"), "rb") as f:
        sm.ParseFromString(f.read())
    sig = sm.meta_graphs[0].signature_def["serving_default"]
    return sig.inputs["features"].name, sig.outputs["logits"].name


def test_three_styles_agree(session, data, fitted):
    from pyspark.ml.feature import VectorAssembler

    _, _, root = fitted
    _, xte, yte = data
    df = VectorAssembler(inputCols=COLS, outputCol="features").transform(frame(session.spark, xte, yte, 3))
    df = df.select("label", "features").cache()
    export = str(root / "export")
    tin, tout = _signature_tensors(export)
    styles = {
        "signature": TFModel(exportDir=export, inputMapping={"features": "features"},
                             outputMapping={"logits": "out"}),
        "tensors": TFModel(exportDir=export, signatureDefKey=None, inputMapping={"features": tin},
                           outputMapping={tout: "out"}),
        "checkpoint": TFModel(model_fn=build_model, modelDir=str(root / "ckpt"),
                              inputMapping={"features": "features"}, outputMapping={"logits": "out"}),
    }
    preds = {}
    for name, m in styles.items():
        rows = m.setBatchSize(50).transform(df).orderBy("label").select("features", "out").collect()
        order = np.lexsort(np.array([r.features.toArray() for r in rows]).T)
        preds[name] = np.array([rows[i].out for i in order], dtype=np.float32)
    assert preds["signature"].shape == (len(yte), digits.CLASSES)
    for name in ("tensors", "checkpoint"):
        np.testing.assert_allclose(preds[name], preds["signature"], rtol=1e-5, atol=1e-5)
        assert (preds[name].argmax(1) == preds["signature"].argmax(1)).all()


# A notebook that used tf.keras before fitting: its process's tf.keras is Keras 3 for good, while the nodes
# trained (and checkpointed) with tf_keras.  Run as its own driver process, since this one has tf_keras.
KERAS3_NOTEBOOK = r"""
import json, sys
import numpy as np
import tensorflow as tf

tf.keras.layers.Dense(1)  # the notebook's own earlier Keras
assert tf.keras.__version__.startswith("3."), tf.keras.__version__
from pyspark.sql import SparkSession
from tfos_nb.pipeline import TFModel

def build_model():
    import tensorflow as tf
    inp = tf.keras.layers.Input((FEATURES,), name="features")
    hidden = tf.keras.layers.Dense(64, activation="relu")(inp)
    return tf.keras.Model(inp, tf.keras.layers.Dense(CLASSES, name="logits")(hidden))

x = np.load(sys.argv[2])
spark = SparkSession.builder.master("local[1]").getOrCreate()
df = spark.createDataFrame([(i, row.tolist()) for i, row in enumerate(x)], "id int, features array<float>")
model = TFModel(model_fn=build_model, modelDir=sys.argv[1], inputMapping={"features": "features"},
                outputMapping={"logits": "out"})
rows = sorted(model.transform(df).collect(), key=lambda r: r.id)
print("OUT " + json.dumps([r.out for r in rows]))
spark.stop()
"""


def test_checkpoint_style_from_a_notebook_whose_tf_keras_is_keras3(data, fitted, tmp_path):
    """The model is rebuilt with the nodes' tf_keras (in a Python worker), not the notebook's Keras 3."""
    import subprocess

    import tensorflow as tf

    _, _, root = fitted
    _, xte, _ = data
    ckpt = str(root / "ckpt")
    model = build_model()
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(ckpt)).expect_partial()
    expected = model(xte[:40].astype(np.float32), training=False).numpy()
    np.save(tmp_path / "x.npy", xte[:40].astype(np.float32))
    script = tmp_path / "notebook.py"
    script.write_text(KERAS3_NOTEBOOK.replace("FEATURES", str(digits.FEATURES)).replace("CLASSES", str(digits.CLASSES)))
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([repo, env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    done = subprocess.run([sys.executable, str(script), ckpt, str(tmp_path / "x.npy")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = [line for line in done.stdout.splitlines() if line.startswith("OUT ")]
    assert out, done.stdout[-2000:]
    import json

    got = np.array(json.loads(out[-1][4:]), dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("udf", ["arrow", "pandas"])
def test_array_column_and_multiple_outputs(session, tmp_path, udf, monkeypatch):
    """Scalar, integer and array outputs, typed from the signature, in the signature and tensor styles.

    ``pandas``: the pandas UDF that pyspark < 4.1 (no ``arrow_udf``) gets, on this pyspark.
    """
    import tensorflow as tf

    from tfos_nb.pipeline import _model

    if udf == "arrow":
        assert _model._use_arrow_udf(), "this pyspark has no arrow_udf (< 4.1): only the pandas case applies"
    else:
        monkeypatch.setattr(_model, "_use_arrow_udf", lambda: False)

    class Three(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"total": tf.reduce_sum(x, axis=1), "top": tf.argmax(x, axis=1), "twice": x * 2.0}

    module = Three()
    export = str(tmp_path / "three")
    tf.saved_model.save(module, export, signatures={"serving_default": module.serve})
    df = session.spark.createDataFrame([([1.0, 5.0, 2.0], 0), ([3.0, 0.0, 1.0], 1)] * 5, "v array<float>, id int")
    df = df.repartition(3)
    m = TFModel(exportDir=export, inputMapping={"v": "x"}, outputMapping={"total": "t", "top": "k", "twice": "w"})
    out = m.transform(df)
    assert [(f.name, f.dataType.simpleString()) for f in out.schema.fields] == [
        ("v", "array<float>"), ("id", "int"), ("t", "float"), ("k", "bigint"), ("w", "array<float>")]
    rows = sorted(out.collect(), key=lambda r: r.id)
    assert (rows[0].t, rows[0].k, rows[0].w) == (8.0, 1, [2.0, 10.0, 4.0]) and len(rows) == 10
    # Default OutputMapping: every signature output, named by its alias.
    assert TFModel(exportDir=export, inputMapping={"v": "x"}).transform(df).columns == ["v", "id", "top", "total",
                                                                                       "twice"]


def test_wrong_mappings(session, data, fitted):
    from pyspark.sql.utils import PythonException

    _, _, root = fitted
    _, xte, yte = data
    export = str(root / "export")
    df = digits.to_dataframe(session.spark, xte[:20], yte[:20], partitions=2)
    with pytest.raises(ValueError, match=r"'nope' is not in the DataFrame.*features"):
        TFModel(exportDir=export, inputMapping={"nope": "features"}).transform(df)
    with pytest.raises(ValueError, match=r"unknown tensor 'x'.*\['features'\]"):
        TFModel(exportDir=export, inputMapping={"features": "x"}).transform(df)
    with pytest.raises(ValueError, match=r"unknown tensor 'probs'.*\['logits'\]"):
        TFModel(exportDir=export, inputMapping={"features": "features"}, outputMapping={"probs": "p"}).transform(df)
    with pytest.raises(ValueError, match=r"no signature 'predict'.*serving_default"):
        TFModel(exportDir=export, signatureDefKey="predict", inputMapping={"features": "features"}).transform(df)
    with pytest.raises(ValueError, match=r"unknown tensor 'input:0'.*serving_default_features:0"):
        TFModel(exportDir=export, signatureDefKey=None, inputMapping={"features": "input:0"},
                outputMapping={"StatefulPartitionedCall:0": "o"}).transform(df)
    with pytest.raises(ValueError, match=r"column 'label' \(a scalar per row\) cannot feed tensor 'features'"):
        TFModel(exportDir=export, inputMapping={"label": "features"}).transform(df)
    with pytest.raises(ValueError, match="no SavedModel"):
        TFModel(exportDir=str(root), inputMapping={"features": "features"}).transform(df)
    with pytest.raises(ValueError, match="needs model_fn"):
        TFModel(modelDir=str(root / "ckpt"), inputMapping={"features": "features"}).transform(df)
    # A row length only the data shows: the task fails with the column and tensor named.
    short = session.spark.createDataFrame([([1.0, 2.0],)], "features array<float>")
    with pytest.raises(PythonException, match=r"column 'features' gives rows of shape \[2\].*tensor 'features'"):
        TFModel(exportDir=export, inputMapping={"features": "features"}).transform(short).collect()
    with pytest.raises(ValueError, match=r"'nope' is not in the DataFrame"):
        TFEstimator(train_fn, {}, inputMapping={"nope": "x"}).fit(df)


def test_empty_partitions_and_empty_dataframe(session, data, fitted):
    _, _, root = fitted
    _, xte, yte = data
    m = TFModel(exportDir=str(root / "export"), inputMapping={"features": "features"})
    sparse = digits.to_dataframe(session.spark, xte[:3], yte[:3], partitions=8)  # most partitions empty
    assert sparse.rdd.glom().map(len).collect().count(0) >= 5
    assert sorted(r.label for r in m.transform(sparse).collect()) == sorted(yte[:3].tolist())
    empty = session.spark.createDataFrame([], "features array<float>, label long")
    out = m.transform(empty)
    assert out.collect() == [] and out.columns == ["features", "label", "logits"]


def test_estimator_functions_saved_as_a_parquet_table_and_the_old_pickle_file_still_loads(session, tmp_path):
    import shutil

    est = TFEstimator(train_fn, {"learning_rate": 0.5}, model_fn=build_model, env=NODE_ENV).setEpochs(3)
    path = tmp_path / "est"
    est.save(str(path))
    assert (path / "tfos_nb_fns").is_dir() and not (path / "tfos_nb_callables").exists()
    new = TFEstimator.load(str(path))
    assert new.train_fn.__name__ == "train_fn" and new.tf_args == {"learning_rate": 0.5} and new.getEpochs() == 3
    # what tfos_nb wrote before the parquet table: the cloudpickled functions in a Spark pickle file
    shutil.rmtree(path / "tfos_nb_fns")
    blob = cloudpickle.dumps(est._callables())
    session.spark.sparkContext.parallelize([blob], 1).saveAsPickleFile(str(path / "tfos_nb_callables"))
    old = TFEstimator.load(str(path))
    assert old.train_fn.__name__ == "train_fn" and old.model_fn.__name__ == "build_model" and old.env == NODE_ENV
    assert old.tf_args == {"learning_rate": 0.5} and old.getEpochs() == 3


def test_pipeline_persists_and_loads_in_a_fresh_session(session, data, fitted, tmp_path):
    # No no_leaks here: the fresh session's Py4J gateway is a new listening port (no cluster is started).
    from pyspark.ml import Pipeline, PipelineModel

    pipeline, model, _ = fitted
    _, xte, yte = data
    before = model.transform(frame(session.spark, xte, yte, 3, ids=True)).select("id", "label", "logits").collect()
    model.save(str(tmp_path / "model"))
    pipeline.save(str(tmp_path / "pipeline"))
    session.spark.stop()  # a fresh Spark application: nothing of the fit survives but the files
    session.spark = spark_session(3)
    loaded = PipelineModel.load(str(tmp_path / "model"))
    after = loaded.transform(frame(session.spark, xte, yte, 3, ids=True)).select("id", "label", "logits").collect()
    by_id = lambda rows: [(r.label, r.logits) for r in sorted(rows, key=lambda r: r.id)]
    assert [label for label, _ in by_id(after)] == [label for label, _ in by_id(before)] == yte.tolist()
    # the same model on the same rows; float32 sums differ in the last bits with how rows fall into batches
    np.testing.assert_allclose([v for _, v in by_id(after)], [v for _, v in by_id(before)], rtol=1e-5, atol=1e-5)
    tfmodel = loaded.stages[-1]
    assert isinstance(tfmodel, TFModel) and tfmodel.getModelFn() is not None
    est = Pipeline.load(str(tmp_path / "pipeline")).getStages()[-1]
    assert isinstance(est, TFEstimator)
    assert est.getEpochs() == 4 and est.getClusterSize() == 2 and est.tf_args == {"learning_rate": 0.01}
    assert est.train_fn.__name__ == "train_fn" and est.env == NODE_ENV
