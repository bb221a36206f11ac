"""A TensorFlowOnSpark 2.x program, written as its examples are, runs with only its import line changed.

The node functions below follow TensorFlowOnSpark's ``mnist_spark`` example (a per-row
``from_generator`` over ``TFNode.DataFeed(ctx.mgr, False)``, ``steps_per_epoch`` capped at
90 % of the expected steps, ``ModelCheckpoint``, ``compat.export_saved_model``,
``tf_feed.terminate()``) and its inference loop (``next_batch`` / ``batch_results``), on
scikit-learn's digits instead of MNIST.
"""

from __future__ import annotations

import argparse
import sys

import cloudpickle
import numpy as np
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
