"""The handle a ``%%tfos_parallel`` cell leaves in the notebook (a :class:`~._run_handle.RunHandle`).

Its thread starts the runs (:mod:`tfos_nb.runtime.driver.parallel.runs`) and waits
for them; ``best``, ``results``, ``values`` and ``table()`` read their results.
Every call into the driver's ``ParallelRuns`` is in ``_start_job``,
``_stop_job`` and ``_close_job``.  Nothing here imports IPython.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..runtime.driver.options import JobOptions
from ..runtime.driver.parallel import runs as parallel
from ._run_handle import RunFailed, RunHandle

__all__ = ["ParallelFailed", "ParallelHandle"]


class ParallelFailed(RunFailed, parallel.TFParallelError):
    """A run of a ``%%tfos_parallel`` cell failed; shown as the run's error alone (no magic frames)."""

    wraps = parallel.TFParallelError
    shown_as = "TFParallelError"
    prefix = "{name}"
    quiet = False


class ParallelHandle(RunHandle):
    """The runs of a ``%%tfos_parallel`` cell: watch them, wait for them, stop them, find the best.

    ``wait()`` blocks until every run ended and re-raises a run's error;
    ``results`` lists each run's :class:`~tfos_nb.runtime.driver.parallel.runs.RunResult`
    (``index``, ``args``, ``value`` — what the cell returned —, ``metrics``,
    ``host``) in grid order; ``best`` is the best one by ``metric``/``mode``;
    ``values`` what each run returned (or its metrics); ``table()`` a pandas
    DataFrame of parameters and metrics, best first; ``shutdown()`` stops the
    runs; ``logs()`` their output.
    """

    error_type = ParallelFailed
    _STILL = "runs {name} are still {state} after {timeout:g} s"
    _STOPPED = "runs {name} were stopped ({reason})"
    _REPR = "<tfos_nb parallel runs {name!r}: {state}, {n} run(s)>"

    cluster = None  # no TensorFlow cluster (and no TensorBoard) behind parallel runs
    tensorboard_url = None

    def __init__(self, name: str, *, sc: Any, fn: Any, runs_args: list[Any], params: list[dict[str, Any]] | None,
                 metric: str | None, mode: str | None, options: JobOptions | None = None,
                 use_barrier: bool | None = None,
                 timeout: float | None = None, background: bool = False,
                 start_runs: Callable[..., parallel.ParallelRuns] = parallel.start,
                 clock: Callable[[], float] = time.time,
                 tracking: Any = None) -> None:
        super().__init__(name, sc=sc, num_nodes=len(runs_args), timeout=timeout, background=background, clock=clock,
                         tracking=tracking)
        self.params = params
        self.metric = metric
        self.mode = mode
        self._start = start_runs  # tfos_nb.runtime.driver.parallel.runs.start, or a test's fake
        self._fn, self._runs_args, self._use_barrier = fn, runs_args, use_barrier
        self._options = JobOptions.of(options, name=name, log_callback=self._on_log, on_state=self._on_state,
                                      mlflow=tracking if tracking is not None else False)
        self._runs: parallel.ParallelRuns | None = None

    # -- the job: every call into the driver's ParallelRuns ---------------------------------
    def _start_job(self) -> parallel.ParallelRuns:
        return self._start(self._sc, self._fn, self._runs_args, len(self._runs_args), self._use_barrier,
                           per_run=True, params=self.params, metric=self.metric, mode=self.mode, options=self._options)

    def _stop_job(self, reason: str) -> None:
        runs = self._runs
        if runs is not None:
            runs.stop(reason)

    def _close_job(self) -> None:
        if self._runs is not None:
            self._runs.close()

    def _run_job(self) -> None:
        runs = self._start_job()
        with self._lock:
            self._runs = runs
            stop = self._stop_reason
        if stop is not None:
            self._stop_job(stop)  # stopped while the runs started
        self._result = runs.wait(self.timeout)

    # -- information ---------------------------------------------------------------------
    def status(self) -> parallel.ParallelView | None:
        """A snapshot: one row per run, its parameters, and the best finished run."""
        runs = self._runs
        return runs.status() if runs is not None else None

    def _node_logs(self, tail: int | None) -> dict[str, list[str]] | None:
        runs = self._runs
        return None if runs is None else runs.logs(None, tail)

    def _no_node(self, node: str) -> str:
        return f"no run {node!r} in {self.name}; runs: run:0 … run:{self.num_nodes - 1}"

    @property
    def results(self) -> list[parallel.RunResult]:
        """Every run's result in grid order (after ``wait()``; raises the run's error if one failed)."""
        results: list[parallel.RunResult] = self.wait(0) if self._done.is_set() else self.wait()
        return results

    @property
    def values(self) -> list[Any]:
        """What each run returned, or its reported metrics when it returned nothing (``TFParallel.run``'s list)."""
        return [r.result for r in self.results]

    @property
    def best(self) -> parallel.RunResult | None:
        """The best run by ``metric`` (default: val_accuracy, accuracy, val_loss or loss) and ``mode``."""
        results = self.results
        metric = self.metric or parallel.default_metric([r.metrics for r in results])
        index = parallel.best_index([r.metrics for r in results], metric, self.mode)
        return None if index is None else results[index]

    def table(self) -> Any:
        """A pandas DataFrame: one row per run (run, parameters, metrics), best first."""
        import pandas as pd

        results = self.results
        rows = [{"run": r.index, **(self.params[r.index] if self.params else {}), **r.metrics} for r in results]
        df = pd.DataFrame(rows)
        metric = self.metric or parallel.default_metric([r.metrics for r in results])
        if metric and metric in df:
            df = df.sort_values(metric, ascending=(self.mode or parallel.default_mode(metric)) == "min", kind="stable")
        return df.reset_index(drop=True)
