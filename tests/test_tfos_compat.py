"""A TensorFlowOnSpark 2.x program, written as its examples are, runs with only its import line changed.

The node functions below follow TensorFlowOnSpark's ``mnist_spark`` example (a per-row
``from_generator`` over ``TFNode.DataFeed(ctx.mgr, False)``, ``steps_per_epoch`` capped at
90 % of the expected steps, ``ModelCheckpoint``, ``compat.export_saved_model``,
``tf_feed.terminate()``) and its inference loop (``next_batch`` / ``batch_results``), on
scikit-learn's digits instead of MNIST.
"""

from __future__ import annotations

import argparse
import os
import sys

import cloudpickle
import numpy as np
import pyspark
import pytest

from tests.conftest import spark_fixture

# --- the only line that changes: `from tensorflowonspark import TFCluster` ---
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def main_fun(args, ctx):
    import numpy as np
    import tensorflow as tf

    from tfos_nb import TFNode, compat  # was: from tensorflowonspark import compat, TFNode

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def build_and_compile_model():
        model = tf.keras.Sequential([
            tf.keras.layers.Dense(64, activation="relu", input_shape=(64,)),
            tf.keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(loss=tf.keras.losses.sparse_categorical_crossentropy,
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.01), metrics=["accuracy"])
        return model

    tf_feed = TFNode.DataFeed(ctx.mgr, False)

    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch) > 0:
                example = batch[0]
                image = np.array(example[0]).astype(np.float32)
                label = np.reshape(np.array(example[1]).astype(np.float32), (1,))
                yield (image, label)
            else:
                return

    ds = tf.data.Dataset.from_generator(rdd_generator, (tf.float32, tf.float32),
                                        (tf.TensorShape([64]), tf.TensorShape([1])))
    ds = ds.batch(args.batch_size)

    tf.io.gfile.makedirs(args.model_dir)
    filepath = args.model_dir + "/weights-{epoch:04d}"
    callbacks = [tf.keras.callbacks.ModelCheckpoint(filepath=filepath, verbose=1, save_weights_only=True)]

    with strategy.scope():
        multi_worker_model = build_and_compile_model()

    steps_per_epoch = args.num_rows / args.batch_size
    max_steps_per_worker = int(steps_per_epoch / ctx.num_workers * 0.9)
    multi_worker_model.fit(x=ds, epochs=args.epochs, steps_per_epoch=max_steps_per_worker, callbacks=callbacks)

    compat.export_saved_model(multi_worker_model, args.export_dir, ctx.job_name == "chief")
    tf_feed.terminate()


def inference_fun(args, ctx):
    import numpy as np
    import tensorflow as tf

    from tfos_nb import TFNode

    model = tf.keras.models.load_model(args.export_dir)
    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(args.batch_size)
        if len(batch) > 0:
            x = np.array([np.array(row[0], dtype=np.float32) for row in batch])
            labels = [int(row[1]) for row in batch]
            preds = np.argmax(model.predict(x, verbose=0), axis=1)
            tf_feed.batch_results([f"{lbl} {int(p)}" for lbl, p in zip(labels, preds)])


def rows_fun(args, ctx):
    """TensorFlowOnSpark's usual row handling: next_batch, tuple unpacking, np.array over rows."""
    import json
    import os

    import numpy as np

    from tfos_nb import TFNode

    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    facts = {"rows": 0, "x_sum": 0.0, "y_sum": 0, "kinds": [], "shapes": [], "named": 0}
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(args.batch_size)
        if len(batch) > 0:
            x = np.array([row[0] for row in batch]).astype(np.float32)
            y = np.array([row[1] for row in batch])
            for features, label in batch:  # unpacking, as the examples' loops do
                assert len(features) == x.shape[1] and int(label) == label
            if hasattr(batch[0], "features"):  # a DataFrame's rows are pyspark.sql.Rows
                facts["named"] += sum(float(r.features[0]) == float(r[0][0]) for r in batch)
            facts["rows"] += len(batch)
            facts["x_sum"] += float(x.sum(dtype=np.float64))
            facts["y_sum"] += int(y.sum())
            kind = f"{type(batch[0]).__name__}/{type(batch[0][0]).__name__}/{type(batch[0][1]).__name__}"
            facts["kinds"] = sorted(set(facts["kinds"]) | {kind})
            facts["shapes"] = sorted(set(map(tuple, facts["shapes"])) | {x.shape[1:]})
    import pyspark

    facts["pyspark"] = os.path.realpath(pyspark.__file__)  # the DataFrame's Rows needed it: the installed copy, not Spark's zip
    with open(os.path.join(args.out_dir, f"{ctx.worker_num}.json"), "w") as f:
        json.dump(facts, f)
    tf_feed.terminate()


