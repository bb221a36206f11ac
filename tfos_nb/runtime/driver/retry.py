"""Start → train → shut down in one call, starting the whole cluster again when a node fails.

TensorFlow's multi-worker training cannot take a replacement worker into a
running cluster: a lost worker leaves the others blocked in collectives.  So the
unit of recovery is the whole run.  With ``retries=N``, a node failure
(:class:`~tfos_nb.runtime.driver.cluster.TFClusterError`: a node raised, was killed,
lost its executor or its heartbeats) tears the cluster down and starts it
again, up to N more times; nodes read the attempt number as ``ctx.attempt``.

The next attempt resumes from the last backup, with no code of the user's: ``ctx.progress_callback()`` keeps
one for Keras in the job's backup folder (``ctx.checkpoint_dir``, :mod:`..recovery`), and a fed job's resumed
epoch holds only the rows that backup had not trained on (:class:`Recovery`).  A program with its own
checkpoints (Keras ``BackupAndRestore``, a ``tf.train.CheckpointManager`` in ``ctx.checkpoint_dir``) resumes
from those, and is fed every epoch again.

Not retried: errors that would fail the same way again (bad arguments, not
enough executors, a reservation timeout) and ``KeyboardInterrupt``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..recovery.folder import JobBackups
from . import state as S
from .cluster import InputMode, TFCluster
from .errors import TFClusterError
from .start import run

T = TypeVar("T")

#: how long a retry waits for the task slots of a failed attempt to come back before it shrinks (``min_workers``)
SHRINK_AFTER_S = 60.0


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a :func:`run_job` ended: the last attempt's final status and the failures before it."""

    status: S.ClusterView
    attempts: int
    failures: tuple[str, ...]  # one line per failed attempt, oldest first
    seconds: float
    resumed: tuple[str, ...] = ()  # where each retry resumed from, oldest first


class Recovery:
    """What each attempt of one job with retries restores and feeds; the owner of the job's backup folder.

    ``env(attempt)`` plans the attempt from the backups so far (the newest one training can resume from
    exactly) and gives its nodes' environment; ``feed(num_epochs)`` is then what it feeds: the epochs from the
    resumed one on, and the rows of that epoch its backup had not trained on.
    """

    def __init__(self, sc: Any, retries: int, backup_dir: str | None = None, min_workers: int | None = None,
                 shrink_after: float = SHRINK_AFTER_S) -> None:
        from .slots import session_master

        master = session_master(sc)
        self.backups = JobBackups.open(master, backup_dir) if retries else None
        if min_workers is not None and (not isinstance(min_workers, int) or isinstance(min_workers, bool)
                                        or min_workers < 1):
            msg = f"min_workers must be a positive integer (chief and workers), got {min_workers!r}"
            raise ValueError(msg)
        self.sc, self.min_workers, self.shrink_after = sc, min_workers, float(shrink_after)
        self.shrunk = ""  # "on 1 of 2 training nodes", while the running attempt runs on fewer

    def nodes(self, attempt: int, num_nodes: int, trainers: int) -> int:
        """How many nodes attempt ``attempt`` starts: all ``num_nodes``, unless the job may shrink
        (``min_workers``) and the slots lost with the failed attempt did not come back within
        ``shrink_after`` s — then as many fewer chief/worker nodes as slots are missing, down to ``min_workers``."""
        self.shrunk = ""
        if attempt == 1 or self.min_workers is None or not hasattr(self.sc, "_jsc"):
            return num_nodes
        from .slots import settled_slots

        slots, _ = settled_slots(self.sc, num_nodes, self.shrink_after)
        missing = num_nodes - slots
        if missing <= 0 or trainers - missing < self.min_workers:
            return num_nodes  # all came back, or too few would: the start waits for them, and fails naming them
        self.shrunk = (f"on {trainers - missing} of {trainers} training nodes ({missing} task slot(s) did not "
                       f"come back within {self.shrink_after:g} s)")
        return num_nodes - missing

    def env(self, attempt: int) -> dict[str, str]:
        return dict(self.backups.attempt(attempt)) if self.backups is not None else {}

    def epochs(self, num_epochs: int) -> int:
        """Epochs the running attempt feeds of a job's ``num_epochs`` (0: TensorFlowOnSpark's 10, as ``train``)."""
        if self.backups is None:
            return num_epochs
        from .cluster import DEFAULT_EPOCHS

        return self.backups.resume.epochs_to_feed(num_epochs or DEFAULT_EPOCHS)

    @property
    def skip_rows(self) -> Any:
        return self.backups.resume.skip if self.backups is not None else None

    def describe(self) -> str:
        """Where the running attempt resumed from: ``"from the backup at epoch 2, step 14 (global step 74); …"``,
        and on how many nodes when fewer."""
        said = self.backups.describe() if self.backups is not None else "from the first step (no backup folder)"
        return f"{said}, {self.shrunk}" if self.shrunk else said

    def close(self) -> None:
        if self.backups is not None:
            self.backups.close()


