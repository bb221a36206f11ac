"""On a node, before its function: the seed and op determinism its job asked for (:mod:`..determinism`); during
``fit``, tf_keras' random draws keyed to the step (:func:`step_keyed`, which ``ctx.progress_callback()`` calls)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..executor.keras_node.flavour import legacy
from . import ENV_DETERMINISTIC, ENV_SEED

__all__ = ["apply", "random_generators", "step_keyed"]


def apply(env: Mapping[str, str] = os.environ) -> None:
    """On a node, before the function: seed everything and turn on op determinism as ``env`` says."""
    if ENV_SEED not in env:
        return
    seed = int(env[ENV_SEED])
    import random

    import numpy as np
    import tensorflow as tf

    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    if not legacy(env):  # Keras 3 keeps a global seed of its own
        import keras

        keras.utils.set_random_seed(seed)
    if env.get(ENV_DETERMINISTIC) == "1":
        tf.config.experimental.enable_op_determinism()
        if legacy(env):
            # tf_keras' random layers (Dropout, ...) then draw from a tf.random.Generator, a variable that
            # step_keyed sets at each step; its default, legacy stateful random ops, keep their state in the
            # process, so a resumed run would draw other masks than its clean run
            tf.keras.backend.experimental.enable_tf_random_generator()


def random_generators(model: Any) -> list[tuple[Any, Any]]:
    """tf_keras' random layers in ``model`` (``Dropout``, the noise and augmentation layers), each with its
    ``RandomGenerator``; none in Keras 3, whose layers draw from a seed generator in ``model.variables``."""
    flatten = getattr(model, "_flatten_layers", None)
    layers = flatten(include_self=True, recursive=True) if flatten is not None else ()
    return [(layer, gen) for layer in layers if (gen := getattr(layer, "_random_generator", None)) is not None]


def step_keyed(model: Any, env: Mapping[str, str] = os.environ) -> Callable[[int], None] | None:
    """In deterministic mode under tf_keras, what keys ``model``'s random draws to the step: called with ``s``
    before the step after global step ``s``, it sets each random layer's ``tf.random.Generator`` to its own key and
    a counter made of ``s``, so that a step's draws follow from the seed, the layer, the replica and the step alone.
    None when there is nothing to key (another mode, Keras 3, no random layer on a generator).

    Why: a generator advances by the number of values it drew, so a node whose batches are smaller than the
    chief's (fewer rows in its partitions) ends a step in another state, and the chief's backup cannot give each
    node of a resumed run its own; keyed to the step, a resumed run needs none.  (Keras 3's seed generators advance
    by one a call, alike on every node, and are in the backup with the weights.)
    """
    if env.get(ENV_DETERMINISTIC) != "1" or not legacy(env):
        return None
    keyed: list[tuple[Any, int]] = []
    for _, gen in random_generators(model):
        if getattr(gen, "_rng_type", None) != "stateful":
            continue
        gen._maybe_init()  # a layer not built yet gets its generator now, as its build would make it
        state = gen._generator.state
        copies = getattr(state, "values", None)  # a distributed variable: this node's first copy, no collective
        keyed.append((gen._generator, int((copies[0] if copies else state).numpy()[-1])))
    if not keyed:
        return None

    def key(step: int) -> None:
        for generator, own_key in keyed:
            generator.reset([0, step, own_key])  # Philox's state: a 128-bit counter (low, high word), then the key

    return key
