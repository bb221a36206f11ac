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
Python process, so one process per measurement is what gives each its own driver JVM).  A sampler thread in
the driver walks the driver's process tree every 0.2 s with psutil and classifies processes by command line: the driver (this
Python), the driver JVM (it also hosts local-cluster's master and worker), each executor JVM, each
Python worker forked by ``pyspark.daemon`` (the feeding tasks run there), each node's supervisor and
each node process (``python -m tfos_nb.runtime node``).  A process, once seen, is followed until it
exits even if it is re-parented.  Peak = the largest sampled RSS; the kernel's own high-water mark
(``VmHWM`` in /proc/PID/status, which catches peaks between samples) is shown beside it.  The
driver's high-water mark is reset (``/proc/self/clear_refs``) when the measurement starts.

The JVMs log every collection (``-Xlog:gc``): each one's heap after a collection (what is still live) and
its committed heap, so that a JVM's RSS growth can be told apart from data it keeps.

Run: ``bash benchmarks/run.sh b5`` or
``.venv-bench/bin/python benchmarks/bench_scale.py --rows 100000,1000000 --modes spark,numpy,fit --runs 1``.
Writes ``benchmarks/results/b5-latest.md``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FEATURES = 784
CLASSES = 10
BATCH = 128
NODES = 2
ROW_GROUP = 5_000
MIB = 1 << 20

log = logging.getLogger("bench_scale")


# --------------------------------------------------------------------------------------
# Data: written once, in a child process, one file at a time
# --------------------------------------------------------------------------------------

def data_dir(opts) -> str:
    return os.path.join(opts.cache_dir, "b5-seed%d-sep%g-%dx%d" % (opts.seed, opts.separation, opts.rows_per_file, FEATURES))


def write_data(path: str, files: int, rows_per_file: int, seed: int, separation: float) -> None:
    """``files`` Parquet files of ``rows_per_file`` rows: features list<float32>[784], label int32."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    centres = np.random.default_rng(seed).normal(0.0, 1.0, (CLASSES, FEATURES)).astype(np.float32) * separation
    schema = pa.schema([("features", pa.list_(pa.float32())), ("label", pa.int32())])
    offsets = pa.array(np.arange(0, (ROW_GROUP + 1) * FEATURES, FEATURES, dtype=np.int32))
    for i in range(files):
        final = os.path.join(path, "part-%05d.parquet" % i)
        if os.path.exists(final):
            continue
        rng = np.random.default_rng([seed, i])
        tmp = final + ".tmp"
        with pq.ParquetWriter(tmp, schema, use_dictionary=["label"], compression="snappy") as w:
            for _ in range(0, rows_per_file, ROW_GROUP):
                y = rng.integers(0, CLASSES, ROW_GROUP).astype(np.int32)
                x = rng.standard_normal((ROW_GROUP, FEATURES), dtype=np.float32)
                x += centres[y]
                feats = pa.ListArray.from_arrays(offsets, pa.array(x.ravel()))
                w.write_table(pa.Table.from_arrays([feats, pa.array(y)], schema=schema), row_group_size=ROW_GROUP)
        os.replace(tmp, final)
        log.info("wrote %s", final)


def ensure_data(opts) -> list[str]:
    """The Parquet files for the largest setting (written by a child process when missing)."""
    need = max(opts.rows) // opts.rows_per_file
    path = data_dir(opts)
    files = [os.path.join(path, "part-%05d.parquet" % i) for i in range(need)]
    if not all(os.path.exists(f) for f in files):
        t0 = time.perf_counter()
        log.info("writing %d rows to %s (once; reused by later runs)", need * opts.rows_per_file, path)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--write-data", path, "--files", str(need),
                        "--rows-per-file", str(opts.rows_per_file), "--seed", str(opts.seed),
                        "--separation", str(opts.separation)], check=True)
        log.info("data written in %.0f s", time.perf_counter() - t0)
    return files


# --------------------------------------------------------------------------------------
# Node functions (shipped by cloudpickle; self-contained)
# --------------------------------------------------------------------------------------

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
        model = tf.keras.Sequential([tf.keras.layers.Input(shape=(784,)),
                                     tf.keras.layers.Dense(128, activation="relu"),
                                     tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=1e-3),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
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


# --------------------------------------------------------------------------------------
# Process-tree RSS sampler
# --------------------------------------------------------------------------------------

def _hwm(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def classify(proc, root_pid: int) -> str | None:
    """The kind of one process of the Spark application, from its command line (None: not one we report)."""
    import psutil

    if proc.pid == root_pid:
        return "driver (Python)"
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    line = " ".join(cmd)
    if "CoarseGrainedExecutorBackend" in line:
        eid = cmd[cmd.index("--executor-id") + 1] if "--executor-id" in cmd else "?"
        return "executor JVM %s" % eid
    if "SparkSubmit" in line:  # the JVM itself, not spark-submit's bash nor its launcher.Main
        return "driver JVM" if os.path.basename(cmd[0]) == "java" and "launcher.Main" not in line else None
    if "tfos_nb.runtime" in line:
        role = cmd[cmd.index("tfos_nb.runtime") + 1] if "tfos_nb.runtime" in cmd[:-1] else "?"
        return {"node": "node process", "supervisor": "node supervisor"}.get(role, "tfos_nb " + role)
    if "pyspark.daemon" in line:
        try:
            parent = " ".join(proc.parent().cmdline())
        except Exception:
            parent = ""
        return "Python worker" if "pyspark.daemon" in parent else "pyspark.daemon"
    return "other: " + os.path.basename(cmd[0]) if cmd else None


class Sampler(threading.Thread):
    """Every ``interval`` s: the driver's descendants, classified; each one's largest RSS and last VmHWM."""

    def __init__(self, interval: float = 0.2):
        super().__init__(name="rss-sampler", daemon=True)
        import psutil

        self.interval = interval
        self.root = psutil.Process(os.getpid())
        self.procs: dict[int, dict] = {}
        self.stop_event = threading.Event()
        self.samples = 0

    def _walk(self):
        import psutil

        try:
            kids = self.root.children(recursive=True)
        except psutil.Error:
            kids = []
        for p in [self.root, *kids]:
            if p.pid not in self.procs:
                kind = classify(p, self.root.pid)
                if kind is None:
                    continue
                self.procs[p.pid] = {"kind": kind, "proc": p, "peak": 0, "hwm": 0, "first": time.time(),
                                     "exec": self._executor_of(p)}
        for pid, info in self.procs.items():
            if info.get("gone"):
                continue
            try:
                rss = info["proc"].memory_info().rss
            except psutil.Error:
                info["gone"] = True
                continue
            info["peak"] = max(info["peak"], rss)
            info["hwm"] = max(info["hwm"], _hwm(pid))
            info["last"] = time.time()

    def _executor_of(self, p) -> str:
        """The executor JVM a process descends from (its ``--executor-id``), '' for the driver side."""
        try:
            for a in p.parents():
                cmd = a.cmdline()
                if "--executor-id" in cmd:
                    return cmd[cmd.index("--executor-id") + 1]
        except Exception:
            pass
        return ""

    def run(self):
        while not self.stop_event.is_set():
            self._walk()
            self.samples += 1
            self.stop_event.wait(self.interval)

    def stop(self):
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        self.join(timeout=10)
        self._walk()

    def report(self) -> list[dict]:
        return [{"kind": i["kind"], "exec": i["exec"], "pid": pid, "peak": i["peak"], "hwm": i["hwm"]}
                for pid, i in sorted(self.procs.items())]


# --------------------------------------------------------------------------------------
# One measurement = one Spark application
# --------------------------------------------------------------------------------------

def measure(opts, files: list[str], rows: int, mode: str) -> dict:
    tmp = tempfile.mkdtemp(prefix="tfos-b5-")
    try:
        return _measure(opts, files[:rows // opts.rows_per_file], rows, mode, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(opts, paths: list[str], rows: int, mode: str, tmp: str) -> dict:
    from pyspark.sql import SparkSession

    file_bytes = max(os.path.getsize(p) for p in paths)
    gc_dir = os.path.join(tmp, "gc")
    os.makedirs(gc_dir)
    gc_opt = "-Xlog:gc:file=%s/gc-%%p.log" % gc_dir
    sampler = Sampler(opts.interval)
    try:
        with open("/proc/self/clear_refs", "w") as f:  # the driver's VmHWM from here on
            f.write("5")
    except OSError:
        pass
    sampler.start()
    spark = None
    try:
        b = (SparkSession.builder.master(opts.master).appName("tfos_nb-bench-scale")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             # one partition per file: no split (files < maxPartitionBytes), no packing (two files > it)
             .config("spark.sql.files.maxPartitionBytes", str(int(file_bytes * 1.5)))
             .config("spark.driver.extraJavaOptions", gc_opt)
             .config("spark.executor.extraJavaOptions", gc_opt)
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"]))
        for k, v in {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1",
                     "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1",
                     **dict(kv.split("=", 1) for kv in opts.executor_env)}.items():
            b = b.config("spark.executorEnv." + k, v)
        spark = b.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
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
    args = {"batch": BATCH, "out_dir": out_dir, "vm": _vm}
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


_GC_LINE = re.compile(r"GC\(\d+\) Pause .*? (\d+)M->(\d+)M\((\d+)M\)")


def gc_by_kind(gc_dir: str, procs: list[dict]) -> dict[str, dict]:
    """Each JVM's collections from its ``-Xlog:gc`` file, by kind: the largest heap left after a collection (an upper
    bound of what it keeps live), the largest committed heap, and the number of pauses."""
    kinds = {p["pid"]: p["kind"] for p in procs}
    out: dict[str, dict] = {}
    for name in os.listdir(gc_dir):
        m = re.match(r"gc-(\d+)\.log", name)
        kind = kinds.get(int(m.group(1))) if m else None
        if kind is None:
            log.info("GC log %s: not a JVM the sampler saw", name)
            continue
        after, committed, pauses = 0, 0, 0
        with open(os.path.join(gc_dir, name)) as f:
            for line in f:
                g = _GC_LINE.search(line)
                if g:
                    pauses += 1
                    after, committed = max(after, int(g.group(2))), max(committed, int(g.group(3)))
        d = out.setdefault(kind, {"after": 0, "committed": 0, "pauses": 0})
        d["after"], d["committed"] = max(d["after"], after), max(d["committed"], committed)
        d["pauses"] += pauses
    return out


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------

KIND_ORDER = ["node process", "node supervisor", "Python worker", "pyspark.daemon", "executor JVM",
              "driver JVM", "driver (Python)"]


def kind_key(kind: str) -> tuple:
    base = kind.rsplit(" ", 1)[0] if kind.startswith("executor JVM") else kind
    return (KIND_ORDER.index(base) if base in KIND_ORDER else len(KIND_ORDER), kind)


def peaks_by_kind(res: dict) -> dict[str, dict]:
    """kind -> {count, peak (largest sampled RSS of the kind's processes), hwm}, executor JVMs and nodes one by one."""
    out: dict[str, dict] = {}
    by_node = {}
    for p in res["procs"]:
        kind = p["kind"]
        if kind == "node process":
            by_node.setdefault(p["exec"], []).append(p)
        if kind.startswith("other"):
            continue
        d = out.setdefault(kind if kind != "node process" else "node process", {"count": 0, "peak": 0, "hwm": 0})
        d["count"] += 1
        d["peak"] = max(d["peak"], p["peak"])
        d["hwm"] = max(d["hwm"], p["hwm"])
    for eid, ps in by_node.items():  # each node apart too (on executor eid)
        out["node process (executor %s)" % eid] = {"count": len(ps), "peak": max(p["peak"] for p in ps),
                                                   "hwm": max(p["hwm"] for p in ps)}
    return out


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


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
    gc_rows = []
    for mode in opts.modes:
        per_rows = {rows: [r.get("gc", {}) for r in results.get((rows, mode), [])] for rows in (small, big)}
        kinds = sorted({k for gs in per_rows.values() for g in gs for k in g}, key=kind_key)
        for k in kinds:
            def gcell(rows, field, k=k):
                return med([g[k][field] for g in per_rows[rows] if k in g])
            cells = []
            for field in ("after", "committed"):
                a, b = gcell(small, field), gcell(big, field)
                cells.append("%s → %s%s" % ("%.0f" % a if a is not None else "–", "%.0f" % b if b is not None else "–",
                                            " (%.2f×)" % (b / a) if a and b else ""))
            gc_rows.append("| %s | %s | %s | %s |" % (mode, k, " | ".join(cells), " → ".join(
                "%.0f" % v for v in (gcell(small, "pauses"), gcell(big, "pauses")) if v is not None)))
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
        per_rows = {rows: [peaks_by_kind(r) for r in results.get((rows, mode), [])] for rows in (small, big)}
        kinds = sorted({k for rs in per_rows.values() for r in rs for k in r}, key=kind_key)
        for k in kinds:
            def cell(rows, field, k=k):
                return med([r[k][field] for r in per_rows[rows] if k in r])
            a, b = cell(small, "peak"), cell(big, "peak")
            ah, bh = cell(small, "hwm"), cell(big, "hwm")
            cnt = "/".join(str(int(c)) for c in (cell(small, "count"), cell(big, "count")) if c is not None)
            lines.append("| %s | %s | %s | %s | %s |" % (
                k, cnt, "%.0f (%.0f)" % (a / MIB, ah / MIB) if a else "–", "%.0f (%.0f)" % (b / MIB, bh / MIB) if b else "–",
                "%.2f×" % (b / a) if a and b else ""))
        nodes = [(rows, n) for rows in (small, big) for r in results.get((rows, mode), []) for n in r.get("nodes", [])]
        if nodes:
            lines += ["", "node processes (own /proc figures): RSS when ready to read → VmHWM at the end: " + "; ".join(
                "%s rows %.0f → %.0f MiB (+%.0f)" % (f"{rows:,}", n["ready_rss"] / MIB, n["hwm"] / MIB,
                                                    (n["hwm"] - n["ready_rss"]) / MIB) for rows, n in nodes)]
    return "\n".join(lines)


def per_batch_memory(results: dict, opts) -> str:
    """What a node holds per batch in flight, from the feed's constants and the measured rows."""
    import importlib

    feed_hub = importlib.import_module("tfos_nb.runtime.executor.feed_hub")
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
    p.add_argument("--out", default=os.path.join(HERE, "results", "b5-latest.md"))
    p.add_argument("--executor-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for the executors and the nodes they start (repeatable)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # ROWS:MODE -- one measurement, in this (child) process
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--write-data", help=argparse.SUPPRESS)
    p.add_argument("--files", type=int, help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if opts.write_data:
        write_data(opts.write_data, opts.files, opts.rows_per_file, opts.seed, opts.separation)
        return 0
    opts.rows = [int(r) for r in opts.rows.split(",") if r]
    opts.modes = [m for m in opts.modes.split(",") if m]
    if any(r % opts.rows_per_file for r in opts.rows) or set(opts.modes) - {"spark", "numpy", "fit"}:
        p.error("--rows must be multiples of --rows-per-file; --modes among spark,numpy,fit")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    pp = os.environ.get("PYTHONPATH", "")
    if ROOT not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = ROOT + (os.pathsep + pp if pp else "")
    files = ensure_data(opts)
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
        _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), os.cpu_count(), platform.machine(),
        _mem_gib(), FEATURES, opts.rows_per_file, max([r["file MiB"] for rs in results.values() for r in rs] or [0]),
        NODES, BATCH, opts.master, opts.runs, total)
    cmd = "command: `" + " ".join(shlex.quote(a) for a in [os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)]
                                  + (argv if argv is not None else sys.argv[1:])) + "`"
    parts = [head, tables(results, opts), per_batch_memory(results, opts)]
    if failures:
        parts.append("FAILED: " + "; ".join(failures))
    parts.append(cmd)
    text = "\n\n".join(parts) + "\n"
    print(text)
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out, "w") as f:
        f.write(text)
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


def _mem_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / (1 << 30)


if __name__ == "__main__":
    sys.exit(main())
