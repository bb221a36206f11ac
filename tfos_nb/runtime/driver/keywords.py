"""The keyword arguments of ``TFCluster.run`` and :func:`.retry.run_job`, typed, and the one place they become a
job's groups (:mod:`.options`).

TensorFlowOnSpark's callers say everything in keywords: ``run_job(sc, fn, args, 4, num_ps=1, retries=2, data=df,
heartbeat_timeout=20)``.  Each keyword has its type here, a ``TypedDict`` per group (``**given:
Unpack[JobKeywords]``), so that a type checker sees a misspelt or mistyped one; :func:`job_groups` sorts them into
the groups (the cluster's shape, how it starts, the options, the training, the retry policy), each of which checks
its own values.  A name no group has is a ``TypeError`` naming the closest, before anything starts.  Each
``TypedDict`` mirrors its group's fields (``tests/test_options.py`` holds them equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from .cluster import InputMode
from .options import ClusterShape, JobOptions, RetryPolicy, StartOptions, Training, fields_of, refuse_unknown

__all__ = ["ClusterKeywords", "JobGroups", "JobKeywords", "OptionKeywords", "RunsKeywords", "job_groups"]


class OptionKeywords(TypedDict, total=False):
    """:class:`~.options.JobOptions`' fields, as keywords."""

    name: str | None
    env: Mapping[str, str] | None  # None: none, as TensorFlowOnSpark's callers (TFEstimator's unset env) pass it
    num_gpus: int | None
    keras: str
    heartbeat_timeout: float
    notebook_timeout: float
    node_output: bool | None
    stall_after: float | None
    seed: int | None
    deterministic: bool
    preflight: bool | Mapping[str, Any]
    resources: Any
    mlflow: Any
    log_callback: Callable[[str, list[str]], None] | None
    on_state: Callable[[Any], None] | None
    on_start: Callable[[Any], None] | None


class RunsKeywords(OptionKeywords, total=False):
    """Parallel runs' keywords (``TFParallel.run``, :func:`.parallel.runs.start`): how the runs are told apart and
    ranked, then :class:`~.options.JobOptions`' fields."""

    per_run: bool
    params: Sequence[Mapping[str, Any]] | None
    metric: str | None
    mode: str | None
    options: JobOptions | None


class ShapeKeywords(TypedDict, total=False):
    """TensorFlowOnSpark's keywords that shape a cluster of ``num_executors`` nodes
    (:meth:`~.options.ClusterShape.of_tfos`)."""

    num_ps: int
    master_node: str | None
    eval_node: bool


class StartKeywords(TypedDict, total=False):
    """:class:`~.options.StartOptions`' fields, as keywords."""

    tensorboard: bool
    input_mode: int
    log_dir: str | None
    driver_ps_nodes: bool
    reservation_timeout: float
    release_port: bool


class TrainingKeywords(TypedDict, total=False):
    """:class:`~.options.Training`'s fields, as keywords."""

    data: Any
    num_epochs: int
    feed_timeout: float
    batch_rows: int
    validation: Any
    grace_secs: float
    shutdown_timeout: float


class PolicyKeywords(TypedDict, total=False):
    """:class:`~.options.RetryPolicy`'s fields, as keywords."""

    retries: int
    backup_dir: str | None
    min_workers: int | None
    shrink_after: float


class ClusterKeywords(OptionKeywords, ShapeKeywords, StartKeywords, total=False):
    """What ``TFCluster.run`` takes as keywords (TensorFlowOnSpark's ``queues`` aside, which it ignores)."""


class JobKeywords(ClusterKeywords, TrainingKeywords, PolicyKeywords, total=False):
    """What :func:`.retry.run_job` takes as keywords."""


@dataclasses.dataclass(frozen=True)
class JobGroups:
    """A job's groups, built from keywords by :func:`job_groups`."""

    shape: ClusterShape
    launch: StartOptions
    options: JobOptions
    training: Training
    policy: RetryPolicy


def job_groups(num_executors: int, options: JobOptions | None, given: Mapping[str, Any],
               accepted: type = JobKeywords) -> JobGroups:
    """The groups of a job of ``num_executors`` nodes with the keywords ``given`` (those ``accepted`` declares:
    ``JobKeywords`` for ``run_job``, ``ClusterKeywords`` for ``TFCluster.run``), over ``options`` for
    :class:`~.options.JobOptions`' fields.  With ``data`` the driver feeds the nodes: ``input_mode`` is
    ``InputMode.SPARK`` unless given.  A ``TypeError`` for an unknown keyword, a ``ValueError`` (an
    :class:`~..option_error.OptionError` where it names an option) for a bad value or a policy the options cannot
    keep."""
    refuse_unknown(given, accepted.__optional_keys__)  # type: ignore[attr-defined]  # every TypedDict has them

    def picked(group: type) -> dict[str, Any]:
        return {k: given[k] for k in fields_of(group) if k in given}

    launch = picked(StartOptions)
    if given.get("data") is not None:
        launch.setdefault("input_mode", InputMode.SPARK)
    shape = ClusterShape.of_tfos(num_executors, given.get("num_ps", 0), given.get("master_node"),
                                 given.get("eval_node", False))
    groups = JobGroups(shape, StartOptions(**launch), JobOptions.of(options, **picked(JobOptions)),
                       Training(**picked(Training)), RetryPolicy(**picked(RetryPolicy)))
    groups.policy.check(groups.options)
    return groups
