"""Start → train → shut down in one call, starting the whole cluster again when a node fails.

TensorFlow's multi-worker training cannot take a replacement worker into a
running cluster: a lost worker leaves the others blocked in collectives.  So the
unit of recovery is the whole run.  With ``retries=N``, a node failure
(:class:`~tfos_nb.runtime.driver.cluster.TFClusterError`: a node raised, was killed,
lost its executor or its heartbeats) tears the cluster down and starts it
again, up to N more times.  The node function resumes from its own checkpoints
(Keras ``BackupAndRestore`` or a ``tf.train.CheckpointManager`` in a directory
every attempt shares); nodes read the attempt number as ``ctx.attempt``.

Not retried: errors that would fail the same way again (bad arguments, not
enough executors, a reservation timeout) and ``KeyboardInterrupt``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

from . import state as S
from .cluster import InputMode, TFCluster
from .errors import TFClusterError
from .start import run

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a :func:`run_job` ended: the last attempt's final status and the failures before it."""

    status: S.ClusterView
    attempts: int
    failures: tuple[str, ...]  # one line per failed attempt, oldest first
    seconds: float


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
    **run_kwargs: Any,
) -> TFCluster:
    """One start → train (``data``, when given; ``validation``: its validation set, fed once) → shutdown; the
    cluster is closed whatever happens.

    Returns the shut-down cluster (its ``status()`` is the final view); raises what start,
    train or shutdown raised.
    """
    cluster = run(sc, map_fun, tf_args, num_executors, **run_kwargs)
    try:
        if data is not None:
            cluster.train(data, num_epochs, feed_timeout=feed_timeout, batch_rows=batch_rows, validation=validation)
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
    """
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        msg = f"retries must be a non-negative integer, got {retries!r}"
        raise ValueError(msg)
    if kwargs.get("data") is not None:
        kwargs.setdefault("input_mode", InputMode.SPARK)
    tracking, owned = _tracking(kwargs.pop("mlflow", None), sc, tf_args, num_executors, retries, kwargs)
    if not owned:
        return _attempts(sc, map_fun, tf_args, num_executors, retries, on_retry, tracking, kwargs)
    try:
        outcome = _attempts(sc, map_fun, tf_args, num_executors, retries, on_retry, tracking, kwargs)
    except BaseException as exc:
        tracking.finish(S.C_STOPPED if isinstance(exc, KeyboardInterrupt) else S.C_FAILED, error=exc)
        raise
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
              on_retry: Callable[[int, TFClusterError], None] | None, tracking: Any,
              kwargs: dict[str, Any]) -> RunOutcome:
    if tracking is not None:
        kwargs["mlflow"] = tracking  # every attempt logs into the one run
    base_env = dict(kwargs.pop("env", None) or {})
    started = time.monotonic()
    failures: list[str] = []

    def once(attempt: int) -> TFCluster:
        return run_once(sc, map_fun, tf_args, num_executors, env=dict(base_env, TFOS_ATTEMPT=str(attempt)), **kwargs)

    cluster, attempt = attempts(once, retries, failures=failures, on_retry=on_retry)
    return RunOutcome(cluster.status(), attempt, tuple(failures), time.monotonic() - started)


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
