"""A job's seed and deterministic mode (``runtime/determinism/__init__.py``): what the driver accepts and tells the nodes,
and what a node does with it — in a real Python process with TensorFlow and Keras 3, since the seeds are process
state."""

import json
import subprocess
import sys

import pytest

from tfos_nb.runtime import determinism
from tfos_nb.runtime.determinism import order
from tfos_nb.runtime.driver.retry import run_job


def test_the_nodes_environment_says_the_seed_and_the_mode():
    assert determinism.node_env() == {}
    assert determinism.node_env(seed=7) == {"TFOS_SEED": "7"}
    assert determinism.node_env(True) == {"TFOS_SEED": "0", "TFOS_DETERMINISTIC": "1"}  # a seed it needs: 0
    assert determinism.node_env(True, 3) == {"TFOS_SEED": "3", "TFOS_DETERMINISTIC": "1"}


@pytest.mark.parametrize(("kw", "message"), [
    ({"deterministic": 1}, "deterministic must be True or False, got 1"),
    ({"seed": -1}, "seed must be an integer from 0 to 2**32 - 1, got -1"),
    ({"seed": 2**32}, "seed must be an integer from 0 to 2**32 - 1, got 4294967296"),
    ({"seed": 1.5}, "seed must be an integer from 0 to 2**32 - 1, got 1.5"),
])
def test_bad_settings_are_one_sentence(kw, message):
    with pytest.raises(ValueError) as info:
        determinism.node_env(**kw)
    assert str(info.value) == message


def test_run_job_refuses_to_shrink_a_deterministic_job():
    with pytest.raises(ValueError) as info:
        run_job(None, lambda args, ctx: None, {}, 2, retries=1, min_workers=1, deterministic=True)
    assert str(info.value).startswith("min_workers=1 cannot go with deterministic=True: a retry on fewer nodes")


def test_the_fixed_feed_deals_partitions_round_robin_each_after_its_nodes_previous_one():
    """The driver's half of the fixed feed: partition p to node p mod n, read after partition p - n (-1: the node's
    first), whatever order Spark's tasks ask in."""
    nodes = ["chief:0", "worker:0", "worker:1"]
    dealt = {p: order.reader(p, nodes) for p in (7, 0, 4, 2, 3, 1, 5, 6)}
    assert dealt == {0: ("chief:0", -1), 1: ("worker:0", -1), 2: ("worker:1", -1), 3: ("chief:0", 0),
                     4: ("worker:0", 1), 5: ("worker:1", 2), 6: ("chief:0", 3), 7: ("worker:0", 4)}
    assert order.reader(5, ["chief:0"]) == ("chief:0", 4)
    with pytest.raises(ValueError, match="needs a training node"):
        order.reader(0, [])


NODE = """
import json, os, random, sys
import numpy as np
from tfos_nb.runtime.determinism import seeding
seeding.apply()
import keras
import tensorflow as tf
from tensorflow.python.framework import config  # the public API turns it on but cannot say whether it is
layer = keras.layers.Dense(3)
layer.build((None, 2))
print(json.dumps({"random": random.random(), "numpy": float(np.random.rand()),
                  "tf": float(tf.random.uniform(())), "keras": layer.kernel.numpy().tolist(),
                  "op_determinism": config.is_op_determinism_enabled()}))
"""


def node_draws(env: dict[str, str]) -> dict:
    import os

    out = subprocess.run([sys.executable, "-c", NODE], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
                         capture_output=True, text=True, timeout=240, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_seeded_node_draws_the_same_numbers_in_every_process_and_deterministic_mode_adds_op_determinism():
    """Two node processes with seed 11, one in deterministic mode: the same draws from Python, NumPy, TensorFlow and
    a new Keras 3 layer's initializer (two unseeded processes would differ in all four), op determinism only in
    deterministic mode."""
    plain, det = node_draws(determinism.node_env(seed=11)), node_draws(determinism.node_env(True, 11))
    assert (plain.pop("op_determinism"), det.pop("op_determinism")) == (False, True)
    assert plain == det
