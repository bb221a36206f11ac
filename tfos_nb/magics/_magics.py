"""The magics: ``%%tfos_cluster``, ``%%tfos_parallel``, ``%tfos_status``, ``%tfos_shutdown``, ``%tfos_logs``,
``%tfos_tensorboard`` (the options and their checks; the handles run the jobs, :mod:`._cell_panel` shows them)."""

from __future__ import annotations

import atexit
import os
from typing import Any

from IPython.core.magic import Magics, magics_class
from traitlets import Bool, CaselessStrEnum, Enum, Float, Integer, Unicode, Union, observe

from ..runtime import logs
from ..runtime.driver.control.stalls import DEFAULT_STALL_AFTER
from ..runtime.driver.launch.stages import check as check_resources
from ..runtime.driver.launch.start import add_start_listener, remove_start_listener
from ..runtime.driver.options import SHRINK_AFTER_S, ClusterShape, JobOptions, RetryPolicy
from ..runtime.driver.parallel import runs as parallel
from ..runtime.driver.tracking import option_facts
from . import _cell_panel, _doctor, _render, _views
from ._cell_options import (
    Namespace,
    cell_args,
    check_name,
    check_timeout,
    data_var,
    grid,
    node_env,
    tracking,
    unquoted,
    usage,
    usage_errors,
    validation_var,
)
from ._cellfn import CellError, build
from ._cluster_handle import ClusterFailed, ClusterHandle
from ._magic_args import argument, cell_magic, line_magic, magic_arguments, no_var_expand, parse_argstring
from ._parallel_handle import ParallelHandle
from ._run_handle import RunHandle
from ._spark import before_embedded_stop, spark_for_cell

DEFAULT_PARALLEL_NAME = "_tfos_parallel"


