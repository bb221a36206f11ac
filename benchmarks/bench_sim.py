#!/usr/bin/env python
"""B6 -- the driver at scale: ``TFCluster.run`` and ``shutdown()`` of 64 to 512 simulated nodes (``sim_nodes.py``).

The real driver (control server, controller, state, reservation, shutdown) in this process, on a local Spark
session; the launch stage replaced by :class:`sim_nodes.SimLaunch`, whose nodes, 8 processes of threads, register,
heartbeat twice a second with a step every 50-200 ms, and stop when told.  For each size: the time from ``run()``
until it returned (every node registered, the spec sent, every node running), the driver process's CPU (% of one
core) and RSS over ``--steady`` s of training, the round trip of the heartbeats sent in that window as the nodes saw
it (p50, p99: the driver decodes, records and answers each), and ``shutdown()``'s time; then the growth per node.

    .venv/bin/python benchmarks/bench_sim.py --nodes 64,128,256,512

Writes ``benchmarks/results/b6-latest.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from unittest import mock

import harness
import sim_nodes


def noop(args, ctx):  # never runs: the simulated nodes do not run the function
    pass


MLFLOW: dict | None = None  # --mlflow: the run's experiment tracking (TFCluster.run's mlflow=)


def run_simulated(sc, n: int):
    """``TFCluster.run`` of ``n`` nodes whose launch stage is :class:`sim_nodes.SimLaunch` (no executor slots
    waited for); its host processes are killed when the run fails."""
    from tfos_nb import TFCluster
    from tfos_nb.runtime.driver import job as job_module
    from tfos_nb.runtime.driver.launch import start as start_module

    sim_nodes.SimLaunch.started = []
    with mock.patch.object(start_module, "Launch", sim_nodes.SimLaunch), \
            mock.patch.object(job_module.DriverJob, "wait_for_slots", lambda self, needed, timeout: None):
        try:
            return TFCluster.run(sc, noop, {}, n, num_ps=0, input_mode=TFCluster.InputMode.TENSORFLOW,
                                 master_node="chief", reservation_timeout=60,
                                 mlflow=MLFLOW or False)
        except BaseException:
            sim_nodes.SimLaunch.kill_all()
            raise


def render(cluster, times: int = 20) -> tuple[float, float, float]:
    """The median ms of a snapshot of the state and of the panel's model and HTML made from it, and the HTML's kB."""
    import statistics

    from tfos_nb.widgets import panel_html, panel_model

    snaps, panels = [], []
    for _ in range(times):
        t0 = time.perf_counter()
        view = cluster.state.snapshot()
        t1 = time.perf_counter()
        html = panel_html(panel_model(view))
        panels.append(time.perf_counter() - t1)
        snaps.append(t1 - t0)
    return 1000 * statistics.median(snaps), 1000 * statistics.median(panels), len(html.encode()) / 1000


def assignments(n: int, partitions: int = 4000) -> float:
    """Feeding tasks' requests handled a second: a controller of ``n`` running nodes (InputMode.SPARK, in this
    process, no sockets) hands out an epoch of ``partitions`` partitions, each asked for and released as a feeding
    task does (FeedAssign, FeedRelease)."""
    from tfos_nb.runtime.driver.control.controller import new_cluster
    from tfos_nb.runtime.driver.options import JobOptions
    from tfos_nb.runtime.protocol import messages

    ctl = new_cluster([("chief", 0)] + [("worker", i) for i in range(n - 1)], {},
                      JobOptions(name="b6", num_gpus=0, heartbeat_timeout=600), input_mode_spark=True,
                      tensorboard=False, log_dir=None)
    for i in range(n):
        ctl.handle(messages.Register(node=i, host="127.0.0.1", port=4000 + i, executor_id=str(i), pid=1))
    for i in range(n):
        ctl.handle(messages.AwaitSpec(node=i))
        ctl.handle(messages.Heartbeat(node=i, state="running", data_port=5000 + i))
    epoch = ctl.open_epoch(remaining=0)
    ctl.set_feed_tasks(epoch, partitions)
    t0 = time.perf_counter()
    for p in range(partitions):
        reply = ctl.handle(messages.FeedAssign(partition=p, gen=epoch, host="127.0.0.1", executor_id=str(p % n),
                                               mode="train"))
        node = messages.FeedAssignment.from_dict(reply.body).node
        ctl.handle(messages.FeedRelease(partition=p, gen=epoch, node=node, rows=64))
    return partitions / (time.perf_counter() - t0)


def history_memory(n: int) -> tuple[float, int]:
    """The metric history's memory (MB, tracemalloc) and rows once every node reported past what it keeps: the
    chief 100,000 steps, each other node 1,000 more than its share (reports as the simulated nodes send them)."""
    import tracemalloc

    from tfos_nb.runtime.driver.control import state as cluster_state
    from tfos_nb.runtime.protocol.bodies import BeatReport

    roles = [("chief", 0)] + [("worker", i) for i in range(n - 1)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        st = cluster_state.ClusterState("b6", "b6", roles)
        for node in st.nodes:
            steps = 100_000 if node.index == 0 else node.history.maxlen + 1_000
            for first in range(0, steps, 500):
                st.record_reports(node, [BeatReport(step=k, time=1e9 + k / 8, metrics={"loss": 1.0 / k, "accuracy": 0.5},
                                                    times={"wall": k / 8, "step": 0.9 * k / 8, "input": 0.1 * k / 8,
                                                           "cpu": 0.5 * k / 8})
                                         for k in range(first + 1, min(first + 501, steps + 1))])
        used = tracemalloc.get_traced_memory()[0] - base
        rows = sum(len(node.history) for node in st.nodes)
    finally:
        tracemalloc.stop()
    return used / 1e6, rows


def history_memory_apart(n: int) -> tuple[float, int]:
    """:func:`history_memory` in a process of its own: its hundreds of MB do not stay in this one's RSS."""
    import subprocess

    code = f"import json, bench_sim; print(json.dumps(bench_sim.history_memory({n})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=harness.HERE, capture_output=True, text=True, check=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": harness.ROOT})
    mb, rows = json.loads(out.stdout.strip().splitlines()[-1])
    return mb, rows


