#!/usr/bin/env python
"""B5 -- scale and memory: one epoch of 100k and of 1M rows × 784 float32 from Parquet, fed to 2 nodes.

The rows are written ONCE by this script (seeded synthetic 10-class data, in a child process, one
file of ``--rows-per-file`` rows at a time, row groups of 5,000 rows: never the whole array in
memory) to ``--cache-dir`` and reused by later runs.  A setting of R rows reads the first
R / rows-per-file files with ``spark.read.parquet`` -- one Spark partition per file, so both
settings feed partitions of the same size and only their number changes.

The DataFrame is NOT persisted anywhere: each measurement is one epoch, so a cache would be read
once and never again; and persisting 1M rows (≈3 GB) on the executors would put the data itself in
the executor JVMs' memory -- their RSS would then grow with the row count, the very thing B5
checks does not happen.  The feeding tasks read Parquet, Spark converts the rows to Arrow
(``mapInArrow``) and the Python workers send them to the nodes in batches of ``batch_rows`` (1,024).

Three modes (``--modes``), each one Spark application:

* ``numpy`` -- the node drains its feed into numpy (``feed.next_batch_arrays(128)``); the application's
  first epoch (``cluster.train(df, num_epochs=1)``, "cold": the executors' first Parquet scan, its code
  generation and JIT) is timed, then a second one ("warm": every later epoch of a job);
* ``fit``   -- the node trains the MLP 784-128-10 (Adam) under MultiWorkerMirroredStrategy with
  ``model.fit(feed.as_dataset(128, columns=(0, 1)), epochs=1)`` (B2's tfos_nb program), one epoch;
* ``spark`` -- Spark alone, the reference: a trivial Python stage on both executors (as tfos_nb's launch
  starts their Python workers), then the same rows through ``df.mapInArrow`` into float32 numpy slices of
  1,024 rows (what a feeding task does, minus sending them to a node), cold then warm; no tfos_nb.

rows/s = rows / wall time of ``cluster.train()`` (of the ``mapInArrow`` job for ``spark``); it starts
once both nodes are ready to read (their imports, the strategy and the model are built before), so it
holds the feed and, for ``fit``, the first step's tracing.

Memory: each measurement is a process of its own with its own Spark application (``local-cluster[2,1,3072]``),
so that every process's peak belongs to that measurement alone (a JVM's heap and a reused Python worker keep
their high-water mark for their lifetime; PySpark keeps its driver JVM, the py4j gateway, for the life of the
Python process, so one process per measurement is what gives each its own driver JVM).  ``memory.Sampler``
samples every process of the application every 0.2 s, by kind (the largest sampled RSS, the kernel's VmHWM
beside it); the driver's high-water mark is reset when the measurement starts.  The JVMs log every collection
(``-Xlog:gc``, ``memory.gc_by_kind``), so that a JVM's RSS growth can be told apart from data it keeps.

Run: ``bash benchmarks/run.sh b5`` or
``.venv-bench/bin/python benchmarks/bench_scale.py --rows 100000,1000000 --modes spark,numpy,fit --runs 1``.
Writes ``benchmarks/results/b5-latest.md``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import data
import harness
import model
from harness import median as med
from memory import MIB, Sampler, gc_by_kind, gc_log_option, heap_rows, kind_key, peak_rows, peaks_by_kind, reset_hwm
from model import build_model

FEATURES = 784
BATCH = 128
NODES = 2

log = logging.getLogger("bench")


# Node functions (shipped by cloudpickle; self-contained but for the model module, shipped by value)

def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def numpy_main(args, ctx):
    """Drain this node's share into numpy (``next_batch_arrays``)."""
    import json
    import os
    import time

    import numpy as np

    feed = ctx.get_data_feed()
    ready = {"rss": args["vm"]("VmRSS")}
    with open(os.path.join(args["out_dir"], "ready-%d.json" % ctx.worker_num), "w") as f:
        json.dump(ready, f)
    import pyarrow as pa

    n, t_first, t0, i, queued = 0, None, time.time(), 0, 0
    while not feed.should_stop():
        cols = feed.next_batch_arrays(args["batch"])
        if not cols:
            break
        x = np.asarray(cols[0], dtype=np.float32)
        if t_first is None:
            t_first = time.time()
        n += x.shape[0]
        i += 1
        if i % 50 == 0:  # the rows waiting in this node's queue (the hub is tfos_nb's; read for the report only)
            queued = max(queued, sum(feed._hub.queued_rows().values()))
    out = {"rows": n, "first": t_first or t0, "end": time.time(), "ready_rss": ready["rss"],
           "hwm": args["vm"]("VmHWM"), "rss_end": args["vm"]("VmRSS"), "queued_rows_max": queued,
           "arrow_pool_max": pa.default_memory_pool().max_memory() >> 20}
    with open(os.path.join(args["out_dir"], "node-%d.json" % ctx.worker_num), "w") as f:
        json.dump(out, f)