@magics_class
class TFOSMagics(Magics):
    """Run a notebook cell as a distributed TensorFlow cluster on Spark executors."""

    default_workers = Integer(2, help="Training nodes (chief + workers) when a cell gives no --workers.").tag(config=True)
    renderer = Enum(
        ["auto", "widget", "html", "text", "none"],
        "auto",
        help="How a cell shows its cluster: 'widget' a live ipywidgets panel (Stop button, TensorBoard tab), "
        "replaced at the end by a static table (HTML + text, shown by every front-end); 'html' an HTML table "
        "updated in place (nbconvert, front-ends without widgets), the same static table at the end; 'text' one "
        "line per state change; 'none' only the nodes' output and errors. "
        "'auto': widget in a kernel with ipywidgets, html in other kernels, text in terminal IPython.",
    ).tag(config=True)
    tf_threads = Integer(
        0,
        help="TensorFlow intra-op threads per node (inter-op gets one more). 0: spark.task.cpus (at most the "
        "executor's cores; 1 on the embedded local cluster); -1: TensorFlow's own default (every core).",
    ).tag(config=True)
    log_lines = Bool(True, help="Stream the nodes' output into the cell, prefixed by [role:index].").tag(config=True)
    evaluator_grace = Float(30.0, help="With --evaluator: seconds the evaluator may go on after the chief/workers finished "
                            "(to evaluate the last checkpoint); it is stopped then, sooner if its function returns.").tag(config=True)
    show_native_logs = Bool(
        False,
        help="Also stream TensorFlow's native (C++/XLA/absl) log lines into the cell: start-up info, oneDNN, "
        "'failed call to cuInit' on machines without a GPU. Hidden by default; %tfos_logs NAME always has them.",
    ).tag(config=True)
    spark_master_local = Unicode(
        "local-cluster[{n},1,1024]",
        help="Master of the embedded Spark started when the kernel has none; {n} is the cell's node count.",
    ).tag(config=True)
    timeout = Float(
        None, allow_none=True, help="Default --timeout in seconds for a cell's whole run (None: no limit)."
    ).tag(config=True)
    stall_after = Float(
        DEFAULT_STALL_AFTER, allow_none=True,
        help="Seconds a chief/worker may go without moving (no new phase, step or stack) before the panel flags it "
        "as stalled, naming its phase and the nodes that have not reached it (%tfos_stack NAME shows where it "
        "waits). 0 or None: never.",
    ).tag(config=True)
    shrink_after = Float(
        SHRINK_AFTER_S,
        help="With --retries and --min-workers: seconds a retry waits for the task slots of the failed attempt to "
        "come back before it starts on fewer chief/worker nodes.",
    ).tag(config=True)
    log_level = CaselessStrEnum(
        ["", *logs.LEVELS], default_value="",
        help="Level of tfos_nb's loggers (the tfos_nb.* tree) in this kernel and in the nodes it starts: DEBUG, INFO, "
        "WARNING or ERROR (any case); '' leaves Python's defaults (warnings and errors). The environment variable "
        "TFOS_NB_LOG_LEVEL sets the same at import.",
    ).tag(config=True)

    @observe("log_level")
    def _log_level_changed(self, change: Any) -> None:
        logs.set_level(change["new"] or None)

    api_panels = Bool(
        True,
        help="Also show the panel (widget or HTML) for clusters a cell starts with plain Python calls "
        "(TFCluster.run, TFEstimator.fit), in that cell's output.",
    ).tag(config=True)

    mlflow = Union(
        [Bool(), Unicode()], default_value=None, allow_none=True,
        help="Experiment tracking when a cell gives no --mlflow: None (default) logs a job to MLflow only inside an "
        "active MLflow run (with mlflow.start_run(): around the cell); True: one run per job in MLflow's current "
        "experiment; a string: in that experiment; False: never.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)  # type: ignore[no-untyped-call]  # IPython: no annotations
        self.handles: dict[str, RunHandle] = {}
        self._local_tensorboards: dict[str, Any] = {}
        atexit.register(self.shutdown_all)  # and before an embedded Spark stops, never under it:
        self._forget_before_spark_stop = before_embedded_stop(self.shutdown_all)
        add_start_listener(self._api_cluster_started)

    def _api_cluster_started(self, job: Any) -> None:
        """A panel for a cluster started by a Python call in a cell (not by %%tfos_cluster's own thread)."""
        _cell_panel.api_cluster_panel(self, job.state)

    @property
    def _user_ns(self) -> dict[str, Any]:
        assert self.shell is not None  # the kernel's namespace: magics are only registered on a shell
        user_ns: dict[str, Any] = self.shell.user_ns
        return user_ns

    def detach(self) -> None:
        """Stop showing panels for API-started clusters (``%unload_ext``)."""
        remove_start_listener(self._api_cluster_started)
        self._forget_before_spark_stop()

    # -- %%tfos_cluster -------------------------------------------------------------
    @no_var_expand
    @magic_arguments()
    @argument("--workers", type=int, default=None, metavar="N",
              help="training nodes; the first is the chief (default: TFOSMagics.default_workers)")
    @argument("--ps", type=int, default=0, metavar="M", help="parameter-server nodes (extra)")
    @argument("--evaluator", action="store_true", help="add an evaluator node (stopped TFOSMagics.evaluator_grace s after training ends)")
    @argument("--input-mode", choices=["spark", "tensorflow"], default=None,
              help="spark: the driver feeds --data to the nodes; tensorflow: the cell reads its own data "
              "(default: spark with --data, else tensorflow)")
    @argument("--data", metavar="VAR", help="a DataFrame (batch or streaming) or RDD in the notebook to feed (--input-mode spark)")
    @argument("--validation-data", metavar="VAR", help="a DataFrame or RDD in the notebook fed once as the named set "
              "'validation' (ctx.get_data_feed(qname_in='validation').as_dataset(...) for fit's validation_data)")
    @argument("--epochs", type=int, default=None, metavar="E", help="epochs to feed; also args.epochs (default 1)")
    @argument("--args", metavar="EXPR",
              help="a dict or namespace (a Python expression, quoted if it has spaces) passed as `args`")
    @argument("--tensorboard", action="store_true", help="start TensorBoard on the chief")
    @argument("--logdir", metavar="DIR", help="TensorBoard log directory (ctx.log_dir on the nodes)")
    @argument("--name", default="_tfos", help="notebook variable for the cluster's handle (default _tfos)")
    @argument("--background", action="store_true", help="return at once; the handle's wait() waits")
    @argument("--retries", type=int, default=0, metavar="N",
              help="start the cluster again up to N times when a node fails; it resumes from the last backup "
                   "ctx.progress_callback() keeps (or from your own checkpoints)")
    @argument("--min-workers", type=int, default=None, metavar="K",
              help="with --retries: start again on fewer chief/worker nodes (down to K) when the lost slots do not "
                   "come back within TFOSMagics.shrink_after seconds")
    @argument("--seed", type=int, default=None, metavar="S",
              help="seed Python, NumPy, TensorFlow and Keras with S on every node before the cell runs")
    @argument("--deterministic", action="store_true",
              help="the same weights at every run (with --seed, 0 if not given): TensorFlow's op determinism on the "
                   "nodes and each epoch's partitions fed to the nodes in a fixed order; with --retries, a run that "
                   "lost an executor ends with a clean run's weights")
    @argument("--timeout", type=float, default=None, metavar="SECONDS",
              help="stop the cluster if the run takes longer (default: TFOSMagics.timeout)")
    @argument("--mlflow", nargs="?", const=True, default=None, metavar="EXPERIMENT",
              help="log the job as one MLflow run, in EXPERIMENT if given (default: TFOSMagics.mlflow)")
    @argument("--resources", metavar="SPEC",
              help='Spark resources per role, quoted: "ps: cpus=1; worker: cpus=1 gpus=1" (roles chief, worker, ps, '
                   "evaluator, * for every role; cpus, gpus, memory, memory_overhead or a Spark resource's name); "
                   "each group of nodes starts in a stage of its own ResourceProfile")
    @cell_magic
    def tfos_cluster(self, line: str, cell: str) -> None:
        """Run this cell on a TensorFlow cluster of Spark executors.

        The cell is the body of a function ``(args, ctx)`` run on every node:
        ``ctx.job_name``, ``ctx.task_index``, ``ctx.is_chief``,
        ``ctx.get_data_feed()`` (its ``as_dataset(batch_size)`` feeds
        ``model.fit``), ``ctx.report(step=..., **metrics)`` and
        ``ctx.progress_callback()``.  ``args`` holds --args plus ``epochs``,
        read as ``args.epochs`` or ``args["epochs"]`` (also ``in``, ``get``,
        ``dict(args)``, ``vars(args)``).  Notebook names the cell uses (functions, constants, small
        objects) are shipped by value as they are when the cell runs.

        With --data the driver feeds that DataFrame/RDD --epochs times, then
        waits for the nodes to finish; without it the cell waits until the
        nodes' functions return.  A streaming DataFrame (``spark.readStream``)
        is fed micro-batch by micro-batch as one unbounded epoch until its
        query ends, the nodes return, or the cluster is stopped (with
        --background: ``%tfos_shutdown NAME``).  Node output streams into the cell as
        ``[role:index] line``; a node's error ends the cell and tears the
        cluster down; the ■ (interrupt) button stops the cluster.  TensorFlow's
        native start-up log lines are left out of the cell (``%tfos_logs`` has
        them; ``%config TFOSMagics.show_native_logs = True`` shows them).  The
        handle (--name, default ``_tfos``) has ``wait()``, ``shutdown()``,
        ``result``, ``value`` (what the chief's function returned: plain data),
        ``history`` (every reported metric, a pandas DataFrame), ``nodes``,
        ``metrics``, ``tensorboard_url``, ``logs()``.  ``--mlflow [EXPERIMENT]`` logs the job as
        one MLflow run (params, the chief's metrics by step, the model in ``args.export_dir``).

        Example::

            %%tfos_cluster --workers 2 --data train_df --epochs 3 --name digits
            import tensorflow as tf
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            with strategy.scope():
                model = build_model()
            ds = ctx.get_data_feed().as_dataset(batch_size=32)
            model.fit(ds, epochs=args.epochs, callbacks=[ctx.progress_callback()])
        """
        opts = parse_argstring(self.tfos_cluster, line)
        ns = self._user_ns
        workers = self.default_workers if opts.workers is None else opts.workers
        with usage_errors():  # the groups check the flags they hold, in the flags' words
            shape = ClusterShape(workers, opts.ps, opts.evaluator, chief="chief")
            options = JobOptions(env=node_env(self.tf_threads), stall_after=self.stall_after, seed=opts.seed,
                                 deterministic=opts.deterministic, resources=unquoted(opts.resources))
            policy = RetryPolicy(opts.retries, min_workers=opts.min_workers, shrink_after=self.shrink_after)
            policy.check(options)
        if opts.min_workers is not None and opts.min_workers > workers:  # a cell's own rule: it gave both
            raise usage(f"--min-workers must be between 1 and --workers ({workers}), got {opts.min_workers}")
        timeout = self.timeout if opts.timeout is None else opts.timeout
        check_timeout(timeout)
        name = opts.name
        check_name(name, ns, self.handles.get(name))
        mode = opts.input_mode or ("spark" if opts.data else "tensorflow")
        data = None
        if mode == "spark":
            if not opts.data:
                raise usage("--input-mode spark needs --data VAR (a DataFrame or RDD to feed)")
            data = data_var(ns, opts.data)
            if getattr(data, "isStreaming", False) and opts.epochs is not None:
                raise usage(f"--epochs does not apply to a streaming --data {opts.data}: a stream is one "
                             "unbounded epoch, fed until the query ends or the cluster is stopped")
        elif opts.data:
            raise usage("--data is fed only with --input-mode spark")
        validation = validation_var(ns, opts.validation_data, data, opts.data)
        values = cell_args(opts.args, ns)
        if opts.epochs is not None:
            values["epochs"] = opts.epochs
        values.setdefault("epochs", 1)
        args = Namespace(values)  # args.epochs and args["epochs"], like the dict or namespace the user gave
        epochs = args.epochs
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise usage(f"--epochs must be at least 1, got {epochs!r}")
        nodes = shape.num_nodes
        try:
            fn, _ = build(cell, ns, name)
        except CellError as exc:
            raise usage(str(exc)) from None

        self._stop_running(name, f"cluster {name}")
        sc = spark_for_cell(ns, self.spark_master_local, nodes)
        if options.resources is not None:  # what the session cannot give, said before any Spark job
            with usage_errors():
                check_resources(sc, options.resources, shape.roles())
        run = tracking(self.mlflow if opts.mlflow is None else opts.mlflow, "cluster", sc=sc, tf_args=args,
                       shape=shape, log_dir=opts.logdir, input_mode=int(data is not None), num_epochs=epochs,
                       retries=opts.retries, **{**option_facts(options), "name": name})
        handle = ClusterHandle(name, sc=sc, fn=fn, args=args, shape=shape, options=options, policy=policy,
                               tracking=run, data=data, epochs=epochs, validation=validation,
                               tensorboard=opts.tensorboard, log_dir=opts.logdir, evaluator_grace=self.evaluator_grace,
                               timeout=timeout, background=opts.background)
        if opts.tensorboard:  # the panel's TensorBoard tab and link: the proxy route, while the chief's TensorBoard runs
            from .. import tensorboard

            handle.add_observer(tensorboard.ClusterRoute())
        if self._launch(handle, f"({nodes} nodes); {name}.wait() waits for it, %tfos_status shows it, "
                        f"%tfos_shutdown {name} stops it"):
            return
        try:
            handle.wait()
        except ClusterFailed:
            cause = handle.error  # wait() raises the wrapper ``from None``: its __cause__ is gone
            if isinstance(cause, RuntimeError) and str(cause).startswith("not enough executors"):
                raise usage(str(cause)) from None
            raise

    # -- %%tfos_parallel: N independent runs (a sweep) -------------------------------------
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
    @argument("--name", default=DEFAULT_PARALLEL_NAME,
              help=f"notebook variable for the runs' handle (default {DEFAULT_PARALLEL_NAME})")
    @argument("--no-barrier", action="store_true",
              help="never gang-schedule the runs (by default they start together when there is a slot per run)")
    @argument("--background", action="store_true", help="return at once; the handle's wait() waits")
    @argument("--timeout", type=float, default=None, metavar="SECONDS", help="stop the runs if they take longer")
    @argument("--mlflow", nargs="?", const=True, default=None, metavar="EXPERIMENT",
              help="log a parent MLflow run and one child run per run, in EXPERIMENT if given (default: TFOSMagics.mlflow)")
    @cell_magic
    def tfos_parallel(self, line: str, cell: str) -> None:
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
        opts = parse_argstring(self.tfos_parallel, line)
        ns = self._user_ns
        params = grid(opts.grid, ns) if opts.grid else None
        if opts.runs is not None and opts.runs < 1:
            raise usage(f"--runs must be at least 1, got {opts.runs}")
        if params is None and opts.runs is None:
            raise usage("give --runs N, or --grid VAR (a list of dicts, one per run)")
        if params is not None and opts.runs is not None and opts.runs != len(params):
            raise usage(f"--runs {opts.runs} but --grid {opts.grid} has {len(params)} entries; give one, or make them agree")
        n = len(params) if params is not None else opts.runs
        check_timeout(opts.timeout)
        if opts.metric is not None and not opts.metric.strip():
            raise usage("--metric needs a metric name")
        name = opts.name
        check_name(name, ns, self.handles.get(name))
        base = cell_args(opts.args, ns)
        runs_args = [Namespace({**base, **(params[i] if params else {})}) for i in range(n)]
        try:
            fn, _ = build(cell, ns, name, magic="tfos_parallel")
        except CellError as exc:
            raise usage(str(exc)) from None

        self._stop_running(name, name)
        sc = spark_for_cell(ns, self.spark_master_local, 0, embedded_slots=max(1, min(n, os.cpu_count() or 1)))
        run = tracking(self.mlflow if opts.mlflow is None else opts.mlflow, "parallel", sc=sc, tf_args=runs_args,
                       num_executors=n, per_run=True, params=params, name=name)
        handle = ParallelHandle(name, sc=sc, fn=fn, runs_args=runs_args, params=params,
                                options=JobOptions(env=node_env(self.tf_threads)), tracking=run,
                                metric=opts.metric, mode=opts.mode, use_barrier=False if opts.no_barrier else None,
                                timeout=opts.timeout, background=opts.background)
        if self._launch(handle, f"({n} runs); {name}.wait() waits for them, %tfos_status shows them, "
                        f"%tfos_shutdown {name} stops them"):
            return
        handle.wait()
        best = handle.best
        if best is not None:
            metric = handle.metric or parallel.default_metric([r.metrics for r in handle.results])
            given = parallel.describe_args(params[best.index]) if params else ""
            print(f"tfos_nb: best of {n} runs: {best.label}" + (f" ({given})" if given else "")
                  + f": {metric} {best.metrics.get(metric) if metric else None}; {name}.best, {name}.table()")
        else:
            print(f"tfos_nb: {n} runs finished; {name}.results, {name}.values")

    # -- what both cell magics share ----------------------------------------------------
    def _stop_running(self, name: str, what: str) -> None:
        old = self.handles.get(name)
        if old is not None and not old.done:
            print(f"tfos_nb: stopping the running {what} first")
            old.shutdown()

    def _launch(self, handle: RunHandle, in_background: str) -> bool:
        """Start the cell's handle; True for a --background cell (it has returned), else the run has ended."""
        self.handles[handle.name] = handle
        self._user_ns[handle.name] = handle
        if handle.background:
            self._panel_in_background(handle)
        handle.start()
        if handle.background:
            print(f"tfos_nb: {handle.name} runs in the background {in_background}")
            return True
        _cell_panel.follow(self, handle)
        return False

    def _panel_in_background(self, handle: RunHandle) -> None:
        _cell_panel.panel_in_background(self, handle)

    # -- the other magics -------------------------------------------------------------
    @line_magic
    def tfos_status(self, line: str = "") -> None:
        """List this kernel's tfos_nb clusters: name, state, nodes, elapsed time, progress."""
        rows = []
        for name, h in self.handles.items():
            view = h.status()
            detail = " | ".join(_render.node_line(n) for n in view.nodes) if view is not None else ""
            if h.error is not None:
                detail = str(h.error).splitlines()[0]
            rows.append((name, h.state, h.num_nodes, None if view is None else view.elapsed, detail))
        print(_render.status_table(rows))

    @magic_arguments()
    @argument("name", nargs="?", help="the cluster's --name")
    @argument("--all", action="store_true", help="stop every cluster of this kernel")
    @line_magic
    def tfos_shutdown(self, line: str = "") -> None:
        """Stop a cluster now (like the ■ button for a --background cluster): ``%tfos_shutdown NAME|--all``."""
        opts = parse_argstring(self.tfos_shutdown, line)
        if opts.all == bool(opts.name):
            raise usage("give a cluster name or --all")
        names = list(self.handles) if opts.all else [self._known(opts.name)]
        for name in names:
            h = self.handles[name]
            h.shutdown()
            print(f"{name}: {h.state}")

    @magic_arguments()
    @argument("name", help="the cluster's --name")
    @argument("--node", metavar="ROLE:INDEX", help="one node, e.g. worker:0")
    @argument("--tail", type=int, default=100, metavar="N", help="last N lines per node (default 100)")
    @line_magic
    def tfos_logs(self, line: str = "") -> None:
        """Print a cluster's node output: ``%tfos_logs NAME [--node ROLE:INDEX] [--tail N]``."""
        opts = parse_argstring(self.tfos_logs, line)
        h = self.handles[self._known(opts.name)]
        if opts.tail < 0:
            raise usage(f"--tail must be 0 or more, got {opts.tail}")
        try:
            logs = h.logs(opts.node, opts.tail)
        except KeyError as exc:
            raise usage(str(exc.args[0])) from None
        for label, lines in logs.items():
            for text in lines:
                print(f"[{label}] {text}")

    @magic_arguments()
    @argument("name", help="the cluster's --name")
    @argument("--node", metavar="ROLE:INDEX", help="one node, e.g. worker:1 (default: every node)")
    @line_magic
    def tfos_stack(self, line: str = "") -> None:
        """Print the Python stacks of every thread in a running cluster's node processes: ``%tfos_stack NAME
        [--node ROLE:INDEX]``.  Where a stalled node waits (the panel flags it), e.g. the user's call it blocks
        in.  Taken by each node's supervisor (faulthandler, no extra privileges); classic Spark sessions."""
        opts = parse_argstring(self.tfos_stack, line)
        _views.print_stacks(self.handles[self._known(opts.name)], opts.node)

    @magic_arguments()
    @argument("name", nargs="?", help="a cluster's --name (its cell ran with --tensorboard)")
    @argument("--logdir", metavar="DIR", help="start TensorBoard on the driver for DIR (e.g. once the cluster is gone)")
    @argument("--height", type=int, default=800, metavar="PX", help="height of the embedded frame (default 800)")
    @line_magic
    def tfos_tensorboard(self, line: str = "") -> None:
        """Embed TensorBoard in the cell's output, through the Jupyter server's authenticated proxy.

        ``%tfos_tensorboard NAME`` shows the TensorBoard that the chief of cluster NAME
        runs (cell started with ``--tensorboard``); the route is withdrawn when the
        cluster ends.  ``%tfos_tensorboard --logdir DIR`` starts TensorBoard on the
        driver for DIR (a child process of the kernel, on loopback; the one it started
        for the same DIR is reused) so that runs can be looked at after training; it is
        stopped with the kernel.  Only the Jupyter server's ``tfos_nb`` extension serves the route, to
        users logged in to that server; when the route does not answer, the frame
        says so and what to do.  With ``TENSORBOARD_PROXY_URL`` set (a front-end's own
        proxy, e.g. ``/proxy/%PORT%/``) the frame uses it, as TensorBoard's
        ``%tensorboard`` does; terminal IPython prints the URLs.
        """
        opts = parse_argstring(self.tfos_tensorboard, line)
        handle = self.handles[self._known(opts.name)] if opts.name and not opts.logdir else None
        _views.show_tensorboard(opts, self.shell, handle, self._local_tensorboards)

    tfos_doctor = line_magic(_doctor.tfos_doctor)  # the pre-flight checks (magics/_doctor.py)

    def _known(self, name: str) -> str:
        if name not in self.handles:
            known = ", ".join(self.handles) or "none"
            raise usage(f"no cluster named {name}; clusters: {known}")
        return name

    def shutdown_all(self) -> None:
        """Stop every cluster of this kernel, and the TensorBoards it started (also run at kernel exit)."""
        from .. import tensorboard

        for local in list(self._local_tensorboards.values()):
            tensorboard.stop_local(local)
        self._local_tensorboards.clear()
        for h in list(self.handles.values()):
            h.stop("kernel shutdown")
        for h in list(self.handles.values()):
            h.join(15)
