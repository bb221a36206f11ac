"""The MLflow run of one tfos_nb job: what is logged, and how (the when and the hooks: :mod:`tfos_nb.runtime.driver.tracking`).

A :class:`JobRun` is made on the caller's thread when tracking is asked for, fed by the job's
lifecycle (each attempt's :class:`~..job.DriverJob` is attached and logged when it ends) and
finished once with the job's outcome.  Everything goes through ``MlflowClient`` against the
notebook's tracking URI; nothing here imports IPython, and mlflow only inside functions.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ... import net, private, step_time
from ...executor.tracking.node import URI_ENV, chief_index
from ..control import state as cluster_state

log = logging.getLogger(__name__)

__all__ = ["EXTRA", "RUN_ID_ENV", "JobRun", "Request", "flat_params", "import_mlflow", "run_url", "versions"]

EXTRA = "pip install 'tfos_nb[mlflow]'"
RUN_ID_ENV = "TFOS_MLFLOW_RUN_ID"  # the nodes' run id (a sweep: one per trial, comma-separated)
_PARAM_MAX = 6000  # MLflow's longest param value
_BATCH = 1000  # MLflow's most metrics in one log_batch
_STATUS: dict[str, str] = {cluster_state.C_FINISHED: "FINISHED", cluster_state.C_FAILED: "FAILED", cluster_state.C_STOPPED: "KILLED"}


def import_mlflow() -> Any:
    """``mlflow``, or an ImportError that says how to install it."""
    try:
        import mlflow
    except ImportError as exc:
        msg = f"experiment tracking needs the MLflow client: {EXTRA}"
        raise ImportError(msg) from exc
    return mlflow


@dataclasses.dataclass(frozen=True)
class Request:
    """Tracking asked for, resolved on the caller's thread: where to log, and under which run."""

    tracking_uri: str = dataclasses.field(repr=False)  # it may carry credentials (https://user:token@host)
    experiment_id: str
    parent_run_id: str | None = None  # the caller's active run: the job logs into it
    all_nodes: bool = False
    run_name: str | None = None


def flat_params(args: Any, prefix: str = "") -> dict[str, str]:
    """The job's ``args`` as MLflow params: a dict/namespace flattened (``a.b``), an argv list as one param."""
    if args is None:
        return {}
    if isinstance(args, (list, tuple)):
        return {prefix or "argv": " ".join(map(str, args))[:_PARAM_MAX]}
    if not isinstance(args, Mapping):
        try:
            args = dict(vars(args))
        except TypeError:
            return {prefix or "args": str(args)[:_PARAM_MAX]}
    out: dict[str, str] = {}
    for key, value in args.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = str(value)[:_PARAM_MAX]
    return out


