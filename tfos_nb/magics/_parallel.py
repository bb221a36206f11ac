"""``%%tfos_parallel``: a cell run as N independent TensorFlow runs — a hyper-parameter sweep.

The cell is the body of a function ``(args, ctx)``, shipped like a
``%%tfos_cluster`` cell (:mod:`._cellfn`); each run gets its own ``args`` from
the ``--grid`` list of dicts and runs on an executor through
:mod:`tfos_nb.runtime.driver.parallel`.  The panel shows one row per run with its
parameters and its result, the best run starred; the handle (``--name``) has
``.best``, ``.results``, ``.table()``.

The magic is registered on ``TFOSMagics`` (``tfos_parallel = cell_magic(...)``),
so it shares its configuration (renderer, TensorFlow threads), its Spark
lookup, its panel loop and its handles (``%tfos_status``, ``%tfos_logs``,
``%tfos_shutdown`` work on runs too).
"""

from __future__ import annotations

import argparse
import keyword
import os
import queue
import threading
import time
import types
from collections import deque
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..runtime.args import Namespace
from ..runtime.driver import parallel as P
from ..runtime.driver import state as S
from ._cellfn import CellError, build
from ._handle import marked_failed
from ._spark import SparkUnusable, embedded_notice, find_spark_context, start_embedded

__all__ = ["ParallelFailed", "ParallelHandle", "tfos_parallel"]

DEFAULT_NAME = "_tfos_parallel"
LOG_LINES_KEPT = 5000


class ParallelFailed(P.TFParallelError):
    """A run of a ``%%tfos_parallel`` cell failed; shown as the run's error alone (no magic frames)."""

    @classmethod
    def wrap(cls, exc: BaseException, name: str) -> ParallelFailed:
        if isinstance(exc, ParallelFailed):
            return exc
        new = cls(str(exc) if isinstance(exc, P.TFParallelError) else f"{name}: {type(exc).__name__}: {exc}")
        if isinstance(exc, P.TFParallelError):
            new.node, new.host, new.executor_id = exc.node, exc.host, exc.executor_id
            new.exit_code, new.tail, new.run, new.run_args = exc.exit_code, list(exc.tail), exc.run, exc.run_args
        new.__cause__ = exc
        return new

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        return [f"\x1b[0;31mTFParallelError\x1b[0m: {lines[0]}", *lines[1:]]


