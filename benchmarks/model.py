"""The Keras program the training benchmarks train (B2, B5's ``fit``, the native MWMS references), and its timer.

Nodes build it from the function itself (``args["build_model"]``): ``harness.ship_by_value(model)`` first.
"""

from __future__ import annotations

import time
from typing import Any

FEATURES = 784
CLASSES = 10


def build_model(kind: str = "mlp", keras3: bool = False) -> Any:
    """``mlp``: 784-128-10.  ``cnn``: TensorFlowOnSpark's mnist example CNN on the rows as 28×28×1 images.
    ``keras3``: the same model written with ``import keras`` (Keras 3), not ``tf.keras`` (tf_keras on the nodes)."""
    if keras3:
        import keras as k
    else:
        import tensorflow as tf

        k = tf.keras
    if kind == "cnn":
        layers = [k.layers.Reshape((28, 28, 1)),
                  k.layers.Conv2D(32, 3, activation="relu"),
                  k.layers.MaxPooling2D(),
                  k.layers.Flatten(),
                  k.layers.Dense(64, activation="relu")]
    else:
        layers = [k.layers.Dense(128, activation="relu")]
    model = k.Sequential([k.layers.Input(shape=(FEATURES,)), *layers, k.layers.Dense(CLASSES, activation="softmax")])
    model.compile(optimizer=k.optimizers.Adam(learning_rate=1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def accuracy(model: Any, x: Any, y: Any) -> float:
    """The share of ``x``'s rows that ``model`` classifies as ``y``."""
    pred = model.predict(x, batch_size=1024, verbose=0).argmax(axis=1)
    return float((pred == y).mean())


def later_epochs_timer(keras: Any) -> Any:
    """A callback (of ``keras``: Keras 3 takes its own callbacks only) timing the epochs after the first, which
    builds the graph and the collectives: a step = their wall time / their steps (``steps``, ``wall``); ``total``:
    every step; ``ends``: each epoch's end (time.time()), to line the nodes' epochs up; ``t_epoch1``: the second
    epoch's start.  It takes the batch logs as tensors (``_supports_tf_logs``) so that it does not make Keras wait
    for each step."""

    class Timer(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True
            self.epoch, self.steps, self.total, self.wall = 0, 0, 0, 0.0
            self.ends: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch
            self.t0 = time.perf_counter()
            if epoch == 1:
                self.t_epoch1 = time.time()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.total += 1
            if self.epoch > 0:
                self.steps += 1

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.ends.append(time.time())
            if epoch > 0:
                self.wall += time.perf_counter() - self.t0

    return Timer()


def step_parts(strategy: Any, model: Any, kind: str, batch: int, ds: Any) -> dict[str, Any]:
    """What a training step of ``model`` is made of, on a node after its ``fit`` (s): ``compute``, the same forward +
    backward + Adam update on one batch, no strategy, no feed; ``allreduce``, the strategy's all-reduce of the
    model's gradient tensors across the nodes, alone; ``data``, a step's share of one more epoch of ``ds`` drained
    with no model."""
    import numpy as np
    import tensorflow as tf

    per_replica = batch // strategy.num_replicas_in_sync  # the rows one step trains on, per node
    x = tf.constant(np.random.default_rng(0).random((per_replica, 784), dtype=np.float32))
    y = tf.constant(np.arange(per_replica, dtype=np.int32) % 10)

    local = build_model(kind)  # no strategy: pure compute of one step
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def local_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, local(x, training=True))
        grads = tape.gradient(loss, local.trainable_variables)
        local.optimizer.apply_gradients(zip(grads, local.trainable_variables))
        return loss

    def timed(fn, reps=50):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    compute = timed(lambda: local_step().numpy())

    grads_like = [tf.zeros_like(v) for v in model.trainable_variables]

    @tf.function
    def allreduce():
        def fn(*g):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(g))
        return strategy.run(fn, args=tuple(grads_like))

    allreduce_s = timed(lambda: [t.numpy() for t in strategy.experimental_local_results(allreduce()[0])])

    # one more epoch (the driver's second train() call), drained with no model
    it = iter(ds)
    times, t0 = [], time.perf_counter()
    for _ in it:
        now = time.perf_counter()
        times.append(now - t0)
        t0 = now
    # an element of ds feeds num_replicas_in_sync steps (Keras splits it): data time per step
    data = float(np.median(times)) / strategy.num_replicas_in_sync if times else None
    return {"compute": compute, "allreduce": allreduce_s, "data": data}
