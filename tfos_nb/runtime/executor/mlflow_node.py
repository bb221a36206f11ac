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

Without tracking (no ``TFOS_MLFLOW_RUN_ID``) nothing changes.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any

__all__ = ["RUN_ID_ENV", "URI_ENV", "disarm_autolog", "setup"]

RUN_ID_ENV = "TFOS_MLFLOW_RUN_ID"  # one id, or a sweep's ids (one per trial, comma-separated)
URI_ENV = "TFOS_MLFLOW_TRACKING_URI"


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
        os.environ["MLFLOW_RUN_ID"] = own
        uri = os.environ.get(URI_ENV)
        if uri:
            os.environ["MLFLOW_TRACKING_URI"] = uri
    else:
        os.environ.pop("MLFLOW_RUN_ID", None)
        disarm_autolog()


def _autolog_off(*args: Any, **kwargs: Any) -> None:
    """Off on this node: only the chief of a tfos_nb job logs to MLflow (tfos_nb.runtime.executor.mlflow_node)."""


def _disarm(module: Any) -> None:
    try:
        fn = getattr(module, "autolog", None)
    except Exception:  # noqa: BLE001 - a lazy attribute that fails to load: nothing to disarm
        return
    if callable(fn) and fn is not _autolog_off:
        module.autolog = _autolog_off


def _is_mlflow(name: str) -> bool:
    return name == "mlflow" or (name.startswith("mlflow.") and name.count(".") == 1)


class _AutologOff(importlib.abc.MetaPathFinder):
    """Disarms ``autolog`` in ``mlflow`` and ``mlflow.<flavour>`` as each is imported."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not _is_mlflow(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is not None:
            def exec_module(module: Any) -> None:
                run(module)
                _disarm(module)

            loader.exec_module = exec_module  # type: ignore[union-attr,method-assign]  # this spec's own loader instance
        return spec


def disarm_autolog() -> None:
    """From now on in this process, MLflow's autolog functions do nothing (modules imported already included)."""
    if not any(isinstance(f, _AutologOff) for f in sys.meta_path):
        sys.meta_path.insert(0, _AutologOff())
    for name, module in list(sys.modules.items()):
        if _is_mlflow(name) and module is not None:
            _disarm(module)