class ParallelHandle:
    """The runs of a ``%%tfos_parallel`` cell: watch them, wait for them, stop them, find the best.

    ``wait()`` blocks until every run ended and re-raises a run's error;
    ``results`` lists each run's :class:`~tfos_nb.runtime.driver.parallel.RunResult`
    (``index``, ``args``, ``value`` — what the cell returned —, ``metrics``,
    ``host``) in grid order; ``best`` is the best one by ``metric``/``mode``;
    ``values`` what each run returned (or its metrics); ``table()`` a pandas
    DataFrame of parameters and metrics, best first; ``shutdown()`` stops the
    runs; ``logs()`` their output.
    """

    def __init__(self, name: str, *, sc: Any, fn: Any, runs_args: list[Any], params: list[dict] | None,
                 env: dict[str, str], metric: str | None, mode: str | None, use_barrier: bool | None = None,
                 timeout: float | None = None, background: bool = False) -> None:
        self.name = name
        self.num_nodes = len(runs_args)
        self.params = params
        self.metric = metric
        self.mode = mode
        self.timeout = timeout
        self.background = background
        self._sc, self._fn, self._runs_args, self._env, self._use_barrier = sc, fn, runs_args, env, use_barrier
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._runs: P.ParallelRuns | None = None
        self._stop_reason: str | None = None
        self._error: BaseException | None = None
        self._results: list[P.RunResult] | None = None
        self._log: deque[str] = deque(maxlen=LOG_LINES_KEPT)
        self.lines: queue.SimpleQueue[list[str]] | None = None if background else queue.SimpleQueue()
        self._observers: list[Any] = []
        self.started_at = time.time()

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> ParallelHandle:
        with self._lock:
            if self._thread is not None:
                return self
            self._thread = threading.Thread(target=self._main, name=f"tfos-cell-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            runs = P.start(self._sc, self._fn, self._runs_args, len(self._runs_args), self._use_barrier,
                           name=self.name, env=self._env, log_callback=self._on_log, on_state=self._on_state,
                           per_run=True, params=self.params, metric=self.metric, mode=self.mode)
            with self._lock:
                self._runs = runs
                stop = self._stop_reason
            if stop is not None:
                runs.stop(stop)
            self._results = runs.wait(self.timeout)
        except BaseException as exc:  # noqa: BLE001 - handed to wait() / the cell
            if self._stop_reason is None:
                self._error = exc
        finally:
            if self._runs is not None:
                self._runs.close()
            self._done.set()
            self._tell_observers(final=True)

    def stop(self, reason: str = "shut down") -> None:
        """Stop the runs now, from any thread; returns at once."""
        with self._lock:
            if self._done.is_set():
                return
            if self._stop_reason is None:
                self._stop_reason = reason
            runs = self._runs
        if runs is not None:
            runs.stop(reason)

    def shutdown(self, timeout: float = 30.0) -> list[P.RunResult] | None:
        """Stop the runs now and wait (up to ``timeout`` s) until they are gone."""
        if self._thread is None:
            return None
        self.stop("shut down")
        self._done.wait(timeout)
        return self._results

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the runs to end; True if they did."""
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> list[P.RunResult]:
        """Block until every run ended; returns ``results``, re-raises a run's error."""
        if not self._done.wait(timeout):
            msg = f"runs {self.name} are still {self.state} after {timeout:g} s"
            raise TimeoutError(msg)
        if self._error is not None:
            raise ParallelFailed.wrap(self._error, self.name) from None
        if self._results is None:
            msg = f"runs {self.name} were stopped ({self._stop_reason})"
            raise RuntimeError(msg)
        return self._results

    # -- observers (the --background panel) -------------------------------------------
    def _on_state(self, st: S.ClusterState) -> None:
        self._tell_observers(final=False)

    def add_observer(self, fn: Any) -> None:
        """Call ``fn(view, final)`` on every state change and once at the end (quick, no printing)."""
        with self._lock:
            self._observers.append(fn)

    def _tell_observers(self, final: bool) -> None:
        with self._lock:
            observers = list(self._observers)
        view = (self.final_status() if final else self.status()) if observers else None
        if view is None:
            return
        for fn in observers:
            try:
                fn(view, final)
            except Exception:  # noqa: BLE001 - a UI bug must not break the runs
                pass

    def _on_log(self, label: str, lines: list[str]) -> None:
        tagged = [f"[{label}] {line}" for line in lines]
        self._log.extend(tagged)
        if self.lines is not None:
            self.lines.put(tagged)

    # -- information ---------------------------------------------------------------------
    def status(self) -> P.ParallelView | None:
        """A snapshot: one row per run, its parameters, and the best finished run."""
        runs = self._runs
        return runs.status() if runs is not None else None

    def final_status(self) -> P.ParallelView | None:
        """``status()``, marked failed when the runs ended in an error their states do not show."""
        return marked_failed(self.status(), self._done.is_set(), self._error)

    @property
    def state(self) -> str:
        """starting, reserving, running, finished, failed or stopped."""
        view = self.status()
        if self._done.is_set() and self._error is not None:
            return S.C_FAILED
        return view.state if view is not None else ("starting" if not self._done.is_set() else S.C_STOPPED)

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def sc(self) -> Any:
        return self._sc

    cluster = None  # no TensorFlow cluster (and no TensorBoard) behind parallel runs
    tensorboard_url = None

    @property
    def nodes(self) -> tuple[S.NodeView, ...]:
        view = self.status()
        return view.nodes if view is not None else ()

    @property
    def metrics(self) -> dict[str, dict[str, Any]]:
        """The last metrics of each run, by ``run:i``."""
        return {n.label: dict(n.metrics) for n in self.nodes}

    @property
    def results(self) -> list[P.RunResult]:
        """Every run's result in grid order (after ``wait()``; raises the run's error if one failed)."""
        return self.wait(0) if self._done.is_set() else self.wait()

    @property
    def values(self) -> list[Any]:
        """What each run returned, or its reported metrics when it returned nothing (``TFParallel.run``'s list)."""
        return [r.result for r in self.results]

    @property
    def best(self) -> P.RunResult | None:
        """The best run by ``metric`` (default: val_accuracy, accuracy, val_loss or loss) and ``mode``."""
        results = self.results
        metric = self.metric or P.default_metric([r.metrics for r in results])
        index = P.best_index([r.metrics for r in results], metric, self.mode)
        return None if index is None else results[index]

    def table(self) -> Any:
        """A pandas DataFrame: one row per run (run, parameters, metrics), best first."""
        import pandas as pd

        results = self.results
        rows = [{"run": r.index, **(self.params[r.index] if self.params else {}), **r.metrics} for r in results]
        df = pd.DataFrame(rows)
        metric = self.metric or P.default_metric([r.metrics for r in results])
        if metric and metric in df:
            df = df.sort_values(metric, ascending=(self.mode or P.default_mode(metric)) == "min", kind="stable")
        return df.reset_index(drop=True)

    @property
    def output(self) -> list[str]:
        """Every run's output lines so far, ``[run:i] line``, in arrival order (the last 5,000)."""
        return list(self._log)

    def logs(self, node: str | None = None, tail: int | None = 100) -> dict[str, list[str]]:
        """Output lines of one run (``"run:2"``) or of every run."""
        runs = self._runs
        if runs is None:
            return {}
        out = {label: lines for label, lines in runs.logs(None, tail).items() if node in (None, label)}
        if node is not None and not out:
            msg = f"no run {node!r} in {self.name}; runs: run:0 … run:{self.num_nodes - 1}"
            raise KeyError(msg)
        return out

    def __repr__(self) -> str:
        return f"<tfos_nb parallel runs {self.name!r}: {self.state}, {self.num_nodes} run(s)>"


