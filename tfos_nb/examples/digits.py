"""scikit-learn's digits, trained with MultiWorkerMirroredStrategy on Spark executors.

The data set ships inside scikit-learn (1,797 8x8 images), so nothing is
downloaded.  Used by the README's demo, the quickstart notebook and the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FEATURES = 64
CLASSES = 10


SKLEARN_MISSING = (
    "tfos_nb.examples needs scikit-learn (the digits data set ships inside it): "
    "pip install 'tfos_nb[examples]'  (or: pip install scikit-learn)"
)


def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        err = ImportError(SKLEARN_MISSING)
        err.name = "sklearn"
        raise err from exc
    features, labels = load_digits(return_X_y=True)
    return features, labels


def load_digits_arrays(seed: int = 0, test_fraction: float = 0.25) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test), features scaled to [0, 1]."""
    x, y = _sklearn_digits()
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def to_dataframe(spark: Any, x: np.ndarray, y: np.ndarray, partitions: int = 4) -> Any:
    """A DataFrame with ``features array<float>`` and ``label long`` columns."""
    import pandas as pd

    pdf = pd.DataFrame({"features": x.tolist(), "label": y.tolist()})  # plain floats: pyspark < 4 checks types without Arrow
    return spark.createDataFrame(pdf, "features array<float>, label long").repartition(partitions)


def build_model(learning_rate: float = 0.01) -> Any:
    """A small MLP for 64 features and 10 classes (``tf.keras``: Keras 2 on the nodes)."""
    import tensorflow as tf

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((FEATURES,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train_fun(args: dict[str, Any], ctx: Any) -> None:
    """The node function: MWMS training from the Spark feed, then a SavedModel export."""
    import tensorflow as tf

    from tfos_nb import compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model(args.get("learning_rate", 0.01))
    ds = ctx.get_data_feed().as_dataset(batch_size=args.get("batch_size", 32))
    model.fit(ds, epochs=args.get("epochs", 1), verbose=0, callbacks=[ctx.progress_callback()])
    compat.export_saved_model(model, args["export_dir"], ctx.is_chief)


def predict_fun(args: dict[str, Any], ctx: Any) -> None:
    """The node function for ``cluster.inference``: predicted class per row."""
    import tensorflow as tf

    model = tf.saved_model.load(args["export_dir"])
    serve = model.signatures["serving_default"]
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_arrays(args.get("batch_size", 256))
        if not cols:
            break
        out = serve(tf.constant(cols[0], dtype=tf.float32))
        logits = next(iter(out.values())).numpy()
        feed.batch_results(np.argmax(logits, axis=1).astype(np.int64))
