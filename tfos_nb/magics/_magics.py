"""``%%tfos_cluster``, ``%tfos_status``, ``%tfos_shutdown``, ``%tfos_logs``."""

from __future__ import annotations

import argparse
import atexit
import keyword
import os
import sys
import threading
import time
import types
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Enum, Float, Integer, Unicode

from ..runtime.args import Namespace
from ..runtime.driver import state as S
from ..runtime.driver.start import add_start_listener, remove_start_listener
from ..widgets import JobProgress
from . import _parallel, _render
from ._cellfn import CellError, build
from ._handle import ClusterFailed, ClusterHandle
from ._quiet import quiet_lines
from ._spark import (
    CONNECT_MSG,
    SparkUnusable,
    embedded_notice,
    expected_slots,
    find_spark_context,
    job_groups,
    job_progress,
    start_embedded,
)

PROGRESS_INTERVAL_S = 1.0  # Spark job progress is polled (py4j calls) at most once a second
BLOCKING_STOP_HINT = "This cell is running: interrupt the kernel (■) to stop the cluster"
INTERRUPT_GRACE_S = 15.0


def _usage(msg: str) -> UsageError:
    return UsageError(msg)


@magics_class
class TFOSMagics(Magics):
    """Run a notebook cell as a distributed TensorFlow cluster on Spark executors."""

    default_workers = Integer(2, help="Training nodes (chief + workers) when a cell gives no --workers.").tag(
        config=True
    )
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
        1,
        help="TensorFlow intra-op threads per node (inter-op gets one more); 0 leaves TensorFlow's default. "
        "Nodes sharing a machine's cores train faster with few threads each.",
    ).tag(config=True)
    log_lines = Bool(True, help="Stream the nodes' output into the cell, prefixed by [role:index].").tag(
        config=True
    )
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
    api_panels = Bool(
        True,
        help="Also show the panel (widget or HTML) for clusters a cell starts with plain Python calls "
        "(TFCluster.run, TFEstimator.fit), in that cell's output.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.handles: dict[str, ClusterHandle] = {}
        self._local_tensorboards: dict[str, Any] = {}
        atexit.register(self.shutdown_all)
        add_start_listener(self._api_cluster_started)

    def _api_cluster_started(self, job: Any) -> None:
        """A panel for a cluster started by a Python call in a cell (not by %%tfos_cluster's own thread)."""
        st: S.ClusterState = job.state
        if not self.api_panels or threading.current_thread() is not threading.main_thread():
            return
        from ..widgets import choose_renderer, make_renderer

        kind = choose_renderer(self.renderer, self.shell)
        if kind not in ("widget", "html"):
            return  # text lines from listener threads would land in whatever cell runs then
        try:
            renderer = make_renderer(kind)
        except ImportError:
            renderer = make_renderer("html")
        assert renderer is not None
        renderer.start(st.name)

        def on_change(state: S.ClusterState) -> None:
            view = state.snapshot()
            if view.state in (S.C_FINISHED, S.C_FAILED, S.C_STOPPED):
                state.remove_listener(on_change)
                renderer.finish(view)
            else:
                renderer.update(view)

        st.add_listener(on_change)

    def detach(self) -> None:
        """Stop showing panels for API-started clusters (``%unload_ext``)."""
        remove_start_listener(self._api_cluster_started)

    # -- %%tfos_cluster -------------------------------------------------------------
    @no_var_expand
    @magic_arguments()
    @argument("--workers", type=int, default=None, metavar="N",
              help="training nodes; the first is the chief (default: TFOSMagics.default_workers)")
    @argument("--ps", type=int, default=0, metavar="M", help="parameter-server nodes (extra)")
    @argument("--evaluator", action="store_true", help="add an evaluator node")
    @argument("--input-mode", choices=["spark", "tensorflow"], default=None,
              help="spark: the driver feeds --data to the nodes; tensorflow: the cell reads its own data "
              "(default: spark with --data, else tensorflow)")
    @argument("--data", metavar="VAR", help="a DataFrame (batch or streaming) or RDD in the notebook to feed (--input-mode spark)")
    @argument("--epochs", type=int, default=None, metavar="E", help="epochs to feed; also args.epochs (default 1)")
    @argument("--args", metavar="EXPR",
              help="a dict or namespace (a Python expression, quoted if it has spaces) passed as `args`")
    @argument("--tensorboard", action="store_true", help="start TensorBoard on the chief")
    @argument("--logdir", metavar="DIR", help="TensorBoard log directory (ctx.log_dir on the nodes)")
    @argument("--name", default="_tfos", help="notebook variable for the cluster's handle (default _tfos)")
    @argument("--background", action="store_true", help="return at once; the handle's wait() waits")
    @argument("--retries", type=int, default=0, metavar="N",
              help="start the cluster again up to N times when a node fails (resume from your checkpoints)")
    @argument("--timeout", type=float, default=None, metavar="SECONDS",
              help="stop the cluster if the run takes longer (default: TFOSMagics.timeout)")
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
        ``metrics``, ``tensorboard_url``, ``logs()``.

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
        ns = self.shell.user_ns
        workers = self.default_workers if opts.workers is None else opts.workers
        if workers < 1:
            raise _usage(f"--workers must be at least 1, got {workers}")
        if opts.ps < 0:
            raise _usage(f"--ps must be 0 or more, got {opts.ps}")
        if opts.retries < 0:
            raise _usage(f"--retries must be 0 or more, got {opts.retries}")
        timeout = self.timeout if opts.timeout is None else opts.timeout
        if timeout is not None and timeout <= 0:
            raise _usage(f"--timeout must be more than 0 seconds, got {timeout:g}")
        name = opts.name
        if not name.isidentifier() or keyword.iskeyword(name):
            raise _usage(f"--name {name}: not a valid Python variable name")
        if name in ns and not isinstance(ns[name], ClusterHandle):
            raise _usage(
                f"--name {name}: `{name}` is already defined in the notebook (type {type(ns[name]).__name__}); "
                "choose another --name"
            )
        mode = opts.input_mode or ("spark" if opts.data else "tensorflow")
        data = None
        if mode == "spark":
            if not opts.data:
                raise _usage("--input-mode spark needs --data VAR (a DataFrame or RDD to feed)")
            data = self._data(opts.data)
            if getattr(data, "isStreaming", False) and opts.epochs is not None:
                raise _usage(f"--epochs does not apply to a streaming --data {opts.data}: a stream is one "
                             "unbounded epoch, fed until the query ends or the cluster is stopped")
        elif opts.data:
            raise _usage("--data is fed only with --input-mode spark")
        args = self._args(opts.args, opts.epochs)
        epochs = args.epochs
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise _usage(f"--epochs must be at least 1, got {epochs!r}")
        nodes = workers + opts.ps + (1 if opts.evaluator else 0)
        try:
            fn, _ = build(cell, ns, name)
        except CellError as exc:
            raise _usage(str(exc)) from None

        old = self.handles.get(name)
        if old is not None and not old.done:
            print(f"tfos_nb: stopping the running cluster {name} first")
            old.shutdown()
        sc = self._spark(nodes)
        env = self._env()
        handle = ClusterHandle(name, sc=sc, fn=fn, args=args, workers=workers, ps=opts.ps,
                               evaluator=opts.evaluator, data=data, epochs=epochs, tensorboard=opts.tensorboard,
                               log_dir=opts.logdir, env=env, timeout=timeout, background=opts.background,
                               retries=opts.retries)
        self.handles[name] = handle
        ns[name] = handle
        if opts.tensorboard:  # the panel's TensorBoard tab and link: the proxy route, while the chief's TensorBoard runs
            from .. import tensorboard as tb

            handle.add_observer(tb.ClusterRoute())
        if opts.background:
            self._panel_in_background(handle)
        handle.start()
        if opts.background:
            print(f"tfos_nb: {name} runs in the background ({nodes} nodes); {name}.wait() waits for it, "
                  f"%tfos_status shows it, %tfos_shutdown {name} stops it")
            return
        self._follow(handle)
        try:
            handle.wait()
        except ClusterFailed as exc:
            cause = exc.__cause__
            if isinstance(cause, RuntimeError) and str(cause).startswith("not enough executors"):
                raise _usage(str(cause)) from None
            raise

    # %%tfos_parallel: N independent runs (a sweep); see _parallel.py
    tfos_parallel = cell_magic(_parallel.tfos_parallel)

    # -- helpers of %%tfos_cluster ----------------------------------------------------
    def _data(self, var: str) -> Any:
        ns = self.shell.user_ns
        if var not in ns:
            raise _usage(f"--data {var}: no such variable in the notebook")
        value = ns[var]
        if type(value).__module__.startswith("pyspark.sql.connect"):
            raise _usage(f"--data {var}: {CONNECT_MSG}")
        try:
            from pyspark import RDD
            from pyspark.sql import DataFrame
        except ImportError:  # pragma: no cover - pyspark is a dependency
            raise _usage("--data needs pyspark installed") from None
        if not isinstance(value, (DataFrame, RDD)):
            raise _usage(f"--data {var}: expected a Spark DataFrame or RDD, got {type(value).__name__}")
        return value

    def _args(self, expr: str | None, epochs: int | None) -> Namespace:
        values: dict[str, Any] = {}
        if expr and len(expr) >= 2 and expr[0] == expr[-1] and expr[0] in "'\"":
            expr = expr[1:-1]  # IPython's argument splitter keeps the quotes
        if expr:
            try:
                given = eval(expr, self.shell.user_ns)  # noqa: S307 - the user's own notebook expression
            except Exception as exc:  # noqa: BLE001
                raise _usage(f"--args {expr}: {type(exc).__name__}: {exc}") from None
            if isinstance(given, dict):
                values = dict(given)
            elif isinstance(given, (types.SimpleNamespace, argparse.Namespace, Namespace)):
                values = dict(vars(given))
            else:
                raise _usage(f"--args must be a dict or a namespace, got {type(given).__name__}")
            bad = [k for k in values if not isinstance(k, str) or not k.isidentifier()]
            if bad:
                raise _usage(f"--args keys must be names usable as attributes, got {bad[0]!r}")
        if epochs is not None:
            values["epochs"] = epochs
        values.setdefault("epochs", 1)
        return Namespace(values)  # args.epochs and args["epochs"], like the dict or namespace the user gave

    def _spark(self, nodes: int) -> Any:
        from ..runtime.driver.start import available_slots

        try:
            sc = find_spark_context(self.shell.user_ns)
            if sc is None:
                print(embedded_notice(self.spark_master_local.format(n=nodes)))
                spark = start_embedded(nodes, self.spark_master_local)
                self.shell.user_ns.setdefault("spark", spark)
                return spark.sparkContext
        except SparkUnusable as exc:
            raise _usage(str(exc)) from None
        slots, executors = available_slots(sc)
        if slots < nodes:
            expected = expected_slots(sc)
            if expected is not None and expected < nodes:
                raise _usage(
                    f"{nodes} nodes need {nodes} Spark task slots; this Spark application has {expected} "
                    f"({sc.master}): lower --workers/--ps, or give Spark more executors"
                )
        return sc

    def _env(self) -> dict[str, str]:
        env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
        if self.tf_threads > 0:
            env.update(
                TF_NUM_INTRAOP_THREADS=str(self.tf_threads),
                TF_NUM_INTEROP_THREADS=str(self.tf_threads + 1),
                OMP_NUM_THREADS=str(self.tf_threads),
            )
        return env

    def _renderer(self, background: bool, on_stop: Any = None) -> Any:
        from ..widgets import choose_renderer, make_renderer

        kind = choose_renderer(self.renderer, self.shell)
        if background and kind == "text":
            return None  # lines printed from another thread would land in whatever cell runs then
        try:
            # a blocking cell's final table is a new output at its end (its own thread), shown by every front-end
            return make_renderer(kind, on_stop=on_stop, stop_hint="" if background else BLOCKING_STOP_HINT,
                                 new_final_output=not background)
        except ImportError as exc:
            if self.renderer == "widget":
                raise _usage(str(exc)) from None
            return make_renderer("html", new_final_output=not background)

    def _panel_in_background(self, handle: ClusterHandle) -> None:
        """A --background cell's panel: fed by the handle's observer (no Spark progress: no poller thread)."""
        renderer = self._renderer(True, on_stop=lambda: handle.stop("stopped from the panel"))
        if renderer is None:
            return
        renderer.start(handle.name)

        def observe(view: Any, final: bool) -> None:
            if final:
                renderer.finish(view)
            else:
                renderer.update(view)

        handle.add_observer(observe)

    def _follow(self, handle: ClusterHandle) -> None:
        """Watch a blocking cell's run from the main thread: print output, render the panel, take ■."""
        renderer = self._renderer(False)
        if renderer is not None:
            renderer.start(handle.name)
        progress = None
        next_progress = 0.0
        tensorboard = None

        def render(final: bool = False) -> None:
            nonlocal progress, next_progress
            if renderer is None:
                return
            view = handle.final_status() if final else handle.status()
            if view is None:
                return
            now = time.monotonic()
            if final or now >= next_progress:
                next_progress = now + PROGRESS_INTERVAL_S
                numbers = job_progress(handle.sc, job_groups(view.job_group, view.feed_epoch))
                if numbers is not None:
                    progress = JobProgress(*numbers)
            if final:
                renderer.finish(view, progress)
            else:
                renderer.update(view, progress)

        try:
            while not handle.join(0.1):
                self._drain(handle)
                if tensorboard is None and handle.tensorboard_url and handle.status() is not None:
                    from .. import tensorboard as tb

                    tensorboard = handle.tensorboard_url  # the node's own address: seldom reachable from a browser
                    where = tb.proxy_url_from_env(tensorboard) or \
                        f"<Jupyter base URL>/{tb.proxy_path(handle.status().cluster_id)}"
                    print(f"tfos_nb: TensorBoard of {handle.name}: {where} (on the chief at {tensorboard})")
                render()
        except KeyboardInterrupt:
            print(f"tfos_nb: interrupted; stopping cluster {handle.name}", file=sys.stderr)
            handle.stop("interrupted")
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            while not handle.done and time.monotonic() < deadline:
                try:
                    handle.join(0.1)
                except KeyboardInterrupt:
                    continue  # a second ■ must not cut the teardown short
            self._drain(handle)
            render(final=True)
            raise
        self._drain(handle)
        render(final=True)

    def _drain(self, handle: ClusterHandle) -> None:
        if handle.lines is None:
            return
        out = []
        while True:
            try:
                out += handle.lines.get_nowait()
            except Exception:  # noqa: BLE001 - queue.Empty
                break
        if not self.show_native_logs:
            out = quiet_lines(out)
        if out and self.log_lines:
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()

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
            raise _usage("give a cluster name or --all")
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
            raise _usage(f"--tail must be 0 or more, got {opts.tail}")
        try:
            logs = h.logs(opts.node, opts.tail)
        except KeyError as exc:
            raise _usage(str(exc.args[0])) from None
        for label, lines in logs.items():
            for text in lines:
                print(f"[{label}] {text}")

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
        driver for DIR (TensorBoard's own launcher; an instance for the same DIR is
        reused) so that runs can be looked at after training; it is stopped with the
        kernel.  Only the Jupyter server's ``tfos_nb`` extension serves the route, to
        users logged in to that server; when the route does not answer, the frame
        says so and what to do.  With ``TENSORBOARD_PROXY_URL`` set (a front-end's own
        proxy, e.g. ``/proxy/%PORT%/``) the frame uses it, as TensorBoard's
        ``%tensorboard`` does; terminal IPython prints the URLs.
        """
        from IPython.display import HTML, display

        from .. import tensorboard as tb

        opts = parse_argstring(self.tfos_tensorboard, line)
        if bool(opts.name) == bool(opts.logdir):
            raise _usage("give a cluster name (its cell ran with --tensorboard) or --logdir DIR, not both")
        if opts.height <= 0:
            raise _usage(f"--height must be positive, got {opts.height}")
        if opts.logdir:
            outcome = tb.start_local(opts.logdir) if os.path.isdir(opts.logdir) else None
            if outcome is None:
                raise _usage(f"--logdir {opts.logdir}: no such directory")
            if not isinstance(outcome, tb.LocalTensorBoard):
                raise _usage(f"TensorBoard did not start for {opts.logdir}: {outcome}")
            self._local_tensorboards[outcome.cluster_id] = outcome
            path, node_url = outcome.path, outcome.url
        else:
            h = self.handles[self._known(opts.name)]
            if h.done:
                raise _usage(f"{opts.name} has ended and its TensorBoard with it: use --logdir DIR")
            view, url = h.status(), h.tensorboard_url
            if view is None or not url:
                raise _usage(f"{opts.name} has no TensorBoard: run its cell with --tensorboard, or use --logdir DIR")
            path, node_url = tb.register(view.cluster_id, url), url
            h.add_observer(lambda view, final, cid=view.cluster_id: final and tb.withdraw(cid))
        frame, text = tb.frontend_output(tb.frontend(self.shell), path, node_url, height=opts.height)
        if frame:
            display(HTML(frame))
        print(text)

    def _known(self, name: str) -> str:
        if name not in self.handles:
            known = ", ".join(self.handles) or "none"
            raise _usage(f"no cluster named {name}; clusters: {known}")
        return name

    def shutdown_all(self) -> None:
        """Stop every cluster of this kernel, and the TensorBoards it started (also run at kernel exit)."""
        from .. import tensorboard as tb

        for local in list(self._local_tensorboards.values()):
            tb.stop_local(local)
        self._local_tensorboards.clear()
        for h in list(self.handles.values()):
            h.stop("kernel shutdown")
        for h in list(self.handles.values()):
            h.join(15)