def run_once(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    *,
    data: Any = None,
    num_epochs: int = 1,
    feed_timeout: float = 600,
    shutdown_timeout: float = 259200,
    grace_secs: float = 0,
    batch_rows: int = 1024,
    validation: Any = None,
    skip_rows: Any = None,
    **run_kwargs: Any,
) -> TFCluster:
    """One start → train (``data``, when given; ``validation``: its validation set, fed once; ``skip_rows``: rows of
    the first epoch not fed, see ``TFCluster.train``) → shutdown; the cluster is closed whatever happens.

    Returns the shut-down cluster (its ``status()`` is the final view); raises what start,
    train or shutdown raised.
    """
    cluster = run(sc, map_fun, tf_args, num_executors, **run_kwargs)
    try:
        if data is not None:
            cluster.train(data, num_epochs, feed_timeout=feed_timeout, batch_rows=batch_rows, validation=validation,
                          skip_rows=skip_rows)
        cluster.shutdown(grace_secs=grace_secs, timeout=shutdown_timeout)
        return cluster
    finally:
        cluster.close()


def run_job(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    *,
    retries: int = 0,
    on_retry: Callable[[int, TFClusterError], None] | None = None,
    backup_dir: str | None = None,
    min_workers: int | None = None,
    shrink_after: float = SHRINK_AFTER_S,
    **kwargs: Any,
) -> RunOutcome:
    """Run ``map_fun`` on a cluster of ``num_executors`` nodes to the end, retrying node failures.

    Each attempt is one :func:`run_once`: ``data`` (an RDD or DataFrame) is fed for
    ``num_epochs`` epochs with ``InputMode.SPARK`` (``feed_timeout``, ``batch_rows``);
    without it the nodes read their own data; then ``shutdown(grace_secs, shutdown_timeout)``.
    Other keyword arguments go to :func:`~tfos_nb.runtime.driver.start.run`; ``mlflow=`` (as
    there) tracks the whole job as one MLflow run: every attempt logs into it (tags
    ``tfos_nb.attempts``, ``tfos_nb.failures``), not into nested runs — a retry resumes the same
    training from its checkpoints.  ``on_retry(attempt,
    error)`` is called before attempt ``attempt`` (2, 3, …) starts.  Raises the last
    attempt's error when every attempt failed.

    With retries, each attempt resumes from the last backup (:class:`Recovery`): in a folder under
    ``backup_dir`` (or ``$TFOS_NB_BACKUP_ROOT``; on a local master, the temporary directory), which
    every node must reach, removed when the job ends.  ``min_workers`` lets a retry start on fewer
    chief/worker nodes (not fewer than it) when the failed attempt's task slots did not come back within
    ``shrink_after`` seconds: the global batch stays (``as_dataset``'s batch is the global one under
    ``MultiWorkerMirroredStrategy``), each replica's grows, and every row is still trained once.
    With ``deterministic=True`` (and ``seed``, see :func:`~tfos_nb.runtime.driver.start.run`) a job that
    lost an executor ends with the weights of a clean run; it cannot shrink.
    """
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        msg = f"retries must be a non-negative integer, got {retries!r}"
        raise ValueError(msg)
    if kwargs.get("data") is not None:
        kwargs.setdefault("input_mode", InputMode.SPARK)
    tracking, owned = _tracking(kwargs.pop("mlflow", None), sc, tf_args, num_executors, retries, kwargs)
    if kwargs.get("deterministic") and min_workers is not None:
        msg = (f"min_workers={min_workers} cannot go with deterministic=True: a retry on fewer nodes would put other "
               "rows together in each step, so the job could not end with a clean run's weights")
        raise ValueError(msg)
    recovery = Recovery(sc, retries, backup_dir, min_workers, shrink_after)
    try:
        if not owned:
            return _attempts(sc, map_fun, tf_args, num_executors, retries, on_retry, tracking, recovery, kwargs)
        outcome = _attempts(sc, map_fun, tf_args, num_executors, retries, on_retry, tracking, recovery, kwargs)
    except BaseException as exc:
        if owned:
            tracking.finish(S.C_STOPPED if isinstance(exc, KeyboardInterrupt) else S.C_FAILED, error=exc)
        raise
    finally:
        recovery.close()
    tracking.finish(outcome.status.state)
    return outcome