def versions(sc: Any = None) -> dict[str, str]:
    """tfos_nb, TensorFlow, Keras and Spark versions (from the installed packages: nothing is imported)."""
    package = sys.modules.get("tfos_nb")  # loaded (this module is in it); not imported here: no import cycle
    out = {"tfos_nb_version": str(getattr(package, "__version__", "unknown"))}
    for dist, key in (("tensorflow", "tensorflow_version"), ("tf-keras", "tf_keras_version"),
                      ("keras", "keras_version"), ("pyspark", "pyspark_version")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    spark = getattr(sc, "version", None)
    if isinstance(spark, str):
        out["spark_version"] = spark
    return out


_KEY_BAD = re.compile(r"[^\w\-. /]")


def _key(name: str) -> str:
    return _KEY_BAD.sub("_", str(name))[:250] or "_"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            import numpy as np

            if isinstance(value, np.generic) and np.ndim(value) == 0 and np.issubdtype(value.dtype, np.number):
                return float(value)
        except ImportError:  # pragma: no cover - numpy comes with pandas/pyarrow
            pass
        return None
    return float(value)


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The tracking UI's page of the run, where the server has a UI (HTTP or Databricks); None for a local store.

    Built as MLflow's own client builds the "View run" link it prints, without the URI's ``user:password@``:
    the link is shown in the panel and saved in the notebook.
    """
    try:
        from mlflow.store.tracking.rest_store import RestStore
        from mlflow.tracking._tracking_service.utils import _get_store
        from mlflow.utils.databricks_utils import get_workspace_url
        from mlflow.utils.uri import is_databricks_uri

        store = _get_store(tracking_uri)
        if not isinstance(store, RestStore):
            return None
        host = get_workspace_url() or store.get_host_creds().host.rstrip("/")
        part = "ml/experiments" if is_databricks_uri(tracking_uri) else "#/experiments"
        return net.without_credentials(f"{host.rstrip('/')}/{part}/{experiment_id}/runs/{run_id}")
    except Exception:  # noqa: BLE001 - a link is a convenience: never a reason to fail a job
        return None


class JobRun:
    """The MLflow run of one job (and a sweep's child runs), fed by the job's lifecycle.

    The hooks: :meth:`node_env` (what the nodes get), :meth:`attach` (each attempt's
    :class:`~..job.DriverJob`: its metrics are logged when it ends), :meth:`log_returned`
    (a sweep's returned values) and :meth:`finish` (status, tags, artifacts; idempotent).
    Logging errors are warnings: tracking never fails a job once it runs.
    """

    def __init__(self, req: Request, name: str, kind: str, params: Mapping[str, Any], *,
                 trials: Sequence[Mapping[str, Any]] | None = None) -> None:
        mlflow = import_mlflow()
        self.request = req
        self.name = name
        self.kind = kind
        self.client = mlflow.MlflowClient(req.tracking_uri)
        self.experiment_id = req.experiment_id
        self._lock = threading.Lock()
        self._finished = False
        self.attempts = 0
        self.resumed: list[str] = []  # where each retry resumed from (and on how many nodes), oldest first
        self.failures: list[str] = []
        self.export_dir: str | None = None
        self.log_dir: str | None = None
        self.all_nodes = req.all_nodes
        base_tags = {"tfos_nb.kind": kind, "tfos_nb.name": name}
        if req.parent_run_id is not None and trials is None:
            self.run_id, self.owned = req.parent_run_id, False  # the caller's run: logged into, ended by the caller
        else:
            tags = dict(base_tags)
            if req.parent_run_id is not None:
                tags["mlflow.parentRunId"] = req.parent_run_id
            run = self.client.create_run(self.experiment_id, run_name=req.run_name or name, tags=tags)
            self.run_id, self.owned = run.info.run_id, True
        self.trial_ids: list[str] = []
        for i, trial in enumerate(trials or ()):
            child = self.client.create_run(self.experiment_id, run_name=f"{req.run_name or name} run:{i}",
                                           tags={"tfos_nb.kind": "trial", "mlflow.parentRunId": self.run_id,
                                                 "tfos_nb.run": str(i)})
            self.trial_ids.append(child.info.run_id)
            self._log_params(child.info.run_id, flat_params(trial))
        self._log_params(self.run_id, {k: str(v)[:_PARAM_MAX] for k, v in params.items()})
        self._set_tags(self.run_id, base_tags)
        self.url = run_url(req.tracking_uri, self.experiment_id, self.run_id)

    # -- the hooks ------------------------------------------------------------------------
    def node_env(self) -> dict[str, str]:
        """The nodes' environment: the run id(s) (``ctx.mlflow_run_id``) and the tracking URI, which may carry
        credentials: only the node that logs keeps it (:func:`~tfos_nb.runtime.executor.tracking.node.node_env`)."""
        ids = ",".join(self.trial_ids) if self.trial_ids else self.run_id
        return {RUN_ID_ENV: ids, URI_ENV: self.request.tracking_uri}

    def attach(self, job: Any, *, finish_with_job: bool = False) -> None:
        """Log ``job``'s metrics when it ends (``finish_with_job``: and end the run with it)."""
        with self._lock:
            self.attempts += 1
            attempt = self.attempts
        job.state.tracking_url = self.url

        def ended(job: Any) -> None:
            self._attempt_ended(job.state, attempt)
            if finish_with_job:
                view = job.state.snapshot()
                self.finish(view.state, error=view.error)

        job.add_end_listener(ended)

    def _attempt_ended(self, state: cluster_state.ClusterState, attempt: int) -> None:
        try:
            view = state.snapshot()
            if self.trial_ids:
                self._log_trials(state, view)
            else:
                self._log_history(state, view, attempt)
            self._log_failures(view, attempt)
            if view.state == cluster_state.C_FAILED:  # the failing node and its error, as the job's error's first line says it
                from ..errors import failure_message

                what = f"cluster {view.name}" if self.kind == "cluster" else f"parallel runs {view.name}"
                line = failure_message(view, what).splitlines()[0]
                self.failures.append(f"attempt {attempt}: {line}"[:500])
        except Exception as exc:  # noqa: BLE001
            log.warning("tfos_nb: MLflow logging of %s failed: %s", self.name, net.scrub_credentials(str(exc)))

    def log_returned(self, results: Sequence[Any], state: cluster_state.ClusterState) -> None:
        """A sweep's returned values: each result's scalars as its trial's metrics, at the trial's last step."""
        from ..parallel.results import scalars

        try:
            last: dict[int, int] = {}
            for _role, _task, index, _t, step, _values in state.history():
                if isinstance(step, int):
                    last[index] = max(step, last.get(index, step))
            for r in results:
                if r.index >= len(self.trial_ids):
                    continue
                values = scalars(r.value) if isinstance(r.value, Mapping) else {}
                metrics = [self._metric(str(k), v, time.time(), last.get(r.index, 0)) for k, v in values.items()]
                self._log_metrics(self.trial_ids[r.index], [m for m in metrics if m is not None])
        except Exception as exc:  # noqa: BLE001
            log.warning("tfos_nb: MLflow logging of %s's results failed: %s", self.name,
                        net.scrub_credentials(str(exc)))

    def finish(self, state: str, *, error: Any = None) -> None:
        """End the run as the job ended (``state``: finished/failed/stopped): tags, artifacts, status (once)."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        status = "FAILED" if error is not None and state != cluster_state.C_STOPPED else _STATUS.get(state, "KILLED")
        try:
            tags = {"tfos_nb.outcome": status.lower() if status != "KILLED" else "stopped",
                    "tfos_nb.attempts": str(max(self.attempts, 1))}
            for key, said in (("tfos_nb.failures", self.failures), ("tfos_nb.resumed", self.resumed)):
                if said:
                    tags[key] = "; ".join(said)[:5000]
            if error is not None:
                tags["tfos_nb.error"] = (str(error).splitlines() or [type(error).__name__])[0][:5000]
            self._set_tags(self.run_id, tags)
            if status == "FINISHED":
                self._log_model()
            self._log_tensorboard()
        except Exception as exc:  # noqa: BLE001
            log.warning("tfos_nb: MLflow logging of %s failed: %s", self.name, net.scrub_credentials(str(exc)))
        finally:
            if self.owned:
                for run_id in self.trial_ids:
                    self._terminate(run_id, None)
                self._terminate(self.run_id, status)

    # -- what is logged -----------------------------------------------------------------
    def _log_history(self, state: cluster_state.ClusterState, view: cluster_state.ClusterView, attempt: int) -> None:
        found = chief_index([(n.job_name, n.task_index) for n in view.nodes])
        chief = None if found is None else view.nodes[found].index
        ordinals: dict[int, int] = {}
        metrics: list[Any] = []
        for role, task_index, index, t, step, values in state.history():
            if index != chief and not self.all_nodes:
                continue
            prefix = "" if index == chief else f"{role}_{task_index}/"
            ordinals[index] = ordinals.get(index, -1) + 1
            at = step if isinstance(step, int) else ordinals[index]
            for key, value in values.items():
                m = self._metric(prefix + str(key), value, t, at)
                if m is not None:
                    metrics.append(m)
        metrics += [m for n in view.nodes if n.steps_per_sec is not None and (m := self._metric(
            f"system/steps_per_sec/{n.job_name}_{n.task_index}", n.steps_per_sec, time.time(), attempt - 1))]
        metrics += [m for (role, task_index), shares in step_time.per_node(state.history_with_times()).items()
                    for category, share in shares.items()  # where each node's time went over the attempt
                    if (m := self._metric(f"system/time_{category}/{role}_{task_index}", share, time.time(), attempt - 1))]
        self._log_metrics(self.run_id, metrics)

    def _log_trials(self, state: cluster_state.ClusterState, view: cluster_state.ClusterView) -> None:
        per_run: dict[int, list[Any]] = {}
        ordinals: dict[int, int] = {}
        for _role, _task, index, t, step, values in state.history():
            ordinals[index] = ordinals.get(index, -1) + 1
            at = step if isinstance(step, int) else ordinals[index]
            for key, value in values.items():
                m = self._metric(str(key), value, t, at)
                if m is not None:
                    per_run.setdefault(index, []).append(m)
        for index, metrics in per_run.items():
            if index < len(self.trial_ids):
                self._log_metrics(self.trial_ids[index], metrics)
        best = getattr(view, "best", None)
        metric = getattr(view, "metric", None)
        if best is not None:
            self._set_tags(self.run_id, {"tfos_nb.best_run": str(best), "tfos_nb.best_run_id": self.trial_ids[best]})
            value = view.nodes[best].metrics.get(metric) if metric else None
            m = self._metric(f"best_{metric}", value, time.time(), 0) if metric else None
            if m is not None:
                self._log_metrics(self.run_id, [m])
        for n in view.nodes:  # each trial's own outcome
            if n.index < len(self.trial_ids):
                self._set_tags(self.trial_ids[n.index], {"tfos_nb.outcome": n.state})

    def _log_failures(self, view: cluster_state.ClusterView, attempt: int) -> None:
        for n in view.nodes:
            if n.state != cluster_state.FAILED:
                continue
            text = "\n".join([*(n.error and [n.error] or []), *n.tail])
            run_id = self.trial_ids[n.index] if self.trial_ids and n.index < len(self.trial_ids) else self.run_id
            self.client.log_text(run_id, text + "\n", f"errors/attempt{attempt}_{n.job_name}_{n.task_index}.txt")
            if self.trial_ids and run_id != self.run_id:
                self._set_tags(run_id, {"tfos_nb.error": (n.error or "failed")[:5000]})

    def _log_model(self) -> None:
        """``args["export_dir"]``, a SavedModel the notebook's machine can read, as an MLflow model under ``model/``."""
        src = self.export_dir
        if not src or not os.path.isfile(os.path.join(src, "saved_model.pb")):
            return
        from mlflow.models import Model

        model = Model(run_id=self.run_id, artifact_path="model")
        model.add_flavor("tensorflow", saved_model_dir="tf2model", model_type="tf2-module", code=None)
        self._upload(src, "model", "tf2model", lambda root: model.save(os.path.join(root, "MLmodel")))

    def _log_tensorboard(self) -> None:
        if self.log_dir and os.path.isdir(self.log_dir) and os.listdir(self.log_dir):
            self._upload(self.log_dir, "tensorboard")

    def _upload(self, src: str, artifact_path: str, under: str = "", add: Callable[[str], None] | None = None) -> None:
        """The regular files under ``src`` as the run's ``artifact_path`` (in its folder ``under``; ``add(root)`` adds
        more): a copy that follows no link out of the folder; one warning names what it left out."""
        with tempfile.TemporaryDirectory(prefix="tfos_nb-mlflow-") as tmp:
            root = os.path.join(tmp, artifact_path)
            if under:
                os.mkdir(root)
            if skipped := private.copy_plain_tree(src, os.path.join(root, under) if under else root):
                more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
                log.warning("tfos_nb: not uploaded to MLflow from %s (only regular files are: a symlink or a file "
                            "with other names could lead outside the folder): %s%s", src, ", ".join(skipped[:10]), more)
            if add is not None:
                add(root)
            self.client.log_artifacts(self.run_id, root, artifact_path)

    # -- MLflow calls -----------------------------------------------------------------------
    @staticmethod
    def _metric(key: str, value: Any, t: float | None, step: int) -> Any:
        number = _number(value)
        if number is None or key in ("step",):
            return None
        from mlflow.entities import Metric

        stamp = int((t if isinstance(t, (int, float)) and math.isfinite(t) else time.time()) * 1000)
        return Metric(_key(key), number, stamp, int(step))

    def _log_metrics(self, run_id: str, metrics: list[Any]) -> None:
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i:i + _BATCH])

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(_key(k), v) for k, v in params.items()]
        try:
            for i in range(0, len(items), 100):
                self.client.log_batch(run_id, params=items[i:i + 100])
        except Exception:  # noqa: BLE001 - the caller's run holds a param of that name already: keep its value
            for p in items:
                try:
                    self.client.log_param(run_id, p.key, p.value)
                except Exception:  # noqa: BLE001
                    pass

    def _set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def _terminate(self, run_id: str, status: str | None) -> None:
        try:
            if status is None:  # a trial: its own state
                run = self.client.get_run(run_id)
                outcome = run.data.tags.get("tfos_nb.outcome")
                statuses: dict[str, str] = {cluster_state.FINISHED: "FINISHED", cluster_state.FAILED: "FAILED"}
                status = statuses.get(outcome or "", "KILLED")
            self.client.set_terminated(run_id, status)
        except Exception as exc:  # noqa: BLE001
            log.warning("tfos_nb: could not end MLflow run %s: %s", run_id, net.scrub_credentials(str(exc)))