class Batches:
    """MlflowClient.log_batch, counted: calls, metrics, and the seconds they took (the tracking server's load)."""

    def __init__(self) -> None:
        self.calls, self.metrics, self.seconds = 0, 0, 0.0

    def patch(self):
        from mlflow.tracking import MlflowClient

        real = MlflowClient.log_batch

        def log_batch(client, run_id, metrics=(), *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(client, run_id, metrics, *args, **kwargs)
            finally:
                self.calls += 1
                self.metrics += len(metrics)
                self.seconds += time.perf_counter() - t0

        return mock.patch.object(MlflowClient, "log_batch", log_batch)


def one_size(sc, n: int, steady: float) -> dict[str, float]:
    import contextlib

    import psutil

    me = psutil.Process()
    batches = Batches()
    tracked = batches.patch() if MLFLOW else contextlib.nullcontext()
    with tracked:
        return _one_size(sc, n, steady, me, batches)


def _one_size(sc, n: int, steady: float, me, batches: Batches) -> dict[str, float]:
    t0 = time.perf_counter()
    cluster = run_simulated(sc, n)
    up = time.perf_counter() - t0
    try:
        time.sleep(2.0)  # a benchmark's settling time: the first reports' burst passes
        c0, w0, since = sum(me.cpu_times()[:2]), time.perf_counter(), time.time()
        time.sleep(steady)
        cpu = 100.0 * (sum(me.cpu_times()[:2]) - c0) / (time.perf_counter() - w0)
        until = time.time()
        rss = me.memory_info().rss / 2**20
        snapshot_ms, panel_ms, panel_kb = render(cluster)
        t1 = time.perf_counter()
    finally:
        snapshots = []  # what shutdown() asks of the state while every node heartbeats (each a copy of all nodes)
        take = cluster.state.snapshot
        cluster.state.snapshot = lambda: (snapshots.append(1), take())[1]
        try:
            cluster.shutdown(timeout=120)
        finally:
            del cluster.state.snapshot
    down = time.perf_counter() - t1
    rtts, errors = [], []
    try:
        for proc in sim_nodes.SimLaunch.started:  # told to stop by shutdown(): they end within a heartbeat
            out, _ = proc.communicate(timeout=60)
            last = out.strip().splitlines()[-1] if out.strip() else "{}"
            stats = json.loads(last)
            rtts += [rtt for sent, rtt in stats.get("rtts", []) if since <= sent <= until]  # the steady window's
            errors += stats.get("errors", [])
    finally:
        sim_nodes.SimLaunch.kill_all()
    rtts.sort()
    states = sorted({node.state for node in cluster.nodes})
    steps = sum(node.step or 0 for node in cluster.nodes)
    history = len(cluster.state.history())
    return {"nodes": n, "run s": up, "driver cpu %": cpu, "driver rss MiB": rss,
            "rtt p50 ms": 1000 * rtts[len(rtts) // 2] if rtts else float("nan"),
            "rtt p99 ms": 1000 * rtts[int(len(rtts) * 0.99)] if rtts else float("nan"),
            "heartbeats": len(rtts), "steps": steps, "snapshot ms": snapshot_ms, "panel ms": panel_ms,
            "panel kB": panel_kb, "history rows": history, "shutdown s": down,
            "shutdown snapshots": len(snapshots), "node errors": len(errors),
            "mlflow calls": batches.calls, "mlflow metrics": batches.metrics, "mlflow s": batches.seconds,
            "states": " ".join(states), "first error": errors[0] if errors else ""}


def failure(sc, n: int, after: float) -> dict[str, float]:
    """One node (the last worker) fails ``after`` s into training: the time from its failure's heartbeat leaving
    it until the driver's state names it failed, and until ``shutdown()`` raised that error (the notebook's
    message), each from the node's send."""
    options = dict(sim_nodes.SimLaunch.options)
    sim_nodes.SimLaunch.options = {**options, "fail_node": n - 1, "fail_after": after}
    try:
        cluster = run_simulated(sc, n)
        deadline = time.monotonic() + after + 60
        while cluster.status().state != "failed" and time.monotonic() < deadline:
            time.sleep(0.005)  # polling the state, as the panel does: the benchmark's resolution
        named = time.time()
        error = ""
        try:
            cluster.shutdown(timeout=60)
        except Exception as exc:
            error = str(exc).splitlines()[0]
        raised = time.time()
        failed = []
        for proc in sim_nodes.SimLaunch.started:
            out, _ = proc.communicate(timeout=60)
            failed += json.loads(out.strip().splitlines()[-1]).get("failed", [])
    finally:
        sim_nodes.SimLaunch.options = options
        sim_nodes.SimLaunch.kill_all()
    sent = min(failed) if failed else float("nan")
    return {"failure named s": named - sent, "failure raised s": raised - sent, "failure": error}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--nodes", default="64,128,256,512")
    p.add_argument("--steady", type=float, default=10.0, help="seconds of training over which the CPU is measured")
    p.add_argument("--processes", type=int, default=8, help="processes hosting the simulated nodes")
    p.add_argument("--mlflow", action="store_true",
                   help="track each run in MLflow (a SQLite store in a temporary folder): its log_batch calls")
    p.add_argument("--out", default=os.path.join(harness.HERE, "results", "b6-latest.md"))
    opts = p.parse_args(argv)
    sim_nodes.SimLaunch.processes = opts.processes
    global MLFLOW
    if opts.mlflow:
        import tempfile

        store = tempfile.mkdtemp(prefix="tfos-b6-mlflow-")
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}/mlflow.db"
        import mlflow

        mlflow.create_experiment("b6", artifact_location=f"file://{store}/artifacts")  # not ./mlruns
        MLFLOW = {"experiment": "b6"}
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("tfos_nb-bench-sim")
             .config("spark.ui.enabled", "false").getOrCreate())
    rows = []
    try:
        for n in (int(x) for x in opts.nodes.split(",")):
            row = one_size(spark.sparkContext, n, opts.steady)
            row["assignments/s"] = assignments(n)
            row["history MB"], row["history rows kept"] = history_memory_apart(n)
            row.update(failure(spark.sparkContext, n, 2.0))
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        spark.stop()
    keys = ["nodes", "run s", "driver cpu %", "driver rss MiB", "rtt p50 ms", "rtt p99 ms", "heartbeats", "steps",
            "history rows", "snapshot ms", "panel ms", "panel kB", "assignments/s", "history rows kept", "history MB",
            "shutdown s", "failure named s", "failure raised s",
            "node errors", "states"] + (["mlflow calls", "mlflow metrics", "mlflow s"] if opts.mlflow else [])
    lines = ["B6 the driver at scale, simulated nodes — %s, %s cores, %s" % (harness.now_utc(), os.cpu_count(),
                                                                           platform.machine()), "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        dn = b["nodes"] - a["nodes"]
        lines += ["", "growth per node from %d to %d nodes: %s" % (a["nodes"], b["nodes"], ", ".join(
            "%s %+.4f" % (k, (b[k] - a[k]) / dn) for k in ("run s", "driver cpu %", "driver rss MiB", "rtt p99 ms",
                                                            "shutdown s")))]
    lines += ["", "the failure as shutdown() raised it: " + (rows[-1]["failure"] if rows else "")]
    errs = [r["first error"] for r in rows if r["first error"]]
    if errs:
        lines += ["", "first node error at each size that had one: " + "; ".join(errs)]
    lines += ["", "command: " + harness.command(argv)]
    harness.write_report("\n".join(lines) + "\n", opts.out)
    setting = "simulated nodes in %d processes, a step every 50-200 ms, heartbeats every 0.5 s, %g s steady" % (
        opts.processes, opts.steady)
    harness.write_runs(opts.out, "B6", [(f"{r['nodes']} nodes", "run 1", r) for r in rows],
                       {f"{r['nodes']} nodes": f"{r['nodes']} simulated nodes" for r in rows},
                       setting=setting, command_line=harness.command(argv))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
