"""The Keras progress callback reports the model's numbers, not Keras' per-replica sums.

Real ``MultiWorkerMirroredStrategy`` clusters of 1, 2 and 3 worker processes started by hand
(``TF_CONFIG``, no Spark: the callback is what is under test), each training a small model
with ``ctx.progress_callback()``; the reports the callback makes are compared with what
``model.fit(...).history`` returns on the same worker.  Before the fix, 2 workers read 2x the
loss and accuracy at every step, 3 workers 3x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import NODE_ENV, free_port

pytestmark = pytest.mark.slow

WORKER = r"""
import json, sys
import numpy as np
from tfos_nb.runtime.executor.keras_node import keras3_mwms
keras3_mwms.install()  # as every node does: Keras 3's trainer repaired for MultiWorkerMirroredStrategy
import tensorflow as tf
from tfos_nb.runtime.executor.keras_node.progress import progress_callback

index, workers, epochs = int(sys.argv[1]), int(sys.argv[2]), 3
reports = []

class Ctx:  # the node context's one method the callback uses
    def report(self, **values):
        reports.append(values)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(index)  # each worker its own rows: local metrics differ from the global ones
x = (rng.normal(size=(96, 8)) + index).astype("float32")
y = rng.integers(0, 3, size=len(x))
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16 * workers).with_options(options)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])
    model.compile(tf.keras.optimizers.Adam(0.01), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
fit = model.fit(ds, epochs=epochs, verbose=0, callbacks=[progress_callback(Ctx())])
print(json.dumps({"replicas": strategy.num_replicas_in_sync, "reports": reports, "history": fit.history}))
"""


def _ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:  # below the ephemeral range (bind(0) races the machine's outgoing connections)
        ports.add(free_port())
    return sorted(ports)


def _train(workers: int, legacy_keras: bool) -> list[dict]:
    ports = _ports(workers)
    procs = []
    for index in range(workers):
        tf_config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, **NODE_ENV, TF_CONFIG=json.dumps(tf_config), TF_USE_LEGACY_KERAS="1" if legacy_keras else "0")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(index), str(workers)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, stderr[-3000:]
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


def _last_step_of_each_epoch(reports: list[dict]) -> list[dict]:
    """The per-step reports (they carry a ``loss``), the last one of each epoch; epoch-end reports left out."""
    steps = [r for r in reports if "loss" in r]
    by_epoch: dict[int, dict] = {}
    seen_steps: set[int] = set()
    for r in steps:
        if r["step"] in seen_steps:  # the epoch-end report repeats the epoch's last step: keep the step's own
            continue
        seen_steps.add(r["step"])
        by_epoch[r["epoch"]] = r
    return [by_epoch[e] for e in sorted(by_epoch)]


# Keras 3 across worker processes failed inside Keras ("Attempt to convert a value (PerReplica...)") until the
# nodes' repair of its trainer (keras3_mwms); its per-step reduction is "mean" (nothing to undo), and the repaired
# step logs are the global metrics, so its last step equals the epoch's History value too.
@pytest.mark.parametrize(("workers", "legacy_keras"), [(1, True), (2, True), (3, True), (1, False), (2, False),
                                                        (3, False)],
                         ids=["tf_keras-1", "tf_keras-2", "tf_keras-3", "keras3-1", "keras3-2", "keras3-3"])
def test_per_step_metrics_equal_the_models_at_each_epochs_end(workers: int, legacy_keras: bool) -> None:
    for worker in _train(workers, legacy_keras):
        assert worker["replicas"] == workers
        history = worker["history"]
        last_steps = _last_step_of_each_epoch(worker["reports"])
        assert len(last_steps) == len(history["loss"]) == 3, worker["reports"]
        for epoch, report in enumerate(last_steps):
            assert report["epoch"] == epoch + 1, report  # "epoch k/n" as Keras prints it, not a 0-based index
            for name in ("loss", "accuracy"):
                assert report[name] == pytest.approx(history[name][epoch], rel=1e-5), (name, epoch, report, history)
        accuracies = [r["accuracy"] for r in worker["reports"] if "accuracy" in r]
        assert accuracies and all(0.0 <= a <= 1.0 for a in accuracies), accuracies
