"""Experiment tracking: one MLflow run per job, logged from the notebook's side.

**When.**  A job is tracked when it is asked for — ``mlflow=True`` or an experiment name
(``TFCluster.run``, ``TFCluster.run_job``, ``TFParallel.run``/``start``, ``TFEstimator(mlflow=…)``),
``%%tfos_cluster``/``%%tfos_parallel --mlflow [EXPERIMENT]``, ``%config TFOSMagics.mlflow`` — or
when an MLflow run is active on the calling thread (``with mlflow.start_run():`` around the cell
or the call: the job logs *into* that run); ``mlflow=False`` turns it off even then.
``MLFLOW_TRACKING_URI``/``MLFLOW_EXPERIMENT_NAME`` (or ``mlflow.set_tracking_uri``/``set_experiment``)
say *where*, as for any MLflow code; they do not turn tracking on.  So Databricks users, whose
notebooks have a tracking URI and MLflow autologging switched on, get a run when they ask for one
or open one: Databricks' autologging sees only training in the notebook's own process (never
on executors), and logging every cell that merely tries something out would fill their
experiments with runs they did not ask for.

**Where from.**  Everything is logged by the notebook (the driver), from what it already
receives from every node — the metric history, the final state, the failing node's output —
so no node needs to reach the tracking server, and a Spark Connect session is tracked the
same way as a classic one (through its mirror of the cluster's state).

**What.**  Params: the job's ``args`` (flattened, ``a.b`` for nested dicts), its shape
(``tfos_nb.workers``, ``.ps``, ``.evaluator``, ``.input_mode``, ``.num_epochs``, ``.batch_rows``,
``.retries``, ``.seed``, ``.deterministic``: prefixed, so that autologging's own params, e.g. Keras ``fit``'s ``workers``, never
clash) and the versions of tfos_nb, TensorFlow, Keras and Spark (``tensorflow_version``…).
Metrics: every report of the chief (worker 0 without a chief) with its step
(``all_nodes=True``: every other node's too, under ``<role>_<index>/``), and each node's last
steps/s as ``system/steps_per_sec/<role>_<index>``.  Tags ``tfos_nb.*``: kind, name,
outcome, attempts, failures, error.  Artifacts: the SavedModel in ``args["export_dir"]`` (an
MLflow model of the ``tensorflow`` flavour under ``model/``: ``mlflow.tensorflow.load_model(
"runs:/<id>/model")``), the TensorBoard log directory (``log_dir=``, ``--logdir``) under
``tensorboard/`` (both when the notebook's machine can read them; regular files only: a symlink or a
file with other names is left out, and one warning names it), and each failed node's output tail under
``errors/``.  The panel's link to the run never carries the tracking URI's ``user:password@``.
The run ends FINISHED, FAILED or KILLED (stopped: ■, ``%tfos_shutdown``, a timeout) with the
job; a run the caller opened is left for the caller's ``with`` block to end.

**Retries are one run.**  ``run_job(retries=…)``/``--retries`` log every attempt into the one
run (tags ``tfos_nb.attempts`` and ``tfos_nb.failures``; error tails per attempt), not into
nested runs: a retry resumes the same training from its checkpoints, so its curve continues the
first attempt's, and the chief's own MLflow calls keep one run id across attempts.

**Sweeps.**  ``%%tfos_parallel``/``TFParallel``: a parent run and one child run per trial
(``mlflow.parentRunId``), the trial's grid entry as params, its reports as metrics, the
scalars it returned as metrics at its last step.

**Nodes that call MLflow themselves.**  Every node gets the run's id as ``ctx.mlflow_run_id``
(a sweep's trial: its child run's).  The chief (each trial of a sweep) also gets
``MLFLOW_RUN_ID`` and ``MLFLOW_TRACKING_URI``, so ``mlflow.start_run()`` and autologging there
log into the job's run; the URI, which may carry credentials, reaches no other node's environment.
On every other node MLflow's ``autolog`` functions (``mlflow.autolog``, ``mlflow.<flavour>.autolog``)
do nothing (see :mod:`tfos_nb.runtime.executor.tracking.node`): a Keras job with
``mlflow.tensorflow.autolog()`` in its function stays one run, not one per worker.  What other
nodes log by hand is their own business: log from ``ctx.is_chief``.

MLflow is optional (``pip install 'tfos_nb[mlflow]'``); asking for tracking without it raises
``ImportError`` naming that extra.  Nothing here imports IPython.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..control import state
from .run import EXTRA, RUN_ID_ENV, JobRun, Request, flat_params, import_mlflow, versions

__all__ = ["EXTRA", "RUN_ID_ENV", "JobRun", "Request", "import_mlflow", "job_run", "request", "resolve", "tracked_start"]

_R = TypeVar("_R")
_OPTIONS = ("experiment", "all_nodes", "run_name")


def _active_run() -> Any:
    """The MLflow run active on this thread (MLflow's run stack is per thread); None when mlflow is not imported."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or not hasattr(mlflow, "active_run"):
        return None
    return mlflow.active_run()


def request(setting: Any) -> Request | JobRun | None:
    """What ``mlflow=`` asks for: None (off), a :class:`Request`, or the caller's :class:`JobRun` as it is.

    ``None``: track when an MLflow run is active on this thread; ``False``: never; ``True``:
    MLflow's current experiment; a string: that experiment (created when missing); a dict of
    ``experiment``, ``all_nodes``, ``run_name``.
    """
    if isinstance(setting, JobRun):
        return setting
    if setting is False:
        return None
    if setting is None or setting == "":
        if _active_run() is None:
            return None
        options: dict[str, Any] = {}
    elif setting is True:
        options = {}
    elif isinstance(setting, str):
        options = {"experiment": setting}
    elif isinstance(setting, Mapping):
        options = dict(setting)
        unknown = [k for k in options if k not in _OPTIONS]
        if unknown:
            msg = f"mlflow options are {', '.join(_OPTIONS)}; got {unknown[0]!r}"
            raise ValueError(msg)
    else:
        msg = f"mlflow must be True, False, None, an experiment name or a dict, got {type(setting).__name__}"
        raise TypeError(msg)
    mlflow = import_mlflow()
    active = _active_run()
    uri = mlflow.get_tracking_uri()
    client = mlflow.MlflowClient(uri)
    experiment = options.get("experiment")
    if experiment:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
    elif active is not None:
        experiment_id = active.info.experiment_id
    else:
        from mlflow.tracking.fluent import _get_experiment_id  # how mlflow.start_run() picks it

        experiment_id = _get_experiment_id() or "0"
    return Request(tracking_uri=uri, experiment_id=str(experiment_id),
                   parent_run_id=active.info.run_id if active is not None else None,
                   all_nodes=bool(options.get("all_nodes", False)), run_name=options.get("run_name"))


# -- the starts' hook ---------------------------------------------------------------------------
def _get(args: Any, key: str) -> Any:
    try:
        if isinstance(args, Mapping) or hasattr(args, "keys"):
            return args[key] if key in args else None  # noqa: SIM401 - a keys() object need not have get()
        return getattr(args, key, None)
    except (KeyError, TypeError):
        return None


def _cluster_params(a: Mapping[str, Any]) -> dict[str, Any]:
    from ..cluster import InputMode

    # tfos_nb's own under "tfos_nb.": a name of the user's (args) or of autologging (Keras' fit has `workers`)
    # logged with another value would make MLflow refuse the whole batch
    shape = a["shape"]  # a ClusterShape
    return {**flat_params(a["tf_args"]), **versions(a["sc"]),
            "tfos_nb.workers": shape.trainers, "tfos_nb.ps": shape.ps, "tfos_nb.evaluator": shape.evaluator,
            "tfos_nb.input_mode": "spark" if a.get("input_mode") == InputMode.SPARK else "tensorflow"}


def _trials(a: Mapping[str, Any]) -> list[Any]:
    """Each trial's arguments (its grid entry merged over the common ones), as its child run's params."""
    tf_args, n = a["tf_args"], a.get("num_executors")
    if a.get("per_run") or (isinstance(tf_args, list) and tf_args and all(isinstance(x, Mapping) for x in tf_args)):
        return list(tf_args)
    if a.get("params") is not None:
        return [dict(p) for p in a["params"]]
    return [tf_args] * int(n or 1)


def job_run(wanted: Request | JobRun, kind: str, a: Mapping[str, Any]) -> tuple[JobRun, bool]:
    """``(run, owned)`` for a start's arguments ``a`` (``sc``, ``tf_args``, a cluster's ``shape`` or parallel runs'
    ``num_executors``, ``name``…)."""
    if isinstance(wanted, JobRun):
        return wanted, False
    name = a.get("name") or f"tfos_nb {kind}"
    if kind == "parallel":
        return JobRun(wanted, name, kind, {**versions(a["sc"])}, trials=_trials(a)), True
    params = _cluster_params(a)
    for key in ("num_epochs", "batch_rows", "retries", "seed", "deterministic", "resources"):
        if a.get(key) is not None and a.get(key) is not False:
            params[f"tfos_nb.{key}"] = a[key]
    run = JobRun(wanted, name, kind, params)
    run.export_dir = _get(a["tf_args"], "export_dir")
    run.log_dir = a.get("log_dir")
    return run, True


def option_facts(options: Any) -> dict[str, Any]:
    """What a run's parameters take from a job's options (``JobOptions``): its name, seed, deterministic mode and
    resources per role (as the magic spells them)."""
    resources = options.resources.text() if options.resources is not None else None
    return {"name": options.name, "seed": options.seed, "deterministic": options.deterministic,
            "resources": resources}


def resolve(setting: Any, kind: str, facts: Mapping[str, Any]) -> tuple[JobRun | None, bool]:
    """A job's one MLflow run, started now on the caller's thread (where ``with mlflow.start_run():`` is active)
    as ``setting`` asks (``mlflow=``, ``--mlflow``), and whether the job ends it; ``(None, False)`` untracked."""
    wanted = request(setting)
    if wanted is None:
        return None, False
    return job_run(wanted, kind, facts)


def tracked_start(kind: str, facts: Mapping[str, Any], options: Any, start: Callable[[Any], _R]) -> _R:
    """Start a job (``start(options)``: a cluster or parallel runs) tracked as ``options.mlflow`` asks.

    The hook into the one job lifecycle: the run starts here (on the caller's thread), the nodes
    get its id through ``env``, and the job is attached through ``on_start`` as it is announced
    (before anything launches; classic and Spark Connect alike).  A run started here ends with
    the job; a :class:`JobRun` passed in (a retrying owner's) is only attached.  ``facts``: what the
    run's parameters are made of (``sc``, ``tf_args``, a cluster's ``shape``…; :func:`option_facts` are added).
    """
    run, owned = resolve(options.mlflow, kind, {**facts, **option_facts(options)})
    if run is None:
        return start(options)
    user_on_start = options.on_start

    def on_start(job: Any) -> None:
        run.attach(job, finish_with_job=owned)
        if user_on_start is not None:
            user_on_start(job)

    before = run.attempts
    try:
        out = start(options.with_env(run.node_env()).replace(on_start=on_start, mlflow=False))
    except BaseException as exc:
        if owned and run.attempts == before:  # failed before there was a job to end the run with
            run.finish(state.C_FAILED, error=exc)
        raise
    if hasattr(out, "tracking"):
        out.tracking = run
    return out
