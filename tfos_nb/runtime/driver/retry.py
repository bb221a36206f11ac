"""Start → train → shut down in one call, starting the whole cluster again when a node fails.

TensorFlow's multi-worker training cannot take a replacement worker into a
running cluster: a lost worker leaves the others blocked in collectives.  So the
unit of recovery is the whole run.  With ``retries=N``, a node failure
(:class:`.cluster.TFClusterError`: a node raised, was killed,
lost its executor or its heartbeats) tears the cluster down and starts it
again, up to N more times; nodes read the attempt number as ``ctx.attempt``.

The next attempt resumes from the last backup, with no code of the user's: ``ctx.progress_callback()`` keeps
one for Keras in the job's backup folder (``ctx.checkpoint_dir``, :mod:`..recovery`), and a fed job's resumed
epoch holds only the rows that backup had not trained on (:class:`~..recovery.restart.Recovery`).  A program with its own
checkpoints (Keras ``BackupAndRestore``, a ``tf.train.CheckpointManager`` in ``ctx.checkpoint_dir``) resumes
from those, and is fed every epoch again.

Not retried: errors that would fail the same way again (bad arguments, not
enough executors, a reservation timeout) and ``KeyboardInterrupt``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..recovery.restart import Recovery
from . import tracking as experiment_tracking
from .cluster import InputMode, TFCluster
from .control import state
from .errors import TFClusterError
from .keywords import JobKeywords, job_groups
from .launch.start import start_cluster
from .options import ClusterShape, JobOptions, RetryPolicy, StartOptions, Training

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is Python 3.11+; only annotations use it

__all__ = ["Attempts", "RunOutcome", "attempts", "run_job"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a :func:`run_job` ended: the last attempt's final status and the failures before it."""

    status: state.ClusterView
    attempts: int
    failures: tuple[str, ...]  # one line per failed attempt, oldest first
    seconds: float
    resumed: tuple[str, ...] = ()  # where each retry resumed from, oldest first


class Attempts:
    """One job's attempts, each start → train → shutdown; :func:`run_job` and ``%%tfos_cluster`` both drive one.

    ``once(n)`` runs attempt ``n``: the cluster of ``shape`` (fewer chief/workers when the policy lets a retry
    shrink), the nodes' environment saying the attempt and its backups, the epochs and rows its backup had not
    trained; a failure closes the cluster and raises.  ``start``: ``start.start_cluster`` (or a test's fake),
    called with ``launch`` (:class:`~.options.StartOptions`: ``tensorboard``, ``log_dir``, ``input_mode``…).
    """

    def __init__(self, sc: Any, map_fun: Callable[[Any, Any], Any], tf_args: Any, shape: ClusterShape,
                 options: JobOptions, training: Training, policy: RetryPolicy, *,
                 start: Callable[..., TFCluster] = start_cluster, tracking: Any = None,
                 launch: StartOptions | None = None) -> None:
        self.sc, self.map_fun, self.tf_args, self.shape = sc, map_fun, tf_args, shape
        self.options, self.training, self.policy, self.tracking = options, training, policy, tracking
        self._start, self._launch = start, StartOptions() if launch is None else launch
        self.recovery = Recovery(sc, policy)
        self.resumed: list[str] = []  # where each retry resumed from, oldest first

    def shape_of(self, attempt: int) -> ClusterShape:
        """The cluster attempt ``attempt`` starts (asked before it starts: the retry may wait for slots here)."""
        return self.recovery.shape(attempt, self.shape)

    def once(self, attempt: int, shape: ClusterShape | None = None,
             on_cluster: Callable[[TFCluster], bool] | None = None,
             on_resume: Callable[[int, str], None] | None = None) -> TFCluster:
        """Attempt ``attempt`` on ``shape`` (default :meth:`shape_of`); ``on_cluster(cluster)`` once its nodes run
        (False: stopped meanwhile, shut down without training); ``on_resume(attempt, where)`` for a retry."""
        shape = self.shape_of(attempt) if shape is None else shape
        env = {"TFOS_ATTEMPT": str(attempt), **self.recovery.env(attempt)}
        options = self.options.with_env(env).replace(mlflow=self.tracking if self.tracking is not None else False)
        cluster = self._start(self.sc, self.map_fun, self.tf_args, shape, options, launch=self._launch)
        try:
            if attempt > 1:
                said = self.recovery.describe()
                self.resumed.append(said)
                if self.tracking is not None:
                    self.tracking.resumed.append(f"attempt {attempt}: {said}")
                if on_resume is not None:
                    on_resume(attempt, said)
            if on_cluster is None or on_cluster(cluster):
                t = self.training
                if t.data is not None:
                    cluster.train(t.data, self.recovery.epochs(t.num_epochs), feed_timeout=t.feed_timeout,
                                  batch_rows=t.batch_rows, validation=t.validation, skip_rows=self.recovery.skip_rows)
                cluster.shutdown(grace_secs=t.grace_secs, timeout=t.shutdown_timeout)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def close(self) -> None:
        self.recovery.close()


