"""The pipeline API's persistence on a real Spark Connect session (no SparkContext, no RDDs).

TFEstimator / TFModel save their Params as Spark ML metadata and their Python
functions as a one-row parquet table, both through the DataFrame API; here they
are saved and loaded on a local Spark Connect server (fitting needs the runtime
and is tested elsewhere).
"""

from __future__ import annotations

import shutil
import sys

import cloudpickle
import pytest

from tests.conftest import connect_fixture
from tfos_nb.pipeline import TFEstimator, TFModel

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = connect_fixture(2)


def train_fn(args, ctx):
    return args.scale * 2


def export_fn(args):
    return f"exported to {args.export_dir}"


def model_fn():
    return "a model"


def estimator() -> TFEstimator:
    scale = 21  # a closure variable: travels by value with the function
    return (TFEstimator(lambda args, ctx: scale + train_fn(args, ctx), {"scale": 3, "name": "digits"}, export_fn,
                        model_fn=model_fn, env={"TF_NUM_INTEROP_THREADS": "1"})
            .setClusterSize(2).setEpochs(4).setBatchSize(32).setInputMapping({"x": "features"})
            .setModelDir("/Volumes/main/default/v/ckpt").setExportDir("dbfs:/export"))


def test_spark_connect_session_has_no_spark_context(spark):
    assert type(spark).__module__.startswith("pyspark.sql.connect")
    with pytest.raises(Exception, match="sparkContext"):
        spark.sparkContext  # noqa: B018 - the attribute access is what fails


def test_estimator_saves_and_loads_params_and_functions(spark, tmp_path):
    est = estimator()
    path = str(tmp_path / "est")
    est.save(path)
    loaded = TFEstimator.load(path)
    assert isinstance(loaded, TFEstimator) and loaded.uid == est.uid
    assert (loaded.getClusterSize(), loaded.getEpochs(), loaded.getBatchSize()) == (2, 4, 32)
    assert loaded.getInputMapping() == {"x": "features"}
    assert (loaded.getModelDir(), loaded.getExportDir()) == ("/Volumes/main/default/v/ckpt", "dbfs:/export")
    assert loaded.tf_args == {"scale": 3, "name": "digits"} and loaded.env == {"TF_NUM_INTEROP_THREADS": "1"}
    args = loaded.merged_args()
    assert loaded.train_fn(args, None) == 27 and loaded.export_fn(args) == "exported to dbfs:/export"
    assert loaded.model_fn() == "a model"
    assert (tmp_path / "est" / "tfos_nb_fns").is_dir() and not (tmp_path / "est" / "tfos_nb_callables").exists()


def test_model_saves_loads_and_overwrites(spark, tmp_path):
    model = TFModel({"batch": 8}, model_fn=model_fn).setExportDir("/Volumes/c/s/v/export").setBatchSize(16)
    model.setInputMapping({"x": "features"}).setOutputMapping({"logits": "prediction"})
    path = str(tmp_path / "model")
    model.save(path)
    with pytest.raises(Exception, match="already exists"):
        model.save(path)
    model.setBatchSize(64)
    model.write().overwrite().save(path)
    loaded = TFModel.load(path)
    assert isinstance(loaded, TFModel) and loaded.getBatchSize() == 64
    assert loaded.getExportDir() == "/Volumes/c/s/v/export" and loaded.getOutputMapping() == {"logits": "prediction"}
    assert loaded.tf_args == {"batch": 8} and loaded.getModelFn()() == "a model"


