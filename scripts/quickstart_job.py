"""The quickstart as a batch job, TensorFlowOnSpark's way::

    spark-submit --master spark://HOST:7077 \\
        --conf spark.executorEnv.TF_NUM_INTRAOP_THREADS=1 \\
        scripts/quickstart_job.py --workers 2 --epochs 5

Builds a DataFrame from scikit-learn's digits, trains a Keras model with
MultiWorkerMirroredStrategy on ``--workers`` executors (a chief and workers) through
``tfos_nb.TFCluster``, predicts the test set on the executors back into a DataFrame,
and prints ``node <role:index> host <address> executor <id>`` for every training node
and ``accuracy: <fraction>``.  Exit status 0 on success.

Executors need the same Python environment as the driver (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np


def predict(args: dict, ctx) -> None:  # the node function (args, ctx)
    """Label and predicted class for every test row fed to this node."""
    import tensorflow as tf

    serve = tf.saved_model.load(args["export_dir"]).signatures["serving_default"]
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_arrays(256)
        if not cols:
            break
        features, labels = cols
        logits = next(iter(serve(tf.constant(features, dtype=tf.float32)).values())).numpy()
        feed.batch_results({"label": labels, "prediction": np.argmax(logits, axis=1).astype(np.int64)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="training nodes: a chief and N-1 workers (default 2)")
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training DataFrame (default 5)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--export-dir", default=None, help="where the SavedModel goes (default: a new temporary directory)")
    opts = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from tfos_nb import TFCluster
    from tfos_nb.examples import digits

    spark = SparkSession.builder.appName("tfos_nb-quickstart-job").getOrCreate()
    try:
        sc = spark.sparkContext
        export_dir = opts.export_dir or os.path.join(tempfile.mkdtemp(prefix="tfos-digits-"), "model")
        x_train, y_train, x_test, y_test = digits.load_digits_arrays()
        train_df = digits.to_dataframe(spark, x_train, y_train, partitions=4).cache()
        test_df = digits.to_dataframe(spark, x_test, y_test, partitions=2).cache()
        print(f"{train_df.count()} training rows, {test_df.count()} test rows on {sc.master}", flush=True)

        train_args = {"epochs": opts.epochs, "batch_size": opts.batch_size, "export_dir": export_dir}
        with TFCluster.run(
            sc, digits.train_fun, train_args, opts.workers, master_node="chief", input_mode=TFCluster.InputMode.SPARK, name="digits-train"
        ) as cluster:
            for n in cluster.nodes:
                print(f"node {n.label} host {n.host} executor {n.executor_id}", flush=True)
            cluster.train(train_df, num_epochs=opts.epochs)
        print(f"trained: {cluster.last_feed['rows']} rows fed; SavedModel in {export_dir}", flush=True)

        with TFCluster.run(
            sc, predict, {"export_dir": export_dir}, opts.workers, input_mode=TFCluster.InputMode.SPARK, name="digits-inference"
        ) as cluster:
            predictions = cluster.inference(test_df, schema="label long, prediction long").cache()
            total = predictions.count()
            correct = predictions.where("label = prediction").count()
        print(f"accuracy: {correct / total:.4f} on {total} test digits", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
