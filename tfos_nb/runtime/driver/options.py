"""A job's settings and shape, each declared once: :class:`JobOptions`, :class:`ClusterShape`, :class:`RetryPolicy`,
:class:`StartOptions` and :class:`Training`.

``TFCluster.run``, ``TFParallel.run``, :func:`.retry.run_job` and the cell magics build
them (from keyword arguments, cell options and ``%config``; :mod:`.keywords` turns the keyword arguments into them)
and pass them down whole: adding an option touches its field here, its keyword's type in :mod:`.keywords`, the place
that uses it, and the docs.  A bad value is an :class:`~..option_error.OptionError` (a ValueError) naming the
option, which the magics say in their flags' words.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from .. import determinism
from ..option_error import Named, OptionError
from .control.stalls import DEFAULT_STALL_AFTER, check_stall_after
from .launch.resources import Resources

__all__ = ["ClusterShape", "JobOptions", "RetryPolicy", "StartOptions", "Training"]

#: how long a retry waits for the task slots of a failed attempt to come back before it shrinks (``min_workers``)
SHRINK_AFTER_S = 60.0


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """The keyword options of a cluster (``TFCluster.run``) or of parallel runs (``TFParallel.run``).

    Given as keyword arguments (``TFCluster.run(sc, fn, args, 2, heartbeat_timeout=20)``) or whole
    (``options=JobOptions(...)``, with keywords overriding its fields); an unknown name is a ``TypeError``
    naming the closest option.
    """

    name: str | None = None
    """the job's name (the panel, the Spark UI's job group, MLflow's run name); default ``tfos-<id>``"""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """environment variables of every node (e.g. TensorFlow's thread counts)"""
    num_gpus: int | None = None
    """GPUs per node; default: ``tf_args.num_gpus`` or 1 for a cluster, 1 for a parallel run"""
    keras: str = "tf_keras"
    """``"tf_keras"`` (``TF_USE_LEGACY_KERAS=1`` on the nodes: ``tf.keras`` is Keras 2) or ``"keras3"``"""
    heartbeat_timeout: float = 10.0
    """seconds without a node's heartbeat before it counts as lost (and a node without the driver's, as orphaned)"""
    notebook_timeout: float = 120.0
    """Spark Connect only: the in-cluster coordinator stops the job when the notebook was not heard of this long"""
    node_output: bool | None = None
    """write every node's output to stderr as ``[role:index] line``; None: on outside a notebook kernel
    (``TFOS_NB_NODE_OUTPUT=0``/``1`` decides instead when set)
    """
    stall_after: float | None = DEFAULT_STALL_AFTER
    """a chief/worker that has not moved for this many seconds is flagged as stalled (None or 0: never)"""
    seed: int | None = None
    """every node seeds Python, NumPy, TensorFlow and Keras with it before its function runs"""
    deterministic: bool = False
    """op determinism on the nodes and a fixed feed (partition ``p`` to the ``p mod n``-th chief/worker)"""
    preflight: bool | Mapping[str, Any] = False
    """run the doctor for these nodes first and raise its FAILs (a dict: the doctor's options)"""
    resources: Any = None
    """Spark resources per role, e.g. ``{"ps": {"cpus": 1}, "worker": {"cpus": 1, "gpus": 1}}`` (``*``: every
    role); each group of nodes asking the same starts in a stage of its own ResourceProfile; None: one stage"""
    mlflow: Any = None
    """MLflow tracking: True, an experiment name, a dict, a running job's run; None: inside an active run only"""
    log_callback: Callable[[str, list[str]], None] | None = None
    """``log_callback(label, lines)``: every node's output lines as they arrive"""
    on_state: Callable[[Any], None] | None = None
    """``on_state(state)``: the job's live state, once it exists"""
    on_start: Callable[[Any], None] | None = None
    """``on_start(job)``: the start in progress, before anything launches (``job.cancel(reason)`` stops it)"""

    def __post_init__(self) -> None:
        determinism.node_env(self.deterministic, self.seed)  # checks both
        _check(self.keras in ("tf_keras", "keras3"), Named("keras"), f" must be 'tf_keras' or 'keras3', got {self.keras!r}")
        _check(_number(self.heartbeat_timeout) and self.heartbeat_timeout > 0, Named("heartbeat_timeout"),
               f" must be a positive number of seconds, got {self.heartbeat_timeout!r}")
        _check(_number(self.notebook_timeout) and self.notebook_timeout > 0, Named("notebook_timeout"),
               f" must be a positive number of seconds, got {self.notebook_timeout!r}")
        object.__setattr__(self, "stall_after", check_stall_after(self.stall_after))
        _check(self.num_gpus is None or (_integer(self.num_gpus) and self.num_gpus >= 0), Named("num_gpus"),
               f" must be a non-negative integer, got {self.num_gpus!r}")
        env = {} if self.env is None else self.env  # None: none, as TensorFlowOnSpark's callers pass it
        _check(isinstance(env, Mapping), Named("env"), f" must be a mapping of names to values, got {env!r}")
        object.__setattr__(self, "env", {str(k): str(v) for k, v in env.items()})
        object.__setattr__(self, "resources", Resources.of(self.resources))

    @classmethod
    def of(cls, options: JobOptions | None = None, /, **given: Any) -> JobOptions:
        """``options`` (or the defaults) with the keyword options ``given`` over it."""
        refuse_unknown(given, fields_of(cls))
        base = options if options is not None else cls()
        if not isinstance(base, cls):
            msg = f"options must be a JobOptions, got {type(base).__name__}"
            raise TypeError(msg)
        return dataclasses.replace(base, **given) if given else base

    def replace(self, **changes: Any) -> JobOptions:
        return dataclasses.replace(self, **changes)

    def with_env(self, extra: Mapping[str, str]) -> JobOptions:
        """These options, ``extra`` added to the nodes' environment."""
        return dataclasses.replace(self, env={**self.env, **extra}) if extra else self

    def node_env(self) -> dict[str, str]:
        """Every node's environment: ``env`` and what ``seed``/``deterministic`` tell the nodes."""
        return {**self.env, **determinism.node_env(self.deterministic, self.seed)}

    def refuse(self, what: str, *names: str) -> None:
        """A ``ValueError`` when one of ``names`` is set to other than its default: it does not apply to ``what``."""
        defaults = JobOptions()
        for name in names:
            if getattr(self, name) != getattr(defaults, name):
                msg = f"{name}= does not apply to {what}"
                raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """A cluster's roles and counts: ``ps`` parameter servers, ``trainers`` chief/worker nodes (the first one
    named ``chief``, TensorFlowOnSpark's ``master_node``, when given), and an ``evaluator`` or not."""

    trainers: int
    ps: int = 0
    evaluator: bool = False
    chief: str | None = None  # None: every trainer is a "worker"; "chief" or "master": the first one's role

    def __post_init__(self) -> None:
        for named, value, least in ((Named("trainers", "chief/worker nodes"), self.trainers, 1),
                                    (Named("ps", "num_ps"), self.ps, 0)):
            _check(_integer(value) and value >= least, named, f" must be an integer of at least {least}, got {value!r}")
        _check(self.chief in (None, "chief", "master"), Named("chief", "master_node"),
               f" must be None, 'chief' or 'master', got {self.chief!r}")

    @classmethod
    def of_tfos(cls, num_executors: int, num_ps: int = 0, master_node: str | None = None,
                eval_node: bool = False) -> ClusterShape:
        """TensorFlowOnSpark's way of saying it: nodes in all, of which ``num_ps`` ps and one evaluator."""
        for label, value in (("num_executors", num_executors), ("num_ps", num_ps)):
            _check(_integer(value) and value >= 0, Named(label), f" must be a non-negative integer, got {value!r}")
        trainers = num_executors - num_ps - (1 if eval_node else 0)
        _check(trainers >= 1, f"num_executors={num_executors} leaves no chief/worker node "
                              f"(num_ps={num_ps}, eval_node={eval_node})")
        return cls(trainers, num_ps, bool(eval_node), master_node)

    @property
    def num_nodes(self) -> int:
        return self.ps + self.trainers + (1 if self.evaluator else 0)

    def roles(self) -> list[tuple[str, int]]:
        """Every node's ``(role, index)``, in order ps → chief → workers → evaluator."""
        roles = [("ps", i) for i in range(self.ps)]
        if self.chief:
            roles.append((self.chief, 0))
        roles += [("worker", i) for i in range(self.trainers - (1 if self.chief else 0))]
        if self.evaluator:
            roles.append(("evaluator", 0))
        return roles

    def with_trainers(self, trainers: int) -> ClusterShape:
        return dataclasses.replace(self, trainers=trainers)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """What a job does when a node fails: start again up to ``retries`` more times, each attempt resuming from
    the last backup (kept under ``backup_dir``, default ``$TFOS_NB_BACKUP_ROOT`` or the temporary directory), on
    fewer chief/worker nodes (not fewer than ``min_workers``) when the lost task slots did not come back within
    ``shrink_after`` seconds."""

    retries: int = 0
    backup_dir: str | None = None
    min_workers: int | None = None
    shrink_after: float = SHRINK_AFTER_S

    def __post_init__(self) -> None:
        _check(_integer(self.retries) and self.retries >= 0, Named("retries"),
               f" must be a non-negative integer, got {self.retries!r}")
        _check(self.min_workers is None or (_integer(self.min_workers) and self.min_workers >= 1),
               Named("min_workers"), f" must be a positive integer (chief and workers), got {self.min_workers!r}")
        _check(_number(self.shrink_after) and self.shrink_after >= 0, Named("shrink_after"),
               f" must be a non-negative number of seconds, got {self.shrink_after!r}")

    def check(self, options: JobOptions) -> None:
        """Refuse a policy the options cannot keep."""
        if options.deterministic and self.min_workers is not None:
            raise OptionError(Named("min_workers", value=self.min_workers, shown=True), " cannot go with ",
                              Named("deterministic", value=True, shown=True), ": a retry on fewer nodes would put "
                              "other rows together in each step, so the job could not end with a clean run's weights")


@dataclasses.dataclass(frozen=True)
class StartOptions:
    """How a cluster starts, TensorFlowOnSpark's keywords of ``TFCluster.run`` beside its shape: TensorBoard on the
    chief (``tensorboard``, ``log_dir``), whether the driver feeds the nodes (``input_mode``: ``InputMode.SPARK``,
    1, or ``InputMode.TENSORFLOW``, 0), the ps nodes on the driver (``driver_ps_nodes``), how long the nodes may
    take to come up (``reservation_timeout``), and whether a node frees its port before its function runs
    (``release_port``)."""

    tensorboard: bool = False
    input_mode: int = 0  # InputMode.TENSORFLOW (driver/cluster.py, which this module does not import)
    log_dir: str | None = None
    driver_ps_nodes: bool = False
    reservation_timeout: float = 600
    release_port: bool = True


@dataclasses.dataclass(frozen=True)
class Training:
    """What every attempt of :func:`.retry.run_job` does once its nodes run: feed ``data`` (an RDD or DataFrame;
    None: the nodes read their own) for ``num_epochs`` epochs (``feed_timeout``, ``batch_rows``, ``validation`` fed
    once as the named set "validation"; see ``TFCluster.train``), then ``shutdown(grace_secs, shutdown_timeout)``."""

    data: Any = None
    num_epochs: int = 1
    feed_timeout: float = 600
    batch_rows: int = 1024
    validation: Any = None
    grace_secs: float = 0
    shutdown_timeout: float = 259200


def fields_of(group: type) -> list[str]:
    """The field names of the dataclass ``group``, in order: the keywords that build it."""
    return [f.name for f in dataclasses.fields(group)]


def refuse_unknown(given: Iterable[str], names: Collection[str]) -> None:
    """A ``TypeError`` for the first of ``given`` that is not one of ``names``, naming the closest one (or all)."""
    for key in given:
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; the options: {', '.join(sorted(names))}"
            msg = f"unknown option {key!r}{hint}"
            raise TypeError(msg)


def _check(ok: bool, *parts: str | Named) -> None:
    if not ok:
        raise OptionError(*parts)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
