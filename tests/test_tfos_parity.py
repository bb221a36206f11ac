"""TensorFlowOnSpark's own tests and examples, behaviour by behaviour, on tfos_nb (real Spark, real TensorFlow).

What TensorFlowOnSpark 2.2.5's ``test_TFCluster.py`` (port tests), ``test_TFParallel.py``,
``test_dfutil.py`` and ``test_pipeline.py`` check of the public API, written as those tests
and TensorFlowOnSpark's examples are written, with only the import line changed: the
node's reserved port (``release_port``, ``ctx.tmp_socket``), ``TFParallel``'s barrier,
TFRecords in and out, the Spark ML pipeline with every form of ``tf_args``, and the shape
of the ``mnist_inference`` example (``TFParallel`` + ``util.single_node_env`` + a SavedModel
over sharded TFRecords).  The API details that need no Spark are in test_tfos_api.py.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
import time

import cloudpickle
import numpy as np
import pytest

from tests.conftest import NODE_ENV, spark_fixture

# --- the only line that changes: `from tensorflowonspark import TFCluster, TFParallel, dfutil` ---
from tfos_nb import TFCluster, TFParallel, dfutil
from tfos_nb.pipeline import TFEstimator, TFModel

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])


spark = spark_fixture(2)



def _json_lines(path):
    return [json.loads(line) for p in sorted(path.iterdir()) for line in p.read_text().splitlines()]


# -- test_TFCluster.py: the node's reserved port --------------------------------------------------------
def port_released_fun(args, ctx):
    import socket

    assert ctx.tmp_socket is None, "the port should be released before the function runs"
    port = int(ctx.cluster_spec[ctx.job_name][ctx.task_index].rsplit(":", 1)[1])
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", port))  # free for the function's own server
    s.close()
    print(f"executor_id {ctx.executor_id!r} worker_num {ctx.worker_num} spark {ctx.spark_executor_id}", flush=True)


def test_port_released(sc, no_leaks):
    cluster = TFCluster.run(sc, port_released_fun, tf_args={}, num_executors=2, num_ps=0,
                            input_mode=TFCluster.InputMode.TENSORFLOW, master_node="chief")
    cluster.shutdown(timeout=120)
    lines = [line for lines in cluster.logs(tail=None).values() for line in lines if line.startswith("executor_id")]
    # ctx.executor_id is the node's index (TensorFlowOnSpark's meaning); Spark's id is spark_executor_id
    assert sorted(line.split(" spark ")[0] for line in lines) == ["executor_id 0 worker_num 0",
                                                                   "executor_id 1 worker_num 1"]
    assert sorted(line.split(" spark ")[1] for line in lines) == ["0", "1"]


def port_unreleased_fun(args, ctx):
    import socket

    assert ctx.tmp_socket is not None
    reserved_port = ctx.tmp_socket.getsockname()[1]
    assert ctx.cluster_spec[ctx.job_name][ctx.task_index].endswith(f":{reserved_port}")
    my_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        my_sock.bind(("0.0.0.0", reserved_port))
        raise AssertionError("binding the reserved port should fail")
    except OSError as exc:
        print(f"reserved: {exc}", flush=True)
    finally:
        my_sock.close()
    ctx.release_port()
    assert ctx.tmp_socket is None
    my_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    my_sock.bind(("0.0.0.0", reserved_port))
    my_sock.close()


def test_port_unreleased(sc, no_leaks):
    cluster = TFCluster.run(sc, port_unreleased_fun, tf_args={}, num_executors=2, num_ps=0,
                            input_mode=TFCluster.InputMode.TENSORFLOW, master_node="chief", release_port=False)
    cluster.shutdown(timeout=120)
    assert all(any(line.startswith("reserved: ") for line in lines) for lines in cluster.logs(tail=None).values())


# -- test_TFParallel.py --------------------------------------------------------------------------------------
def basic_map_fun(args, ctx):
    total = args["x"] + args["y"]
    assert total == 3
    return total


def test_parallel_basic_with_and_without_barrier(sc, no_leaks):
    args = {"x": 1, "y": 2}
    assert TFParallel.run(sc, basic_map_fun, tf_args=args, num_executors=2, use_barrier=False) == [3, 3]
    assert TFParallel.run(sc, basic_map_fun, tf_args=args, num_executors=2) == [3, 3]  # barrier


def test_parallel_barrier_insufficient_resources_fails_at_once(sc, no_leaks):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"use_barrier=True .* needs 3 task slots; this Spark application has 2"):
        TFParallel.run(sc, basic_map_fun, tf_args={"x": 1, "y": 2}, num_executors=3)
    assert time.monotonic() - t0 < 60  # refused up front: a barrier stage that cannot be scheduled would hang
    # waves are fine when no barrier is asked for
    assert TFParallel.run(sc, basic_map_fun, {"x": 1, "y": 2}, 3, use_barrier=False) == [3, 3, 3]


# -- examples/mnist/keras/mnist_inference.py: TFParallel over sharded TFRecords with a SavedModel ------------
def inference(args, ctx):
    from tfos_nb import util

    util.single_node_env()  # before TensorFlow is imported
    import os

    import tensorflow as tf

    assert "CUDA_VISIBLE_DEVICES" in os.environ
    saved_model = tf.saved_model.load(args.export_dir, tags="serve")
    predict = saved_model.signatures["serving_default"]
    input_name = next(iter(predict.structured_input_signature[1]))

    def parse_tfr(example_proto):
        feature_def = {"label": tf.io.FixedLenFeature(1, tf.int64), "image": tf.io.FixedLenFeature(64, tf.float32)}
        features = tf.io.parse_single_example(example_proto, feature_def)
        return features["image"], features["label"]

    ds = tf.data.Dataset.list_files(f"{args.images_labels}/part-*", shuffle=False)
    ds = ds.shard(ctx.num_workers, ctx.worker_num)
    ds = ds.interleave(tf.data.TFRecordDataset)
    ds = ds.map(parse_tfr)
    ds = ds.batch(10)
    tf.io.gfile.makedirs(args.output)
    with tf.io.gfile.GFile(f"{args.output}/part-{ctx.worker_num:05d}", mode="w") as output_file:
        for batch in ds:
            predictions = predict(**{input_name: batch[0]})
            labels = tf.reshape(batch[1], [-1]).numpy()
            preds = tf.argmax(next(iter(predictions.values())), axis=1).numpy()
            for label, pred in zip(labels, preds):
                output_file.write(f"{label} {pred}\n")


def test_mnist_inference_example_shape_on_digits(spark, sc, tmp_path, no_leaks):
    from tfos_nb import compat
    from tfos_nb.examples.digits import build_model, load_digits_arrays

    xtr, ytr, xte, yte = load_digits_arrays()
    model = build_model(0.01)
    model.fit(xtr, ytr, epochs=8, batch_size=32, verbose=0)
    compat.export_saved_model(model, str(tmp_path / "export"), True)
    df = spark.createDataFrame([(x.tolist(), int(y)) for x, y in zip(xte[:200], yte[:200])],
                               "image array<float>, label long").repartition(4)
    dfutil.saveAsTFRecords(df, str(tmp_path / "tfr"))

    args = argparse.Namespace(cluster_size=2, images_labels=str(tmp_path / "tfr"),
                              export_dir=str(tmp_path / "export"), output=str(tmp_path / "predictions"))
    TFParallel.run(sc, inference, args, args.cluster_size, env=NODE_ENV)
    outputs = sorted(p.name for p in (tmp_path / "predictions").iterdir())
    assert outputs == ["part-00000", "part-00001"]  # one file per run: each read its own shard
    pairs = np.array([[int(v) for v in line.split()] for p in sorted((tmp_path / "predictions").iterdir())
                      for line in p.read_text().splitlines()])
    assert len(pairs) == 200 and sorted(pairs[:, 0].tolist()) == sorted(yte[:200].tolist())
    assert float(np.mean(pairs[:, 0] == pairs[:, 1])) > 0.85


# -- test_dfutil.py: TFRecords in and out ------------------------------------------------------------------
def test_tfrecords_round_trip_with_empty_parts_and_other_file_names(spark, sc, tmp_path):
    import tensorflow as tf

    rows = [([1.5, 2.5], 1, 0.25, "a"), ([3.5, 4.5], 2, 0.5, "b")]
    df = spark.createDataFrame(rows, "x array<float>, y long, w double, s string").repartition(4)
    out = tmp_path / "tfr"
    dfutil.saveAsTFRecords(df, str(out))
    sizes = sorted((p.name, p.stat().st_size) for p in out.iterdir())
    assert len(sizes) == 4 and sum(1 for _, n in sizes if n == 0) >= 2  # empty partitions: empty part files
    ex = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[5.5, 6.5])),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
        "w": tf.train.Feature(float_list=tf.train.FloatList(value=[0.75])),
        "s": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"c"])),
    }))
    with tf.io.TFRecordWriter(str(out / "written-by-tensorflow.tfrecord")) as w:  # not a part-* name
        w.write(ex.SerializeToString())
    (out / "_SUCCESS").write_text("")  # Hadoop's marker: skipped

    back = dfutil.loadTFRecords(sc, str(out))
    assert dict(back.dtypes) == {"s": "string", "w": "double", "x": "array<double>", "y": "bigint"}
    assert sorted((r.y, r.x, r.w, r.s) for r in back.collect()) == [
        (1, [1.5, 2.5], 0.25, "a"), (2, [3.5, 4.5], 0.5, "b"), (3, [5.5, 6.5], 0.75, "c")]
    assert dfutil.isLoadedDF(back) and not dfutil.isLoadedDF(df) and dfutil.loadedDF[back] == str(out)

    # toTFExample / fromTFExample as mapPartitions functions, as in TensorFlowOnSpark
    records = df.rdd.mapPartitions(dfutil.toTFExample(df.dtypes))
    again = spark.createDataFrame(records.mapPartitions(dfutil.fromTFExample))
    assert sorted((r.y, r.x, r.s) for r in again.collect()) == [(1, [1.5, 2.5], "a"), (2, [3.5, 4.5], "b")]


# -- test_pipeline.py and examples/mnist/keras/mnist_pipeline.py ---------------------------------------------
def spark_train(args, ctx):
    """TensorFlowOnSpark's test_spark_saved_model train function (reads the whole feed, then exports)."""
    import json

    import tensorflow as tf

    from tfos_nb import TFNode, compat

    with open(f"{args.facts}/{ctx.job_name}-{ctx.task_index}", "w") as f:
        json.dump({"item": args["batch_size"], "attr": args.batch_size, "in": "input_mapping" in args,
                   "get": args.get("epochs"), "dict": sorted(dict(args)), "vars": sorted(vars(args)),
                   "type": type(args).__name__}, f)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, activation="linear", input_shape=[2])])
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=0.1), loss="mse", metrics=["mse"])

    tf_feed = TFNode.DataFeed(ctx.mgr, input_mapping=args.input_mapping)

    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch["x"]) > 0:
                yield (batch["x"][0], batch["y_"][0])
            else:
                return

    ds = tf.data.Dataset.from_generator(rdd_generator, (tf.float32, tf.float32),
                                        (tf.TensorShape([2]), tf.TensorShape([1])))
    options = tf.data.Options()
    compat.disable_auto_shard(options)
    ds = ds.with_options(options).batch(args.batch_size)
    model.fit(ds, epochs=1, verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
    tf_feed.terminate()


def test_spark_saved_model(spark, tmp_path, no_leaks):
    rng = np.random.default_rng(1234)
    features = rng.random((600, 2))
    weights = np.array([3.14, 1.618])
    train_examples = [(f.tolist(), [float(f @ weights)]) for f in features]
    train_df = spark.sparkContext.parallelize(train_examples, 2).toDF(["col1", "col2"])
    (tmp_path / "facts").mkdir()
    export_dir = str(tmp_path / "export")

    args = {"facts": str(tmp_path / "facts")}
    estimator = (TFEstimator(spark_train, args, env=NODE_ENV)
                 .setInputMapping({"col1": "x", "col2": "y_"})
                 .setModelDir(str(tmp_path / "model"))
                 .setExportDir(export_dir)
                 .setClusterSize(1)
                 .setMasterNode("chief")
                 .setNumPS(0)
                 .setBatchSize(4)
                 .setEpochs(3))
    model = estimator.fit(train_df)
    facts = json.loads((tmp_path / "facts" / "chief-0").read_text())
    keys = sorted(["facts", "batch_size", "cluster_size", "driver_ps_nodes", "epochs", "export_dir", "grace_secs",
                   "input_mapping", "input_mode", "master_node", "model_dir", "num_ps", "protocol", "readers",
                   "steps", "tensorboard", "tfrecord_dir"])
    assert facts == {"item": 4, "attr": 4, "in": True, "get": 3, "dict": keys, "vars": keys, "type": "Namespace"}

    test_df = spark.createDataFrame([([1.0, 1.0], [0.0])], ["c1", "c2"])
    model.setTagSet("serve").setSignatureDefKey("serving_default").setInputMapping(
        {"c1": "dense_input"}).setOutputMapping({"dense": "cout"})
    preds = model.transform(test_df).head()
    assert abs(preds.cout[0] - float(np.sum(weights))) < 0.1
    # Spark ML's convention: the input columns stay (TensorFlowOnSpark returned only the outputs)
    assert model.transform(test_df).columns == ["c1", "c2", "cout"]


def argv_train(args, ctx):
    import argparse
    import json
    import sys

    assert isinstance(args, list) and sys.argv == args
    parser = argparse.ArgumentParser()
    parser.add_argument("--facts")
    parser.add_argument("--learning_rate", type=float)
    parsed = parser.parse_args(args)
    feed = ctx.get_data_feed()
    rows = 0
    while not feed.should_stop():
        rows += len(feed.next_batch(16))
    with open(parsed.facts, "w") as f:
        json.dump({"learning_rate": parsed.learning_rate, "rows": rows}, f)


def test_tfestimator_with_an_argv_list(spark, tmp_path, no_leaks):
    facts = tmp_path / "facts.json"
    df = spark.createDataFrame([(float(i),) for i in range(50)], "x double")
    argv = ["--facts", str(facts), "--learning_rate", "0.5"]
    TFEstimator(argv_train, argv, env=NODE_ENV).setInputMapping({"x": "x"}).setEpochs(2).fit(df)
    assert json.loads(facts.read_text()) == {"learning_rate": 0.5, "rows": 100}


def tfrecords_train(args, ctx):
    import json

    record = {"job": ctx.job_name, "spark_executor_id": ctx.spark_executor_id, "driver_ps_nodes": args.driver_ps_nodes}
    if ctx.job_name == "chief":
        import tensorflow as tf

        files = tf.io.gfile.glob(f"{args.tfrecord_dir}/part-*")
        record["records"] = sum(1 for _ in tf.data.TFRecordDataset(files))
    with open(f"{args.facts}/{ctx.job_name}", "w") as f:
        json.dump(record, f)


def test_tfestimator_tfrecord_dir_and_driver_ps_nodes(spark, tmp_path, no_leaks):
    def driver_log_folders():  # a ps node on the driver: its supervisor's private log folder, tfos_nb-<cluster>-*
        return {p for p in glob.glob(os.path.join(tempfile.gettempdir(), "tfos_nb-*"))
                if re.fullmatch(r"tfos_nb-[0-9a-f]{12}-\w+", os.path.basename(p))}

    before = driver_log_folders()
    (tmp_path / "facts").mkdir()
    df = spark.createDataFrame([([float(i)] * 3, i, "unused") for i in range(40)], "x array<float>, y long, z string")
    tfr = str(tmp_path / "tfr")
    est = (TFEstimator(tfrecords_train, {"facts": str(tmp_path / "facts")}, env=NODE_ENV)
           .setInputMode(TFCluster.InputMode.TENSORFLOW).setTFRecordDir(tfr).setInputMapping({"x": "x", "y": "y"})
           .setClusterSize(2).setNumPS(1).setDriverPSNodes(True))
    est.fit(df)
    facts = {r["job"]: r for r in _json_lines(tmp_path / "facts")}
    assert facts["chief"]["records"] == 40 and facts["chief"]["spark_executor_id"] in ("0", "1")
    assert facts["ps"]["spark_executor_id"] == "driver" and facts["ps"]["driver_ps_nodes"] is True
    assert sorted(dfutil.loadTFRecords(spark.sparkContext, tfr).columns) == ["x", "y"]  # the mapped columns only
    assert driver_log_folders() - before == set()  # removed with the ps node (left in /tmp before)


def test_tfmodel_reshapes_flat_rows_to_a_conv_input(spark, tmp_path):
    import tensorflow as tf

    from tfos_nb import compat

    model = tf.keras.Sequential([tf.keras.layers.Input((4, 4, 1)), tf.keras.layers.Conv2D(2, 2),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    export = str(tmp_path / "export")
    compat.export_saved_model(model, export, True)
    sig = tf.saved_model.load(export).signatures["serving_default"]
    alias_in = next(iter(sig.structured_input_signature[1]))
    alias_out = next(iter(sig.structured_outputs))

    x = np.random.default_rng(0).random((6, 16)).astype(np.float32)
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(6)], "id long, pixels array<float>")
    m = TFModel({"num_gpus": 0}).setExportDir(export).setInputMapping({"pixels": alias_in}).setOutputMapping(
        {alias_out: "out"})
    out = m.transform(df)
    assert out.columns == ["id", "pixels", "out"]
    got = np.array([r.out for r in sorted(out.collect(), key=lambda r: r.id)])
    np.testing.assert_allclose(got, model.predict(x.reshape(-1, 4, 4, 1), verbose=0), rtol=1e-4, atol=1e-5)