def run_job(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    *,
    on_retry: Callable[[int, TFClusterError], None] | None = None,
    options: JobOptions | None = None,
    **given: Unpack[JobKeywords],
) -> RunOutcome:
    """Run ``map_fun`` on a cluster of ``num_executors`` nodes to the end, retrying node failures.

    Each attempt starts the cluster, feeds ``data`` (an RDD or DataFrame) for ``num_epochs`` epochs with
    ``InputMode.SPARK`` (``feed_timeout``, ``batch_rows``, ``validation``; :class:`Training`) — without it the
    nodes read their own data — then ``shutdown(grace_secs, shutdown_timeout)``.  ``retries``, ``backup_dir``,
    ``min_workers``, ``shrink_after``: what a node failure does (:class:`~.options.RetryPolicy`).  Other keyword
    arguments are :func:`.launch.start.run`'s (``num_ps``, ``tensorboard``, … and its options; each keyword's type
    and group: :mod:`.keywords`);
    ``mlflow=`` (as there) tracks the whole job as one MLflow run: every attempt logs into it (tags
    ``tfos_nb.attempts``, ``tfos_nb.failures``), not into nested runs — a retry resumes the same
    training from its checkpoints.  ``on_retry(attempt,
    error)`` is called before attempt ``attempt`` (2, 3, …) starts.  Raises the last
    attempt's error when every attempt failed.

    With retries, each attempt resumes from the last backup (:class:`~..recovery.restart.Recovery`): in a folder under
    ``backup_dir`` (or ``$TFOS_NB_BACKUP_ROOT``; on a local master, the temporary directory), which
    every node must reach, removed when the job ends.  ``min_workers`` lets a retry start on fewer
    chief/worker nodes (not fewer than it) when the failed attempt's task slots did not come back within
    ``shrink_after`` seconds: the global batch stays (``as_dataset``'s batch is the global one under
    ``MultiWorkerMirroredStrategy``), each replica's grows, and every row is still trained once.
    With ``deterministic=True`` (and ``seed``, see :func:`.launch.start.run`) a job that
    lost an executor ends with the weights of a clean run; it cannot shrink.
    """
    groups = job_groups(num_executors, options, given)
    training, policy, options = groups.training, groups.policy, groups.options
    facts = {"sc": sc, "tf_args": tf_args, "shape": groups.shape, "input_mode": InputMode.SPARK
             if training.data is not None else given.get("input_mode"), "log_dir": groups.launch.log_dir,
             "num_epochs": training.num_epochs if "num_epochs" in given else None,
             "batch_rows": training.batch_rows if "batch_rows" in given else None, "retries": policy.retries,
             **experiment_tracking.option_facts(options)}
    tracking, owned = experiment_tracking.resolve(options.mlflow, "cluster", facts)
    job = Attempts(sc, map_fun, tf_args, groups.shape, options, training, policy, tracking=tracking,
                   launch=groups.launch)
    started = time.monotonic()
    failures: list[str] = []
    try:
        cluster, attempt = attempts(job.once, policy.retries, failures=failures, on_retry=on_retry)
        cluster.close()
        outcome = RunOutcome(cluster.status(), attempt, tuple(failures), time.monotonic() - started,
                             tuple(job.resumed))
    except BaseException as exc:
        if owned and tracking is not None:
            tracking.finish(state.C_STOPPED if isinstance(exc, KeyboardInterrupt) else state.C_FAILED, error=exc)
        raise
    finally:
        job.close()
    if owned and tracking is not None:
        tracking.finish(outcome.status.state)
    return outcome


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
                    _add_note(exc, f"(attempt {attempt} of {retries + 1}; earlier attempts: {'; '.join(failures)})")
                raise
            failures.append((str(exc).splitlines() or [type(exc).__name__])[0])
            attempt += 1
            if on_retry is not None:
                on_retry(attempt, exc)


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+); on 3.10 the same ``__notes__`` list, which its tracebacks do not print
    (the cell's output has said each earlier attempt's failure as it happened)."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