def _node_facts(out_dir):
    import json

    facts = [json.loads(p.read_text()) for p in sorted(out_dir.iterdir())]
    assert len(facts) == 2, facts
    return facts


def test_tensorflowonspark_rows_carry_numpy_arrays_from_dataframes_and_rdds(spark, sc, tmp_path, no_leaks):
    rng = np.random.default_rng(7)
    x = rng.random((300, 8), dtype=np.float32)
    y = rng.integers(0, 10, 300).tolist()
    expected_sum = float(x.astype(np.float64).sum())
    df = spark.createDataFrame([(row.tolist(), label) for row, label in zip(x, y)], "features array<float>, label int")
    rdd = sc.parallelize(list(zip(x.astype(np.float64).tolist(), y)), 4)  # TFoS's RDD of (list, label) tuples
    for name, data, kind in (("df", df.repartition(3), "Row/ndarray/int"), ("rdd", rdd, "tuple/ndarray/int")):
        out = tmp_path / name
        out.mkdir()
        args = argparse.Namespace(batch_size=32, out_dir=str(out))
        cluster = TFCluster.run(sc, rows_fun, args, 2, num_ps=0, input_mode=TFCluster.InputMode.SPARK)
        cluster.train(data, 1)
        cluster.shutdown()
        facts = _node_facts(out)
        assert sum(f["rows"] for f in facts) == 300, (name, facts)
        assert sum(f["y_sum"] for f in facts) == sum(y)
        assert abs(sum(f["x_sum"] for f in facts) - expected_sum) < 1e-2
        assert {k for f in facts for k in f["kinds"]} == {kind}
        assert {tuple(s) for f in facts for s in f["shapes"]} == {(8,)}
        assert sum(f["named"] for f in facts) == (300 if name == "df" else 0)
        # pip's pyspark carries Spark's zips, first on a worker's path; a node imports the installed copy
        assert os.path.isfile(os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip"))
        assert {f["pyspark"] for f in facts} == {os.path.realpath(pyspark.__file__)}, facts


spark = spark_fixture(3)


def test_tensorflowonspark_mnist_style_program_runs_unchanged(sc, tmp_path, no_leaks):
    from tfos_nb.examples.digits import load_digits_arrays

    xtr, ytr, xte, yte = load_digits_arrays()
    args = argparse.Namespace(batch_size=16, epochs=4, model_dir=str(tmp_path / "ckpt"),
                              export_dir=str(tmp_path / "export"), num_rows=len(ytr), cluster_size=2)
    images_labels = sc.parallelize(list(zip(xtr.tolist(), ytr.tolist())), 4)

    cluster = TFCluster.run(sc, main_fun, args, args.cluster_size, num_ps=0, tensorboard=False,
                            input_mode=TFCluster.InputMode.SPARK, log_dir=args.model_dir, master_node="chief")
    cluster.train(images_labels, args.epochs)
    cluster.shutdown()
    assert (tmp_path / "export" / "saved_model.pb").exists()
    assert any(p.name.startswith("weights-") for p in (tmp_path / "ckpt").iterdir())

    cluster = TFCluster.run(sc, inference_fun, args, args.cluster_size, num_ps=0, tensorboard=False,
                            input_mode=TFCluster.InputMode.SPARK)
    labels_and_preds = cluster.inference(sc.parallelize(list(zip(xte.tolist(), yte.tolist())), 3)).collect()
    cluster.shutdown()
    assert len(labels_and_preds) == len(yte)
    pairs = np.array([[int(v) for v in s.split()] for s in labels_and_preds])
    assert pairs[:, 0].tolist() == yte.tolist()  # one result per row, in order
    assert float(np.mean(pairs[:, 0] == pairs[:, 1])) >= 0.85
