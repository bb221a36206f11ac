"""Every epoch of a feed as long as its data, in either Keras (``executor/keras_node/epochs.py``).

A node's share of each fed epoch differs (partitions go to the least busy node), but both Kerases ran every later
epoch for as many steps as the first had: tf_keras stopped ``fit`` at a shorter epoch ("Your input ran out of
data; interrupting training"), and a longer one left rows queued that the next epoch read -- that node lagged its
peers by an epoch (the feed stress run's failures).  Real Keras in a fresh interpreter, a dataset marked as
``as_dataset`` marks its stream, epochs of 2, 4, 1 and 3 batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import json, os, sys
import numpy as np
if sys.argv[2] == "repaired":
    from tfos_nb.runtime.executor.keras_node import epochs as keras_epochs
    keras_epochs.install()  # as every node does
import tensorflow as tf
from tfos_nb.runtime.executor.tracking import datasets as mlflow_datasets
keras = tf.keras if sys.argv[1] == "tf_keras" else __import__("keras")

lengths, epoch = [2, 4, 1, 3], [0]  # the batches of this node's share in each fed epoch
def stream():
    n = lengths[epoch[0]] if epoch[0] < len(lengths) else 0
    epoch[0] += 1
    for _ in range(n):
        yield np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
ds = tf.data.Dataset.from_generator(stream, output_signature=(tf.TensorSpec((None, 3)), tf.TensorSpec((None, 1))))
if sys.argv[3] == "fed":
    setattr(ds, mlflow_datasets.MARK, True)  # as as_dataset marks its stream
ds = ds.map(lambda x, y: (x * 2, y))  # a user's stage on top: still the feed's stream

class Steps(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.n = 0
    def on_train_batch_end(self, batch, logs=None):
        self.n += 1
    def on_epoch_end(self, epoch, logs=None):
        steps.append(self.n)
steps = []
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(ds, epochs=4, verbose=0, callbacks=[Steps()])
print(json.dumps({"steps": steps, "epochs_read": epoch[0]}))
"""


def _fit(keras: str, repaired: bool, fed: bool = True) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
           "TF_USE_LEGACY_KERAS": "1" if keras == "tf_keras" else "0"}
    args = [keras, "repaired" if repaired else "as_is", "fed" if fed else "other"]
    out = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "warned": "ran out of data" in out.stderr}


@pytest.mark.parametrize("keras", ["tf_keras", "keras3"])
def test_each_fed_epoch_runs_until_its_data_ends(keras):
    # and no "ran out of data; interrupting training" warning (Keras 3 gave one at every such epoch's end)
    assert _fit(keras, repaired=True) == {"steps": [2, 4, 1, 3], "epochs_read": 4, "warned": False}


def test_without_the_repair_keras_carries_the_first_epochs_count():
    """What the repair is for, measured on the installed Kerases: when this fails, Keras changed its counting."""
    # tf_keras: 2 of the second epoch's 4 batches; the third "ran out of data" and ended fit, the fourth never ran
    assert _fit("tf_keras", repaired=False) == {"steps": [2, 2, 1], "epochs_read": 3, "warned": True}
    keras3 = _fit("keras3", repaired=False)
    assert keras3["steps"] != [2, 4, 1, 3] and keras3["warned"]  # Keras 3 left a batch of the second unread


def test_a_dataset_not_fed_keeps_keras_own_counting():
    assert _fit("tf_keras", repaired=True, fed=False)["steps"] == [2, 2, 1]
