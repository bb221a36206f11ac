"""On a node, before its function: the seed and op determinism its job asked for (:mod:`..determinism`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..determinism import ENV_DETERMINISTIC, ENV_SEED

__all__ = ["apply"]


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
    from .keras_flavour import legacy

    if not legacy(env):  # Keras 3 keeps a global seed of its own
        import keras

        keras.utils.set_random_seed(seed)
    if env.get(ENV_DETERMINISTIC) == "1":
        tf.config.experimental.enable_op_determinism()