# ---------------------------------------------------------------------------
# The magic
# ---------------------------------------------------------------------------


def _usage(msg: str) -> UsageError:
    return UsageError(msg)


def _identifier_keys(values: Mapping[Any, Any], what: str) -> None:
    bad = [k for k in values if not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k)]
    if bad:
        raise _usage(f"{what} keys must be names usable as attributes (args.NAME), got {bad[0]!r}")


def _grid(var: str, ns: Mapping[str, Any]) -> list[dict]:
    if var not in ns:
        raise _usage(f"--grid {var}: no such variable in the notebook")
    grid = ns[var]
    if isinstance(grid, Mapping):
        raise _usage(
            f"--grid {var}: expected a list of dicts (one per run), got a dict; for every combination of a dict "
            "of lists: [dict(zip(d, v)) for v in itertools.product(*d.values())]"
        )
    if not isinstance(grid, (list, tuple)):
        raise _usage(f"--grid {var}: expected a list of dicts (one per run), got {type(grid).__name__}")
    if not grid:
        raise _usage(f"--grid {var}: the list is empty")
    for i, entry in enumerate(grid):
        if not isinstance(entry, Mapping):
            raise _usage(f"--grid {var}: entry {i} is a {type(entry).__name__}, not a dict")
        _identifier_keys(entry, f"--grid {var}: entry {i}:")
    return [dict(entry) for entry in grid]


def _base_args(expr: str | None, ns: Mapping[str, Any]) -> dict[str, Any]:
    if not expr:
        return {}
    if len(expr) >= 2 and expr[0] == expr[-1] and expr[0] in "'\"":
        expr = expr[1:-1]  # IPython's argument splitter keeps the quotes
    try:
        given = eval(expr, dict(ns))  # noqa: S307 - the user's own notebook expression
    except Exception as exc:  # noqa: BLE001
        raise _usage(f"--args {expr}: {type(exc).__name__}: {exc}") from None
    if isinstance(given, Mapping):
        values = dict(given)
    elif isinstance(given, (types.SimpleNamespace, argparse.Namespace, Namespace)):
        values = dict(vars(given))
    else:
        raise _usage(f"--args must be a dict or a namespace, got {type(given).__name__}")
    _identifier_keys(values, "--args")
    return values


def _spark_for_runs(magics: Any, runs: int) -> Any:
    """The notebook's SparkContext, or an embedded local-cluster with one slot per run (at most one per core)."""
    try:
        sc = find_spark_context(magics.shell.user_ns)
        if sc is None:
            n = max(1, min(runs, os.cpu_count() or 1))
            print(embedded_notice(magics.spark_master_local.format(n=n)))
            spark = start_embedded(n, magics.spark_master_local)
            magics.shell.user_ns.setdefault("spark", spark)
            return spark.sparkContext
    except SparkUnusable as exc:
        raise _usage(str(exc)) from None
    return sc


@no_var_expand
@magic_arguments()
@argument("--runs", type=int, default=None, metavar="N", help="number of runs (default: one per --grid entry)")
@argument("--grid", metavar="VAR", help="a list of dicts in the notebook: run i gets entry i as `args`")
@argument("--args", metavar="EXPR",
          help="a dict or namespace (a Python expression, quoted if it has spaces) every run gets; grid entries "
          "override its keys")
@argument("--metric", metavar="NAME",
          help="rank the runs by this metric (default: val_accuracy, accuracy, val_loss or loss, the first reported)")
@argument("--mode", choices=["max", "min"], default=None,
          help="whether the best run has the largest or smallest --metric (default: min for losses/errors, else max)")
@argument("--name", default=DEFAULT_NAME, help=f"notebook variable for the runs' handle (default {DEFAULT_NAME})")
@argument("--no-barrier", action="store_true",
          help="never gang-schedule the runs (by default they start together when there is a slot per run)")