def fit_main(args, ctx):
    """B2's tfos_nb program: the MLP 784-128-10 under MultiWorkerMirroredStrategy, ``model.fit`` over ``as_dataset``."""
    import json
    import os
    import time

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = args["build_model"]("mlp")
    feed = ctx.get_data_feed()
    ready = {"rss": args["vm"]("VmRSS")}
    with open(os.path.join(args["out_dir"], "ready-%d.json" % ctx.worker_num), "w") as f:
        json.dump(ready, f)
    ds = feed.as_dataset(batch_size=args["batch"], columns=(0, 1))

    class Steps(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # do not make Keras wait for each step's logs
            self.steps, self.t_warm = 0, None

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == 50:
                self.t_warm = time.time()

    steps = Steps()
    t_fit = time.time()
    hist = model.fit(ds, epochs=1, verbose=0, callbacks=[steps])
    t_end = time.time()
    out = {"fit": t_end - t_fit, "steps": steps.steps, "first": t_fit, "end": t_end, "warm": steps.t_warm,
           "accuracy": float(hist.history["accuracy"][-1]), "ready_rss": ready["rss"], "hwm": args["vm"]("VmHWM")}
    with open(os.path.join(args["out_dir"], "node-%d.json" % ctx.worker_num), "w") as f:
        json.dump(out, f)


# One measurement = one Spark application

def measure(opts, files: list[str], rows: int, mode: str) -> dict:
    tmp = tempfile.mkdtemp(prefix="tfos-b5-")
    try:
        return _measure(opts, files[:rows // opts.rows_per_file], rows, mode, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(opts, paths: list[str], rows: int, mode: str, tmp: str) -> dict:
    file_bytes = max(os.path.getsize(p) for p in paths)
    gc_dir = os.path.join(tmp, "gc")
    os.makedirs(gc_dir)
    harness.ship_by_value(model)  # fit_main's build_model
    sampler = Sampler(opts.interval)
    reset_hwm()  # the driver's VmHWM from here on
    sampler.start()
    spark = None
    try:
        spark = harness.spark_session(opts.master, "tfos_nb-bench-scale", conf={
            # one partition per file: no split (files < maxPartitionBytes), no packing (two files > it)
            "spark.sql.files.maxPartitionBytes": str(int(file_bytes * 1.5)),
            "spark.driver.extraJavaOptions": gc_log_option(gc_dir),
            "spark.executor.extraJavaOptions": gc_log_option(gc_dir)},
            executor_env={**harness.NODE_ENV, "TF_USE_LEGACY_KERAS": "1",
                          **dict(kv.split("=", 1) for kv in opts.executor_env)})
        df = spark.read.parquet(*paths)  # not cached: read from Parquet by the feeding tasks
        parts = df.rdd.getNumPartitions()
        if parts != len(paths):
            raise RuntimeError("expected one partition per file (%d), got %d" % (len(paths), parts))
        if mode == "spark":
            res = spark_alone(spark, df, rows)
        else:
            res = feed_nodes(spark, df, rows, mode, tmp)
        sampler.stop()  # the peaks are the measurement's; the application's end is not sampled
    finally:
        if spark is not None:
            spark.stop()  # the JVMs exit: their GC logs are complete
        sampler.stop()
    procs = sampler.report()
    res.update({"rows": rows, "mode": mode, "procs": procs, "samples": sampler.samples, "file MiB": file_bytes / MIB,
                "gc": gc_by_kind(gc_dir, procs)})
    return res


def feed_nodes(spark, df, rows: int, mode: str, tmp: str) -> dict:
    """tfos_nb: 2 nodes running ``mode``'s program, fed ``df`` by ``cluster.train`` (numpy: twice, cold then warm)."""
    from tfos_nb import TFCluster

    out_dir = os.path.join(tmp, "out")
    os.makedirs(out_dir)
    args = {"batch": BATCH, "out_dir": out_dir, "vm": _vm, "build_model": build_model}
    fn = numpy_main if mode == "numpy" else fit_main
    t_run = time.perf_counter()
    cluster = TFCluster.run(spark.sparkContext, fn, args, NODES, num_ps=0,
                            input_mode=TFCluster.InputMode.SPARK, master_node="chief")
    warm = None
    try:
        deadline = time.monotonic() + 300
        while len([f for f in os.listdir(out_dir) if f.startswith("ready-")]) < NODES:
            if time.monotonic() > deadline:
                raise TimeoutError("the nodes were not ready to read in 300 s")
            time.sleep(0.05)
        t_ready = time.perf_counter()
        t0, w0 = time.perf_counter(), time.time()
        cluster.train(df, num_epochs=1)
        wall = time.perf_counter() - t0
        fed = dict(cluster.last_feed)
        if mode == "numpy":  # the same rows again in the same application: an epoch after the first
            t0 = time.perf_counter()
            cluster.train(df, num_epochs=1)
            warm = time.perf_counter() - t0
            if cluster.last_feed["rows"] != rows:
                raise RuntimeError("warm epoch fed %s rows, expected %d" % (cluster.last_feed, rows))
    finally:
        cluster.shutdown()
    nodes = [json.load(open(os.path.join(out_dir, "node-%d.json" % i))) for i in range(NODES)]
    log.info("nodes: %s", nodes)
    if fed["rows"] != rows:
        raise RuntimeError("fed %s rows, expected %d" % (fed, rows))
    res = {"wall": wall, "rows/s": rows / wall, "ready s": t_ready - t_run, "nodes": nodes}
    if mode == "numpy":
        res["node rows"] = [n["rows"] for n in nodes]
        res["first batch s"] = min(n["first"] for n in nodes) - w0
        res["warm wall"], res["warm rows/s"] = warm, rows / warm
    else:
        res["node steps"] = [n["steps"] for n in nodes]
        res["fit s"] = max(n["fit"] for n in nodes)
        res["accuracy"] = nodes[0]["accuracy"]
        steady_nodes = [n for n in nodes if n.get("warm")]
        if steady_nodes:  # steps after the first 50 (tracing, the first collectives): steady rows/s of the 2 nodes
            steady = [(n["end"] - n["warm"], (n["steps"] - 50) / n["steps"]) for n in steady_nodes]
            res["steady rows/s"] = rows * statistics.mean(f for _, f in steady) / max(t for t, _ in steady)
    return res


def _noop(it):
    yield from it


def _ceiling(it):
    """mapInArrow function: each Arrow batch's features -> float32 numpy (n, 784) in slices of 1024 rows, no node."""
    import pyarrow as pa

    n = 0
    for b in it:
        col = b.column(0)
        for off in range(0, len(col), 1024):
            x = col.slice(off, 1024).flatten().to_numpy(zero_copy_only=False).reshape(-1, 784)
            n += x.shape[0]
    yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])


def spark_alone(spark, df, rows: int) -> dict:
    """The reference, in a fresh application: a trivial Python stage on the 2 executors (tfos_nb's launch starts
    their Python workers the same way), then ``df.mapInArrow`` of the features into float32 numpy slices (the
    JVM's Parquet decode and rows -> Arrow, the Python workers' Arrow -> numpy: a feeding task's work minus sending
    to a node), the application's first scan ("cold") and a second one ("warm")."""
    spark.range(0, NODES, numPartitions=NODES).mapInArrow(_noop, "id long").collect()
    walls = []
    for _ in range(2):
        t0 = time.perf_counter()
        n = sum(r["n"] for r in df.select("features").mapInArrow(_ceiling, "n long").collect())
        walls.append(time.perf_counter() - t0)
        if n != rows:
            raise RuntimeError("mapInArrow saw %d rows, expected %d" % (n, rows))
    return {"wall": walls[0], "rows/s": rows / walls[0], "warm wall": walls[1], "warm rows/s": rows / walls[1]}


PROGRAMS = {"spark": "Spark alone: `mapInArrow` → numpy, no nodes", "numpy": "drain into numpy (`next_batch_arrays(128)`)",
            "fit": "`model.fit` MLP 784-128-10, MWMS"}


def tables(results: dict, opts) -> str:
    lines = []
    small, big = min(opts.rows), max(opts.rows)

    def rate_cells(rows: int, mode: str, key: str, wall_key: str) -> list[str]:
        rs = [r for r in results.get((rows, mode), []) if r.get(key)]
        if not rs:
            return ["–", ""]
        rate = med([r[key] for r in rs])
        base = med([r[key] for r in results.get((small, mode), []) if r.get(key)])
        spread = "" if len(rs) == 1 else " (%s–%s)" % (f"{min(r[key] for r in rs):,.0f}", f"{max(r[key] for r in rs):,.0f}")
        return ["%s%s in %.1f s" % (f"{rate:,.0f}", spread, med([r[wall_key] for r in rs])),
                "%.2f×" % (rate / base) if rows != small and base else ""]

    lines += ["### Throughput (rows/s = rows / the epoch's wall: `cluster.train()`, or Spark's `mapInArrow` job; "
              "median of %d)" % opts.runs, "",
              "The application's first epoch is cold (the executors' first Parquet scan: class loading, code generation, "
              "JIT); an epoch after it is warm, as every later epoch of a job.", "",
              "| program | rows | first epoch: rows/s | 1M vs 100k | later epoch: rows/s | 1M vs 100k | other |",
              "|---|---|---|---|---|---|---|"]
    for mode in opts.modes:
        for rows in opts.rows:
            rs = results.get((rows, mode), [])
            if not rs:
                lines.append("| %s | %s | FAILED | | | | |" % (PROGRAMS[mode], f"{rows:,}"))
                continue
            other = []
            if mode == "fit":
                other.append("steady (after step 50) %s rows/s" % f"{med([r.get('steady rows/s') for r in rs]) or 0:,.0f}")
                other.append("fit %.1f s, accuracy %.3f" % (med([r["fit s"] for r in rs]), med([r["accuracy"] for r in rs])))
            if mode == "numpy":
                other.append("first batch %.1f s after train()" % med([r["first batch s"] for r in rs]))
            if mode != "spark":
                other.append("nodes ready %.1f s after run()" % med([r["ready s"] for r in rs]))
            lines.append("| %s | %s | %s | %s | %s |" % (
                PROGRAMS[mode], f"{rows:,}", " | ".join(rate_cells(rows, mode, "rows/s", "wall")),
                " | ".join(rate_cells(rows, mode, "warm rows/s", "warm wall")), "; ".join(other)))
    gc_rows = [row for mode in opts.modes for row in heap_rows(
        mode, *([r.get("gc", {}) for r in results.get((rows, mode), [])] for rows in (small, big)))]
    if gc_rows:
        lines += ["", "### JVM heaps (MiB, from `-Xlog:gc`, %s → %s rows): the largest heap left after a collection "
                  "(an upper bound of what the JVM keeps live) and the largest committed heap (what its RSS follows)"
                  % (f"{small:,}", f"{big:,}"), "",
                  "| program | JVM | heap after a collection | committed heap | collections |", "|---|---|---|---|---|",
                  *gc_rows]
    for mode in opts.modes:
        lines += ["", "### Peak RSS (MiB), node program `%s`: largest sampled RSS (kernel high-water mark VmHWM); "
                  "median over runs of the largest process of each kind" % mode, "",
                  "| process | count | %s rows | %s rows | ratio |" % (f"{small:,}", f"{big:,}"), "|---|---|---|---|---|"]
        lines += peak_rows(*(results.get((rows, mode), []) for rows in (small, big)))
        nodes = [(rows, n) for rows in (small, big) for r in results.get((rows, mode), []) for n in r.get("nodes", [])]
        if nodes:
            lines += ["", "node processes (own /proc figures): RSS when ready to read → VmHWM at the end: " + "; ".join(
                "%s rows %.0f → %.0f MiB (+%.0f)" % (f"{rows:,}", n["ready_rss"] / MIB, n["hwm"] / MIB,
                                                    (n["hwm"] - n["ready_rss"]) / MIB) for rows, n in nodes)]
    return "\n".join(lines)


def per_batch_memory(results: dict, opts) -> str:
    """What a node holds per batch in flight, from the feed's constants and the measured rows."""
    import importlib

    feed_hub = importlib.import_module("tfos_nb.runtime.executor.feed.hub")
    q = feed_hub._QUEUE_BATCHES
    batch_rows = 1024  # cluster.train()'s default batch_rows
    row_bytes = FEATURES * 4 + 4
    per_batch = batch_rows * row_bytes
    lines = ["### Memory a node needs per batch in flight", "",
             "A fed row is %d bytes (784 float32 + an int32 label); a feeding task sends Arrow batches of `batch_rows` = %d rows "
             "(cluster.train's default) = %.2f MiB a batch.  The node's FeedHub bounds each epoch's queue at "
             "`_QUEUE_BATCHES` = %d batches (%.0f MiB) and holds at most two epochs' queues (the next epoch's feeders "
             "are in flight while this one is read): at most %.0f MiB of queued rows a node, whatever the row count."
             % (row_bytes, batch_rows, per_batch / MIB, q, q * per_batch / MIB, 2 * q * per_batch / MIB)]
    grow = [(r["rows"], r["mode"], n["hwm"] - n["ready_rss"]) for rs in results.values() for r in rs for n in r.get("nodes", [])]
    if grow:
        lines.append("Measured: a node's growth from ready-to-read to its high-water mark: " + "; ".join(
            "%s rows %s %.0f MiB" % (f"{rows:,}", mode, g / MIB) for rows, mode, g in grow) + ".")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="100000,1000000", help="comma-separated row counts (multiples of --rows-per-file)")
    p.add_argument("--modes", default="spark,numpy,fit",
                   help="spark: Spark alone (mapInArrow to numpy); numpy: nodes drain into numpy; fit: model.fit under MWMS")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--rows-per-file", type=int, default=25_000)
    p.add_argument("--cache-dir", default=os.environ.get("TFOS_BENCH_CACHE", os.path.join(tempfile.gettempdir(), "tfos-bench-cache")),
                   help="where the Parquet files are written once and reused")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--separation", type=float, default=0.105)
    p.add_argument("--master", default="local-cluster[2,1,3072]")
    p.add_argument("--interval", type=float, default=0.2, help="RSS sampling interval (s)")
    p.add_argument("--out", default=os.path.join(harness.HERE, "results", "b5-latest.md"))
    p.add_argument("--executor-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for the executors and the nodes they start (repeatable)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # ROWS:MODE -- one measurement, in this (child) process
    p.add_argument("--result", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    harness.setup_logging()
    opts.rows = [int(r) for r in opts.rows.split(",") if r]
    opts.modes = [m for m in opts.modes.split(",") if m]
    if any(r % opts.rows_per_file for r in opts.rows) or set(opts.modes) - {"spark", "numpy", "fit"}:
        p.error("--rows must be multiples of --rows-per-file; --modes among spark,numpy,fit")
    harness.prepare_env(legacy_keras=True)
    files = data.class_files(opts.cache_dir, max(opts.rows) // opts.rows_per_file, opts.rows_per_file, opts.seed,
                             opts.separation)
    if opts.one:
        rows, mode = opts.one.split(":")
        res = measure(opts, files, int(rows), mode)
        with open(opts.result, "w") as f:
            json.dump(res, f, default=str)
        return 0
    results: dict = {}
    failures = []
    t_all = time.perf_counter()
    for rep in range(opts.runs):
        for mode in opts.modes:
            for rows in (opts.rows if rep % 2 == 0 else opts.rows[::-1]):  # alternate the order per repetition
                try:
                    r = measure_in_child(argv, rows, mode)
                except Exception as e:
                    log.exception("%s %d rows failed", mode, rows)
                    failures.append("%s %d rows: %s: %s" % (mode, rows, type(e).__name__, str(e).strip().splitlines()[:1]))
                    continue
                log.info("%s %d rows: %.1f s, %.0f rows/s; peaks %s", mode, rows, r["wall"], r["rows/s"], ", ".join(
                    "%s %.0f" % (k, v["peak"] / MIB) for k, v in sorted(peaks_by_kind(r).items(), key=lambda kv: kind_key(kv[0]))))
                results.setdefault((rows, mode), []).append(r)
    total = time.perf_counter() - t_all
    head = ("B5 scale and memory — %s, %s cores, %s, %.1f GiB; one epoch of Parquet rows × %d float32 + int32 label "
            "(%d rows a file and a partition, %.0f MiB a file, snappy), not cached; %d nodes, batch %d, "
            "cluster.train's batch_rows 1024; %s, spark.ui off, executors' TF/OMP threads 1; "
            "one process and Spark application per measurement; %d run(s); total %.0f s") % (
        harness.now_utc(), os.cpu_count(), platform.machine(),
        harness.memory_gib(), FEATURES, opts.rows_per_file, max([r["file MiB"] for rs in results.values() for r in rs] or [0]),
        NODES, BATCH, opts.master, opts.runs, total)
    parts = [head, tables(results, opts), per_batch_memory(results, opts)]
    if failures:
        parts.append("FAILED: " + "; ".join(failures))
    parts.append("command: `%s`" % harness.command(argv))
    harness.write_report("\n\n".join(parts) + "\n", opts.out)
    with open(os.path.splitext(opts.out)[0] + ".json", "w") as f:
        json.dump([{k: v for k, v in r.items()} for rs in results.values() for r in rs], f, indent=1, default=str)
    return 1 if failures else 0


def measure_in_child(argv: list[str] | None, rows: int, mode: str) -> dict:
    """One measurement in a new Python process: its own driver, so its own py4j gateway JVM (PySpark keeps one
    gateway JVM for its process's lifetime, and the driver's Spark runs in it: a JVM's heap keeps its high-water
    mark, and its options -- the GC log -- are set when it starts)."""
    fd, path = tempfile.mkstemp(prefix="tfos-b5-result-", suffix=".json")
    os.close(fd)
    try:
        args = list(sys.argv[1:] if argv is None else argv) + ["--one", "%d:%s" % (rows, mode), "--result", path]
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args], check=False)
        if proc.returncode != 0:
            raise RuntimeError("the measurement's process exited with %d (its log is above)" % proc.returncode)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
