"""MLflow never iterates a stream-fed dataset: the chief's side of logging what a job trained on.

MLflow's autologging (``mlflow.tensorflow.autolog()``, ``mlflow.keras.autolog()``; ``log_datasets=True``
by default) records ``fit``'s dataset with ``mlflow.data.from_tensorflow``, whose digest iterates the
whole dataset.  On a node, ``ctx.get_data_feed().as_dataset()`` is a one-pass stream of the job's
DataFrame: that iteration would consume an epoch before ``fit`` starts, and ``fit`` would then wait
for rows the job never feeds.  So on the node that logs (the chief), once MLflow's modules are
imported:

- autologging's dataset step skips a stream-fed dataset (the notebook logs the DataFrame itself as
  the run's ``train`` input: its schema, row count and Spark's digest, :func:`..driver.tracking.inputs.log_train_input`);
- ``mlflow.data.from_tensorflow`` refuses one with a sentence saying why (a user's own call).

Other datasets (numpy arrays, ``from_tensor_slices``, files the node reads) are left to MLflow.
Nothing of MLflow is imported here: each module is patched as it loads (:func:`.import_patches.patch_modules`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ..import_patches import patch_modules, replace_once

__all__ = ["REFUSAL", "guard", "is_stream_fed"]

MARK = "_tfos_nb_stream"  # set by DataFeed.as_dataset on the dataset its generator feeds
REFUSAL = ("this dataset is tfos_nb's stream of the job's DataFrame (ctx.get_data_feed().as_dataset()): "
           "iterating it for a digest would consume an epoch before fit; the notebook logs the DataFrame "
           "as the run's input instead")


def is_stream_fed(dataset: Any) -> bool:
    """Whether ``dataset`` is, or is built on (``map``, ``batch``, ``cache``…), a feed's stream."""
    todo, seen = [dataset], set()
    while todo:
        ds = todo.pop()
        if id(ds) in seen:
            continue
        seen.add(id(ds))
        if getattr(ds, MARK, False):
            return True
        inputs = getattr(ds, "_inputs", None)
        if callable(inputs):
            try:
                todo.extend(inputs())
            except Exception:  # noqa: BLE001 - a dataset type without inputs: a leaf
                continue
    return False


def _guarded(fn: Callable[..., Any], on_stream: Callable[[], Any]) -> Callable[..., Any]:
    """``fn``, except that a stream-fed dataset as its first argument (given by position or by name: MLflow
    calls ``from_tensorflow(features=…)``) gets ``on_stream()`` instead."""
    name = next(iter(inspect.signature(fn).parameters))

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        dataset = args[0] if args else kwargs.get(name)
        return on_stream() if is_stream_fed(dataset) else fn(*args, **kwargs)

    return guarded


def _refuse() -> Any:
    raise ValueError(REFUSAL)


def _refusing(from_tensorflow: Callable[..., Any]) -> Callable[..., Any]:
    return _guarded(from_tensorflow, _refuse)  # a user's own call: say why


def _skipping(log_dataset: Callable[..., Any]) -> Callable[..., Any]:
    return _guarded(log_dataset, lambda: None)  # autologging's step: the notebook logs the DataFrame


# module -> (attribute, wrapper): the places MLflow builds a dataset record from a tf.data.Dataset
_PATCHES: dict[str, list[tuple[str, Callable[[Callable[..., Any]], Callable[..., Any]]]]] = {
    "mlflow.data.tensorflow_dataset": [("from_tensorflow", _refusing)],
    "mlflow.data": [("from_tensorflow", _refusing)],
    "mlflow.tensorflow": [("from_tensorflow", _refusing), ("_log_tensorflow_dataset", _skipping)],
    "mlflow.keras.autologging": [("from_tensorflow", _refusing), ("_log_dataset", _skipping)],
}


def _patch(module: Any) -> None:
    for attr, wrap in _PATCHES.get(getattr(module, "__name__", ""), ()):
        replace_once(module, attr, wrap)


def guard() -> None:
    """From now on in this process, MLflow never iterates a stream-fed dataset (modules imported already included)."""
    patch_modules(_PATCHES.__contains__, _patch)