@argument("--background", action="store_true", help="return at once; the handle's wait() waits")
@argument("--timeout", type=float, default=None, metavar="SECONDS", help="stop the runs if they take longer")
def tfos_parallel(self: Any, line: str, cell: str) -> None:
    """Run this cell as N independent TensorFlow runs on Spark executors (a hyper-parameter sweep).

    The cell is the body of a function ``(args, ctx)``; run ``i`` gets entry
    ``i`` of the ``--grid`` list of dicts as ``args`` (``args.learning_rate``
    or ``args["learning_rate"]``), merged over ``--args``.  There is no cluster
    between the runs: each is a fresh single-node TensorFlow process.  A run
    reports metrics with ``ctx.report(**metrics)`` or
    ``ctx.progress_callback()``, and may ``return`` a dict of results.
    ``ctx.worker_num`` is the run's index, ``ctx.num_workers`` the number of runs.

    The panel shows one row per run (its parameters, state, metrics), the best
    finished run by ``--metric``/``--mode`` starred.  A run's error stops the
    others and ends the cell with that run's message; ■ (interrupt) stops them
    all.  The handle (``--name``, default ``_tfos_parallel``) has ``best``,
    ``results`` (grid order), ``values``, ``table()``, ``wait()``,
    ``shutdown()``, ``logs()``.  With fewer Spark task slots than runs the
    runs go in waves.

    Example::

        grid = [{"learning_rate": lr} for lr in (0.001, 0.003, 0.01, 0.03)]

        %%tfos_parallel --grid grid --metric val_accuracy --name sweep
        model = build_model(args.learning_rate)
        hist = model.fit(x, y, validation_split=0.2, epochs=5, callbacks=[ctx.progress_callback()])
        return {"val_accuracy": hist.history["val_accuracy"][-1]}
    """
    opts = parse_argstring(tfos_parallel, line)
    ns = self.shell.user_ns
    grid = _grid(opts.grid, ns) if opts.grid else None
    if opts.runs is not None and opts.runs < 1:
        raise _usage(f"--runs must be at least 1, got {opts.runs}")
    if grid is None and opts.runs is None:
        raise _usage("give --runs N, or --grid VAR (a list of dicts, one per run)")
    if grid is not None and opts.runs is not None and opts.runs != len(grid):
        raise _usage(f"--runs {opts.runs} but --grid {opts.grid} has {len(grid)} entries; give one, or make them agree")
    n = len(grid) if grid is not None else opts.runs
    if opts.timeout is not None and opts.timeout <= 0:
        raise _usage(f"--timeout must be more than 0 seconds, got {opts.timeout:g}")
    if opts.metric is not None and not opts.metric.strip():
        raise _usage("--metric needs a metric name")
    name = opts.name
    if not name.isidentifier() or keyword.iskeyword(name):
        raise _usage(f"--name {name}: not a valid Python variable name")
    handles = self.handles
    if name in ns and not (isinstance(ns[name], ParallelHandle) or ns[name] is handles.get(name)):
        raise _usage(
            f"--name {name}: `{name}` is already defined in the notebook (type {type(ns[name]).__name__}); "
            "choose another --name"
        )
    base = _base_args(opts.args, ns)
    runs_args = [Namespace({**base, **(grid[i] if grid else {})}) for i in range(n)]
    try:
        fn, _ = build(cell, ns, name, magic="tfos_parallel")
    except CellError as exc:
        raise _usage(str(exc)) from None

    old = handles.get(name)
    if old is not None and not old.done:
        print(f"tfos_nb: stopping the running {name} first")
        old.shutdown()
    sc = _spark_for_runs(self, n)
    handle = ParallelHandle(name, sc=sc, fn=fn, runs_args=runs_args, params=grid, env=self._env(),
                            metric=opts.metric, mode=opts.mode, use_barrier=False if opts.no_barrier else None,
                            timeout=opts.timeout, background=opts.background)
    handles[name] = handle
    ns[name] = handle
    if opts.background:
        self._panel_in_background(handle)
    handle.start()
    if opts.background:
        print(f"tfos_nb: {name} runs in the background ({n} runs); {name}.wait() waits for them, "
              f"%tfos_status shows them, %tfos_shutdown {name} stops them")
        return
    self._follow(handle)
    handle.wait()
    best = handle.best
    if best is not None:
        metric = handle.metric or P.default_metric([r.metrics for r in handle.results])
        given = P.describe_args(grid[best.index]) if grid else ""
        print(f"tfos_nb: best of {n} runs: {best.label}" + (f" ({given})" if given else "")
              + f": {metric} {best.metrics.get(metric)}; {name}.best, {name}.table()")
    else:
        print(f"tfos_nb: {n} runs finished; {name}.results, {name}.values")
