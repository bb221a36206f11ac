"""A node's side of experiment tracking (the notebook's side: :mod:`..driver.tracking`).

The notebook logs the job's one MLflow run; every node gets that run's id as
``ctx.mlflow_run_id`` (a sweep's trial: its own child run's).  The rule for node functions that
call MLflow themselves:

- the chief (worker 0 without a chief; every trial of a sweep) also gets ``MLFLOW_RUN_ID`` and
  ``MLFLOW_TRACKING_URI``, so its ``mlflow.start_run()`` and autologging continue the job's run;
- on every other node MLflow's ``autolog`` functions (``mlflow.autolog`` and each
  ``mlflow.<flavour>.autolog``) do nothing, whenever mlflow is imported there (an import hook:
  nothing is imported here), so ``mlflow.tensorflow.autolog()`` in a distributed Keras function
  makes one run, not one per worker.  What a non-chief node logs by hand is up to it: log from
  ``ctx.is_chief``.

The tracking URI may carry credentials (``https://user:token@host``): a cluster's supervisor keeps
it out of every node's environment but the chief's (:func:`node_env`).

Without tracking (no ``TFOS_MLFLOW_RUN_ID``) nothing changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..import_patches import patch_modules
from . import datasets as mlflow_datasets

__all__ = ["RUN_ID_ENV", "URI_ENV", "chief_index", "disarm_autolog", "node_env", "setup"]

RUN_ID_ENV = "TFOS_MLFLOW_RUN_ID"  # one id, or a sweep's ids (one per trial, comma-separated)
URI_ENV = "TFOS_MLFLOW_TRACKING_URI"


def chief_index(roles: Sequence[Sequence[Any]]) -> int | None:
    """The node that logs to MLflow, by its index in ``roles`` (``[job_name, task_index]`` each): the chief
    (or master), else worker 0 — ``ctx.is_chief``'s rule."""
    for i, (job_name, _task) in enumerate(roles):
        if job_name in ("chief", "master"):
            return i
    return next((i for i, (job_name, task) in enumerate(roles) if job_name == "worker" and int(task) == 0), None)


def node_env(env: Mapping[str, str], roles: Sequence[Sequence[Any]], node: int) -> dict[str, str]:
    """The cell's ``env`` as cluster node ``node`` gets it: the tracking URI (it may carry a password) only on the
    node that logs; every node keeps the run id (``ctx.mlflow_run_id``)."""
    out = dict(env)
    if node != chief_index(roles):
        out.pop(URI_ENV, None)
    return out


def setup(ctx: Any) -> None:
    """Give ``ctx`` its ``mlflow_run_id``; the chief's MLflow calls log into it, the others' autologging is off."""
    ids = os.environ.get(RUN_ID_ENV, "").split(",")
    if not any(ids):
        return
    index = getattr(ctx, "run_index", None)  # a sweep's trial is the chief of its own run
    if index is not None:
        own: str | None = ids[index] if index < len(ids) else None
        logs = True
    else:
        own, logs = ids[0], bool(ctx.is_chief)
    ctx.mlflow_run_id = own
    if logs and own:
        mlflow_datasets.guard()  # autologging must not iterate as_dataset's stream for a digest
        os.environ["MLFLOW_RUN_ID"] = own
        uri = os.environ.get(URI_ENV)
        if uri:
            os.environ["MLFLOW_TRACKING_URI"] = uri
    else:
        os.environ.pop("MLFLOW_RUN_ID", None)
        disarm_autolog()


def _autolog_off(*args: Any, **kwargs: Any) -> None:
    """Off on this node: only the chief of a tfos_nb job logs to MLflow (tfos_nb.runtime.executor.tracking.node)."""


def _disarm(module: Any) -> None:
    try:
        fn = getattr(module, "autolog", None)
    except Exception:  # noqa: BLE001 - a lazy attribute that fails to load: nothing to disarm
        return
    if callable(fn) and fn is not _autolog_off:
        module.autolog = _autolog_off


def _is_mlflow(name: str) -> bool:
    return name == "mlflow" or (name.startswith("mlflow.") and name.count(".") == 1)


def disarm_autolog() -> None:
    """From now on in this process, MLflow's autolog functions do nothing (modules imported already included)."""
    patch_modules(_is_mlflow, _disarm)