def test_pipeline_of_an_estimator_saves_and_loads(spark, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b"], outputCol="features"), estimator()])
    pipeline.save(str(tmp_path / "pipeline"))
    stages = Pipeline.load(str(tmp_path / "pipeline")).getStages()
    assert [type(s).__name__ for s in stages] == ["VectorAssembler", "TFEstimator"]
    assert stages[1].getEpochs() == 4 and stages[1].train_fn(stages[1].merged_args(), None) == 27


def test_a_model_saved_in_the_old_format_names_the_way_out(spark, tmp_path):
    path = tmp_path / "old"
    TFModel({"batch": 8}, model_fn=model_fn).save(str(path))
    shutil.rmtree(path / "tfos_nb_fns")  # what an older tfos_nb left: metadata, and a pickle file needing a SparkContext
    with pytest.raises(ValueError, match="older tfos_nb .* load it once on a classic session and save it again"):
        TFModel.load(str(path))


def test_tfrecords_round_trip_without_rdds(spark, tmp_path):
    from pyspark.sql import types as T

    from tfos_nb import dfutil

    schema = T.StructType([T.StructField("label", T.LongType()), T.StructField("x", T.ArrayType(T.FloatType())),
                           T.StructField("name", T.StringType()), T.StructField("blob", T.BinaryType())])
    rows = [(i, [i + 0.5, i * 2.0], f"r{i}", bytes([i, 255])) for i in range(7)]
    out = str(tmp_path / "tfr")
    dfutil.saveAsTFRecords(spark.createDataFrame(rows, schema).repartition(3), out)
    assert sorted(p.name for p in (tmp_path / "tfr").iterdir()) == ["part-r-00000", "part-r-00001", "part-r-00002"]
    back = dfutil.loadTFRecords(spark, out, binary_features=["blob"])
    assert dfutil.isLoadedDF(back) and back.columns == ["blob", "label", "name", "x"]
    got = sorted((r.label, r.x, r.name, bytes(r.blob)) for r in back.collect())
    assert got == [(i, [i + 0.5, i * 2.0], f"r{i}", bytes([i, 255])) for i in range(7)]


def test_tfrecords_refuse_a_vector_column_naming_the_conversion(spark, tmp_path):
    from pyspark.ml.feature import VectorAssembler

    from tfos_nb import dfutil

    df = VectorAssembler(inputCols=["a", "b"], outputCol="v").transform(spark.createDataFrame([(1.0, 2.0)], "a double, b double"))
    with pytest.raises(TypeError, match=r"column .v.: an ML vector column cannot .*vector_to_array"):
        dfutil.saveAsTFRecords(df, str(tmp_path / "v"))


def test_saved_and_loaded_model_transforms_on_spark_connect(spark, tmp_path):
    """TFModel.transform is an Arrow UDF: no SparkContext needed; the model here is saved and loaded first."""
    import tensorflow as tf

    class Three(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"total": tf.reduce_sum(x, axis=1), "twice": x * 2.0}

    module = Three()
    export = str(tmp_path / "three")
    tf.saved_model.save(module, export, signatures={"serving_default": module.serve})
    TFModel(exportDir=export, inputMapping={"v": "x"}, outputMapping={"total": "t", "twice": "w"}).save(
        str(tmp_path / "m"))
    model = TFModel.load(str(tmp_path / "m"))
    df = spark.createDataFrame([([1.0, 5.0, 2.0], 0), ([3.0, 0.0, 1.0], 1)] * 3, "v array<float>, id int").repartition(2)
    rows = sorted(model.transform(df).collect(), key=lambda r: (r.id, r.t))
    assert len(rows) == 6 and (rows[0].t, rows[0].w) == (8.0, [2.0, 10.0, 4.0]) and rows[-1].t == 4.0


def digits_train_fn(args, ctx):
    import tensorflow as tf

    from tfos_nb import compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        inp = tf.keras.layers.Input((64,), name="features")
        hidden = tf.keras.layers.Dense(64, activation="relu")(inp)
        model = tf.keras.Model(inp, tf.keras.layers.Dense(10, name="logits")(hidden))
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = ctx.get_data_feed().as_dataset(batch_size=args.batch_size)
    model.fit(ds, epochs=args.epochs, verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.is_chief)


def test_estimator_fits_saves_loads_and_transforms_on_spark_connect(spark, tmp_path, no_leaks):
    """fit → save → load → transform with a Spark Connect session only: the cluster's control plane in the cluster."""
    from tests.conftest import NODE_ENV
    from tfos_nb.examples import digits

    x_train, y_train, x_test, y_test = digits.load_digits_arrays()
    train = digits.to_dataframe(spark, x_train, y_train, partitions=4)
    test = digits.to_dataframe(spark, x_test, y_test, partitions=2)
    est = (TFEstimator(digits_train_fn, {}, env=NODE_ENV).setClusterSize(2).setEpochs(5).setBatchSize(32)
           .setInputMapping({"features": "features", "label": "label"}).setExportDir(str(tmp_path / "export")))
    model = est.fit(train)
    model.setInputMapping({"features": "features"}).setOutputMapping({"logits": "logits"})
    model.save(str(tmp_path / "model"))
    loaded = TFModel.load(str(tmp_path / "model"))
    rows = loaded.transform(test.select("features", "label")).collect()
    assert len(rows) == len(y_test)
    correct = sum(int(max(range(10), key=lambda k: r.logits[k]) == r.label) for r in rows)
    assert correct / len(rows) >= 0.85, correct / len(rows)
