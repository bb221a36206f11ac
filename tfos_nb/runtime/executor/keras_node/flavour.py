"""Whether the Keras a node was asked for can load, said before the function runs (no TensorFlow import).

``keras="tf_keras"`` (the default, TensorFlowOnSpark's Keras 2) sets ``TF_USE_LEGACY_KERAS=1``; TensorFlow then
serves ``tf.keras`` from the ``tf_keras`` package, whose releases each pair with one TensorFlow minor. tfos_nb does
not require tf-keras itself (pip would pick the newest, and upgrade an installed TensorFlow to match it), so a
node without it, or with one for another TensorFlow, fails at once with the fix instead of inside ``tf.keras``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib import metadata


def _version(*dists: str) -> str | None:
    """The first of ``dists`` installed: its version, read from the folders on ``sys.path`` only.  Spark puts
    ``pyspark.zip`` and py4j's zip on every worker's path, and ``metadata.version`` lists every archive on it for
    each name asked (about 10 ms of each node's start on a quiet machine, more under load); pip installs into no zip."""
    path = [p for p in sys.path if not p.endswith(".zip")]
    for dist in dists:
        found = next(iter(metadata.distributions(name=dist, path=path)), None)
        if found is not None:
            return found.version
    return None


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def legacy(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this node's ``tf.keras`` is tf_keras (``TF_USE_LEGACY_KERAS``, as TensorFlow reads it)."""
    return env.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")


def problem(env: Mapping[str, str] = os.environ) -> str | None:
    """Why ``tf.keras`` cannot load as asked here, with the fix; None when it can (or when it is not tf_keras's)."""
    if not legacy(env):
        return None
    tf = _version("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")
    if tf is None or tuple(int(x) for x in _minor(tf).split(".") if x.isdigit()) < (2, 16):
        return None  # before 2.16 tf.keras is TensorFlow's own Keras 2
    tk = _version("tf_keras", "tf-keras")
    fix = f"pip install 'tf-keras~={_minor(tf)}.0' where the nodes run, or start the job with keras='keras3'"
    if tk is None:
        return f"keras='tf_keras' (the default) needs the tf-keras package for TensorFlow {tf}: {fix}"
    if _minor(tk) != _minor(tf):
        return f"tf-keras {tk} is for TensorFlow {_minor(tk)}, and this node has TensorFlow {tf}: {fix}"
    return None