def _tracking(setting: Any, sc: Any, tf_args: Any, num_executors: int, retries: int,
              kwargs: dict[str, Any]) -> tuple[Any, bool]:
    """The job's one MLflow run (resolved here, on the caller's thread), and whether run_job ends it."""
    from . import tracking as T

    wanted = T.request(setting)
    if wanted is None:
        return None, False
    run, owned = T.job_run(wanted, "cluster", {**kwargs, "sc": sc, "tf_args": tf_args,
                                               "num_executors": num_executors, "retries": retries})
    return run, owned


def _attempts(sc: Any, map_fun: Callable[[Any, Any], Any], tf_args: Any, num_executors: int, retries: int,
              on_retry: Callable[[int, TFClusterError], None] | None, tracking: Any, recovery: Recovery,
              kwargs: dict[str, Any]) -> RunOutcome:
    if tracking is not None:
        kwargs["mlflow"] = tracking  # every attempt logs into the one run
    base_env = dict(kwargs.pop("env", None) or {})
    num_epochs = int(kwargs.pop("num_epochs", 1))
    started = time.monotonic()
    failures: list[str] = []
    resumed: list[str] = []

    trainers = num_executors - int(kwargs.get("num_ps", 0) or 0) - (1 if kwargs.get("eval_node") else 0)

    def once(attempt: int) -> TFCluster:
        nodes = recovery.nodes(attempt, num_executors, trainers)
        env = dict(base_env, TFOS_ATTEMPT=str(attempt), **recovery.env(attempt))
        if attempt > 1:
            resumed.append(recovery.describe())
            if tracking is not None:
                tracking.resumed.append(f"attempt {attempt}: {resumed[-1]}")
        return run_once(sc, map_fun, tf_args, nodes, env=env, num_epochs=recovery.epochs(num_epochs),
                        skip_rows=recovery.skip_rows, **kwargs)

    cluster, attempt = attempts(once, retries, failures=failures, on_retry=on_retry)
    return RunOutcome(cluster.status(), attempt, tuple(failures), time.monotonic() - started, tuple(resumed))


def attempts(attempt_once: Callable[[int], T], retries: int, *, failures: list[str] | None = None,
             on_retry: Callable[[int, TFClusterError], None] | None = None,
             stopped: Callable[[], bool] = lambda: False) -> tuple[T, int]:
    """The retry loop: ``attempt_once(1)``, then after a node failure (``TFClusterError``) ``attempt_once(2)``, …

    At most ``retries + 1`` attempts, and none after ``stopped()`` turned true (the notebook handle's
    stop).  ``failures`` gets the first line of each failed attempt's error, oldest first;
    ``on_retry(attempt, error)`` is called before attempt ``attempt`` (2, 3, …) starts.  Returns what
    the successful attempt returned and its number; raises the last attempt's error (with a note
    naming the earlier ones) when it is not retried.  :func:`run_job` and ``%%tfos_cluster
    --retries`` both run this loop.
    """
    failures = [] if failures is None else failures
    attempt = 1
    while True:
        try:
            return attempt_once(attempt), attempt
        except TFClusterError as exc:
            if stopped() or attempt > retries:
                if failures:
                    exc.add_note(f"(attempt {attempt} of {retries + 1}; earlier attempts: {'; '.join(failures)})")
                raise
            failures.append((str(exc).splitlines() or [type(exc).__name__])[0])
            attempt += 1
            if on_retry is not None:
                on_retry(attempt, exc)
