#!/usr/bin/env python
"""B1 (feeding throughput) and B4a (control-plane start + shutdown) side by side.

Compares, in ONE Spark application and alternating per repetition (after a warm-up of each):

* TensorFlowOnSpark 2.2.5 (the reference) -- ``tensorflowonspark.TFCluster`` / ``TFNode.DataFeed``
* tfos_nb -- ``tfos_nb.TFCluster`` (same API), with RDD input and with DataFrame input
* the "ceiling" -- the same cached DataFrame through Spark's own ``df.mapInArrow`` into numpy
  batches, with no TensorFlow hop (B1 only)
* tfos_nb through TensorFlowOnSpark's row API (``TFNode.DataFeed.next_batch(128)`` + ``np.asarray``
  over the rows, as migrated programs do), with DataFrame and RDD input, and the "RDD ceiling" --
  what Spark itself needs to hand the same cached, pickled RDD rows to Python and batch them into
  numpy (``rdd.mapPartitions``, no TensorFlow hop); RDD variants are compared with the RDD ceiling

and prints a markdown table (median, min-max, ratios, the targets).

Run it with ``bash benchmarks/run.sh`` (creates ``.venv-bench``); see benchmarks/README.md.
A failing variant prints ``FAILED: <reason>`` in its row; the other variants still run.
"""
from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid

import data
import harness
import memory

NUM_FEATURES = 784
BATCH = 128
DEFAULT_ROWS = 200_000
DEFAULT_PARTS = 8
DEFAULT_RUNS = 3

log = logging.getLogger("bench")


# Functions shipped to executors (pickled by value by cloudpickle: keep them self-contained)

def _settled(fn):
    """``fn``'s task with its Python worker's garbage collector settled as tfos_nb's feeding tasks settle it
    (``settle_gc``: once per worker, what it holds leaves the collector's full passes): the references are Spark at
    its best, whatever another variant's task imported into the same reused worker before."""
    import functools

    @functools.wraps(fn)
    def task(it):
        from tfos_nb.runtime.executor.collector import settle_gc  # stdlib only (tfos_nb's modules load lazily)

        settle_gc()
        return fn(it)
    return task


@_settled
def _ceiling_fn(it):
    """mapInArrow function: each batch's feature column -> float32 numpy (n, 784), in slices of 128."""
    import numpy as np
    import pyarrow as pa
    for b in it:
        col = b.column(b.schema.get_field_index("features"))
        n = 0
        for off in range(0, len(col), BATCH):
            sl = col.slice(off, BATCH)
            x = sl.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            x = x.reshape(-1, NUM_FEATURES)
            n += x.shape[0]
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])


@_settled
def _rdd_ceiling_fn(it):
    """mapPartitions function: the cached RDD's (features, label) rows -> float32 numpy (128, 784) batches."""
    import numpy as np
    n = 0
    buf = []
    for row in it:
        buf.append(row)
        if len(buf) == BATCH:
            n += np.asarray([r[0] for r in buf], dtype=np.float32).shape[0]
            buf = []
    if buf:
        n += np.asarray([r[0] for r in buf], dtype=np.float32).shape[0]
    yield n


def _write_count(count_dir, n):
    """A node's rows, for the driver's check that every row reached a node."""
    if not count_dir:
        return
    try:
        path = os.path.join(count_dir, "%d-%s.cnt" % (os.getpid(), uuid.uuid4().hex[:8]))
        with open(path + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(path + ".tmp", path)
    except Exception:
        pass


def rows_fun(args, ctx):
    """TensorFlowOnSpark's row API (``args["framework"]``'s ``TFNode``: TFoS's, or tfos_nb's for migrated programs),
    InputMode.SPARK: drain batches of 128 rows, convert each to numpy."""
    import importlib

    import numpy as np
    tfnode = importlib.import_module(args["framework"] + ".TFNode")
    feed = tfnode.DataFeed(ctx.mgr, train_mode=True)
    n = 0
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if not batch:
            break
        x = np.asarray([r[0] for r in batch], dtype=np.float32)
        n += x.shape[0]
    _write_count(args.get("count_dir"), n)


def _cols_to_matrix(cols):
    """Features of one tfos_nb batch -> float32 (n, 784); None/empty -> None."""
    import numpy as np
    if cols is None:
        return None
    if isinstance(cols, dict):
        if not cols:
            return None
        feats = cols.get("features", cols.get("_0", next(iter(cols.values()))))
    elif isinstance(cols, (list, tuple)):
        if len(cols) == 0:
            return None
        first = cols[0]
        if isinstance(first, np.ndarray) and first.ndim >= 1 and (first.dtype != object or len(cols) <= 2):
            feats = first  # list of columns: [features, label]
        else:
            feats = [r[0] for r in cols]  # list of rows: [(features, label), ...]
    else:
        feats = cols
    if isinstance(feats, np.ndarray) and feats.dtype == object:
        feats = np.stack([np.asarray(v, dtype=np.float32) for v in feats]) if len(feats) else feats
    x = np.asarray(feats, dtype=np.float32)
    if x.shape[0] == 0:
        return None
    return x.reshape(x.shape[0], -1)


def tfos_nb_feed_fun(args, ctx):
    """tfos_nb map_fun (InputMode.SPARK): columnar batches when available, else rows."""
    import numpy as np  # noqa: F401
    feed = ctx.get_data_feed(train_mode=True)
    columnar = hasattr(feed, "next_batch_arrays")
    n = 0
    while not feed.should_stop():
        cols = feed.next_batch_arrays(args["batch"]) if columnar else feed.next_batch(args["batch"])
        x = _cols_to_matrix(cols)
        if x is None:
            break
        n += x.shape[0]
    _write_count(args.get("count_dir"), n)


def noop_fun(args, ctx):
    """B4a: a node that returns immediately."""


# Where a B1 run's CPU goes: every process of the Spark application and the nodes, by role

JVM_KINDS = (*(kind for kind, _ in memory.JVM_THREADS), "other")  # what memory.jvm_threads() sums
ROLES = ("driver JVM", "executor JVMs", "Spark Python workers", "node supervisors", "nodes")


def _role(cmdline):
    if "CoarseGrainedExecutorBackend" in cmdline:
        return "executor JVMs"
    if "org.apache.spark.deploy.SparkSubmit" in cmdline or ("java" in cmdline and "pyspark-shell" in cmdline):
        return "driver JVM"
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "Spark Python workers"
    if "tfos_nb.runtime supervisor" in cmdline:  # a node's supervisor: its heartbeats and the child's output
        return "node supervisors"
    if "tfos_nb" in cmdline or "tensorflowonspark" in cmdline:  # the node's own process (TFoS: in the worker)
        return "nodes"
    return None


def cpu_by_process():
    """CPU-seconds so far of each process of the benchmark's Spark application and its nodes: ``{"procs": pid ->
    (role, s), "jvm": the Spark JVMs' threads by kind}`` (:func:`memory.jvm_threads`: tasks, JIT, GC, other)."""
    import psutil

    me = os.getpid()
    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            role = _role(" ".join(p.info["cmdline"] or []))
            if role is None or p.pid == me:
                continue
            t = p.cpu_times()
            out[p.pid] = (role, t.user + t.system)
        except psutil.Error:
            continue
    return {"procs": out, "jvm": memory.jvm_threads()}


def cpu_spent(before, after):
    """Each role's CPU-seconds between two ``cpu_by_process()`` (a process that ended meanwhile is not counted), and
    the JVMs' threads' by kind (``cpu JVM tasks s``…)."""
    spent = dict.fromkeys(ROLES, 0.0)
    for pid, (role, s) in after["procs"].items():
        spent[role] += s - before["procs"].get(pid, (role, 0.0))[1]
    return {**{"cpu %s s" % role: spent[role] for role in ROLES}, **memory.jvm_threads_used(before["jvm"], after["jvm"])}


# The variants

class Bench:
    def __init__(self, opts):
        self.opts = opts
        self.spark = None
        self.rdd = None
        self.count_dir = tempfile.mkdtemp(prefix="tfos-bench-counts-")

    def start_spark(self):
        self.spark = harness.spark_session(
            self.opts.master, "tfos_nb-bench-runtime", log_level="WARN",
            conf={"spark.executor.memory": self.opts.executor_memory,
                  "spark.python.worker.reuse": "true"})  # TFoS background mode needs it (default)

    def build_data(self):
        o = self.opts
        t0 = time.perf_counter()
        self.df = data.uniform_frame(self.spark, o.rows, o.partitions, o.seed)
        log.info("DataFrame cached: %d rows x %d float32, %d partitions (%.1fs)",
                 o.rows, NUM_FEATURES, self.df.rdd.getNumPartitions(), time.perf_counter() - t0)
        if "B1" in o.bench and ({"tfos", "tfos_nb", "ceiling"} & set(o.only)):
            t0 = time.perf_counter()
            self.rdd = data.row_rdd(self.df, o.rows)
            log.info("RDD[(features list, label)] cached: %d rows, %d partitions (%.1fs)",
                     o.rows, self.rdd.getNumPartitions(), time.perf_counter() - t0)

    def ensure_spark(self):
        """TFoS calls sc.stop() + sys.exit(1) on a node error: rebuild the session if that happened."""
        if not harness.stopped_by_tfos(self.spark):
            return
        self.spark = None
        self.start_spark()
        self.build_data()

    def _read_counts(self, count_dir, nodes=2, wait=10.0):
        """The rows the nodes reported (``_write_count``: written whole, then renamed) and how many reported."""
        deadline = time.time() + wait
        while len(glob.glob(os.path.join(count_dir, "*.cnt"))) < nodes and time.time() <= deadline:
            time.sleep(0.2)
        files = glob.glob(os.path.join(count_dir, "*.cnt"))
        return sum(int(open(p).read().strip() or 0) for p in files), len(files)

    def b1(self, framework, source, fun="feed"):
        """B1: 2 nodes drain ``source`` (``df`` or ``rdd``); ``fun``: tfos_nb's columnar feed, or ``rows``: TFoS's row
        API (``framework``'s)."""
        import importlib

        tfcluster = importlib.import_module(framework + ".TFCluster")
        count_dir = tempfile.mkdtemp(dir=self.count_dir)
        args = {"batch": BATCH, "count_dir": count_dir, "framework": framework}
        t0 = time.perf_counter()
        cluster = tfcluster.run(self.spark.sparkContext, rows_fun if fun == "rows" else tfos_nb_feed_fun, args, 2,
                                num_ps=0, tensorboard=False, input_mode=tfcluster.InputMode.SPARK, master_node="chief",
                                **({"reservation_timeout": self.opts.reservation_timeout}
                                   if framework == "tensorflowonspark" else {}))
        t_start = time.perf_counter() - t0
        t_train = t_shut = None
        try:
            cpu0 = cpu_by_process()
            t1 = time.perf_counter()
            cluster.train(getattr(self, source), num_epochs=1, feed_timeout=self.opts.feed_timeout)
            t_train = time.perf_counter() - t1
            cpu = cpu_spent(cpu0, cpu_by_process())
        except BaseException:
            harness.log_cluster_state(cluster)
            raise
        finally:
            t2 = time.perf_counter()
            harness.shutdown(cluster)
            t_shut = time.perf_counter() - t2
        return {"rows/s": self.opts.rows / t_train, "train s": t_train, "start s": t_start,
                "shutdown s": t_shut, **cpu, "_seen": self._read_counts(count_dir)}

    def b1_rdd_ceiling(self):
        cpu0 = cpu_by_process()
        t0 = time.perf_counter()
        out = self.rdd.mapPartitions(_rdd_ceiling_fn).collect()
        dt = time.perf_counter() - t0
        return {"rows/s": self.opts.rows / dt, "train s": dt, **cpu_spent(cpu0, cpu_by_process()),
                "_seen": (sum(out), None)}

    def b1_ceiling(self):
        cpu0 = cpu_by_process()
        t0 = time.perf_counter()
        out = self.df.mapInArrow(_ceiling_fn, "n long").collect()
        dt = time.perf_counter() - t0
        return {"rows/s": self.opts.rows / dt, "train s": dt, **cpu_spent(cpu0, cpu_by_process()),
                "_seen": (sum(r.n for r in out), None)}

    def b4a(self, framework):
        import importlib

        mod = importlib.import_module(framework + ".TFCluster")
        t0 = time.perf_counter()
        cluster = mod.run(self.spark.sparkContext, noop_fun, {}, 2, num_ps=0, tensorboard=False,
                          input_mode=mod.InputMode.TENSORFLOW, master_node="chief",
                          **({"reservation_timeout": self.opts.reservation_timeout}
                             if framework == "tensorflowonspark" else {}))
        t_start = time.perf_counter() - t0
        t1 = time.perf_counter()
        harness.shutdown(cluster)
        t_shut = time.perf_counter() - t1
        return {"start+shutdown s": t_start + t_shut, "start s": t_start, "shutdown s": t_shut}


# (key, benchmark, variant label, framework, (Bench method, its arguments), primary metric, extra metrics)
TIMES = ["start s", "shutdown s"]
TFOS, NB = {"framework": "tensorflowonspark"}, {"framework": "tfos_nb"}
VARIANTS = [
    ("b1_tfos", "B1", "TFoS 2.2.5 (RDD)", "tfos", ("b1", {**TFOS, "source": "rdd", "fun": "rows"}), "rows/s", TIMES),
    ("b1_nb_rdd", "B1", "tfos_nb (RDD)", "tfos_nb", ("b1", {**NB, "source": "rdd"}), "rows/s", TIMES),
    ("b1_nb_df", "B1", "tfos_nb (DataFrame)", "tfos_nb", ("b1", {**NB, "source": "df"}), "rows/s", TIMES),
    ("b1_nb_rdd_rows", "B1", "tfos_nb (RDD) rows: next_batch + np.asarray", "tfos_nb",
     ("b1", {**NB, "source": "rdd", "fun": "rows"}), "rows/s", TIMES),
    ("b1_nb_df_rows", "B1", "tfos_nb (DataFrame) rows: next_batch + np.asarray", "tfos_nb",
     ("b1", {**NB, "source": "df", "fun": "rows"}), "rows/s", TIMES),
    ("b1_ceiling", "B1", "ceiling: df.mapInArrow -> numpy", "ceiling", ("b1_ceiling", {}), "rows/s", []),
    ("b1_rdd_ceiling", "B1", "RDD ceiling: rdd.mapPartitions -> numpy batches", "ceiling", ("b1_rdd_ceiling", {}),
     "rows/s", []),
    ("b4a_tfos", "B4a", "TFoS 2.2.5", "tfos", ("b4a", TFOS), "start+shutdown s", TIMES),
    ("b4a_nb", "B4a", "tfos_nb", "tfos_nb", ("b4a", NB), "start+shutdown s", TIMES),
]
VARIANT = {v[0]: v for v in VARIANTS}

# Which ceiling a B1 variant is compared with (default: b1_ceiling), and its own target where it differs.
CEILING_OF = {"b1_nb_rdd_rows": "b1_rdd_ceiling", "b1_rdd_ceiling": None}
# tfos_nb's targets by (variant or benchmark, metric): the text, and its checks from the median, the ratio vs TFoS
# and the ratio vs the ceiling
TARGETS = {
    ("B1", "rows/s"): ("≥10× TFoS, ≥0.5× ceiling", lambda m, ref, ceil: [_at_least(ref, 10), _at_least(ceil, 0.5)]),
    ("b1_nb_rdd_rows", "rows/s"): ("≥0.8× RDD ceiling", lambda m, ref, ceil: [_at_least(ceil, 0.8)]),
    ("B4a", "start+shutdown s"): ("≤5 s, ≤0.5× TFoS", lambda m, ref, ceil: [m <= 5.0, None if ref is None else ref <= 0.5]),
}


def _at_least(ratio, x):
    return None if ratio is None else ratio >= x


def measure(bench, key, label, notes):
    """One run of variant ``key``; a B1 run whose nodes did not see every row is noted."""
    _key, _bname, name, _fw, (meth, kwargs), _prim, _extra = VARIANT[key]
    m = getattr(bench, meth)(**kwargs)
    n, nodes = m.pop("_seen", (bench.opts.rows, None))
    if n != bench.opts.rows:
        notes.append("%s %s: nodes reported %d rows consumed, expected %d%s" % (
            name, label, n, bench.opts.rows, "" if nodes is None else " (%d count files)" % nodes))
        log.warning(notes[-1])
    return m


def fmt(metric, x):
    return "–" if x is None else f"{x:,.0f}" if metric.endswith("rows/s") else "%.2f s" % x


def fmt_ratio(r):
    return "–" if r is None else ("%.2f×" % r if r < 10 else "%.1f×" % r)


def build_table(rounds, selected):
    rows = []
    for v in VARIANTS:
        key, bname, label, fw, _m, prim, extra = v
        if key not in selected:
            continue
        ref_key = "b1_tfos" if bname == "B1" else "b4a_tfos"
        for metric in [prim] + extra:
            sp = rounds.spread(key, metric)
            if key in rounds.failures and metric == prim:
                cell = "FAILED: " + rounds.failures[key]
                if sp:
                    cell += " (after %d ok runs)" % sp.n
                tgt = target(bname, fw, metric, key)
                rows.append("| %s | %s | %s | %s | | | | | %s |" % (bname, label, metric, cell, tgt[0] if tgt else ""))
                continue
            if not sp:
                if key in rounds.failures:
                    continue
                rows.append("| %s | %s | %s | – | | 0 | | | |" % (bname, label, metric))
                continue
            ref, ceil_key = rounds.spread(ref_key, metric), CEILING_OF.get(key, "b1_ceiling")
            r_ref = sp.ratio(ref).median if ref and key != ref_key else None
            r_ceil = None
            if bname == "B1" and metric == "rows/s" and ceil_key and key != ceil_key:
                c = rounds.spread(ceil_key, metric)
                r_ceil = sp.ratio(c).median if c else None
            tgt = target(bname, fw, metric, key)
            rows.append(harness.row(bname, label, metric, fmt(metric, sp.median), "%s – %s" % (
                fmt(metric, sp.min), fmt(metric, sp.max)), sp.n, fmt_ratio(r_ref), fmt_ratio(r_ceil),
                tgt[0] + verdict(tgt[1](sp.median, r_ref, r_ceil)) if tgt else ""))
    header = ["benchmark", "variant", "metric", "median", "min–max", "n", "ratio vs TFoS", "ratio vs ceiling", "target"]
    return "\n".join(harness.table(header, rows))


def breakdown_table(rounds, selected):
    """Where each B1 variant's time went: the medians of its runs' CPU-seconds by role, their sum over the
    machine's cores beside the measured wall time (both CPU-bound on 2 cores: the sum over the cores is the floor)."""
    cores = os.cpu_count() or 1
    rows = []
    for v in VARIANTS:
        key, bname, label = v[0], v[1], v[2]
        if key not in selected or bname != "B1" or not rounds.spread(key, "cpu nodes s"):
            continue
        cpu = [rounds.spread(key, "cpu %s s" % role).median for role in ROLES]
        wall = rounds.spread(key, "train s").median
        jvm = [rounds.spread(key, "cpu JVM %s s" % k) for k in JVM_KINDS]
        jvm_text = " / ".join("%.2f" % s.median if s else "–" for s in jvm)
        rows.append(harness.row(label, *("%.2f" % c for c in cpu), "%.2f" % sum(cpu), "%.2f s" % (sum(cpu) / cores),
                                "%.2f s" % wall, jvm_text))
    header = ["B1 variant", *("%s CPU s" % r for r in ROLES), "all CPU s", "all over %d cores" % cores,
              "measured wall", "JVMs' threads: %s CPU s" % " / ".join(JVM_KINDS)]
    return "\n".join(harness.table(header, rows))


def target(bname, fw, metric, key):
    """tfos_nb's target for this row: (text, its checks), or None."""
    return (TARGETS.get((key, metric)) or TARGETS.get((bname, metric))) if fw == "tfos_nb" else None


def verdict(checks):
    """' — **met**' / ' — **not met**' / ' — (incomplete)' from the checks that can be evaluated (None: cannot)."""
    if any(c is False for c in checks):
        return " — **not met**"
    if all(c is True for c in checks):
        return " — **met**"
    return " — (incomplete)"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    p.add_argument("--partitions", type=int, default=DEFAULT_PARTS)
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="measured runs per variant (after 1 warm-up)")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--only", default="tfos,tfos_nb,ceiling",
                   help="comma list of frameworks: tfos, tfos_nb, ceiling")
    p.add_argument("--bench", default="B1,B4a", help="comma list: B1, B4a")
    p.add_argument("--master", default="local-cluster[2,1,2048]")
    p.add_argument("--executor-memory", default="2048m")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=int, default=420, help="watchdog seconds per variant run")
    p.add_argument("--feed-timeout", type=int, default=600)
    p.add_argument("--reservation-timeout", type=int, default=180, help="TFoS reservation timeout")
    p.add_argument("--out", default=None,
                   help="markdown output (default: benchmarks/results/latest.md for a full default run, "
                        "benchmarks/results/partial.md otherwise)")
    p.add_argument("-v", "--verbose", action="store_true")
    o = p.parse_args(argv)
    o.only = [s.strip() for s in o.only.split(",") if s.strip()]
    o.bench = [s.strip() for s in o.bench.split(",") if s.strip()]
    for flag, values, known in (("--only", o.only, {"tfos", "tfos_nb", "ceiling"}), ("--bench", o.bench, {"B1", "B4a"})):
        if set(values) - known:
            p.error("unknown %s value(s): %s" % (flag, ", ".join(sorted(set(values) - known))))
    if o.runs < 1:
        p.error("--runs must be >= 1")
    full = (o.rows == DEFAULT_ROWS and o.runs >= DEFAULT_RUNS and not o.no_warmup
            and set(o.only) == {"tfos", "tfos_nb", "ceiling"} and set(o.bench) == {"B1", "B4a"}
            and o.partitions == DEFAULT_PARTS)
    o.partial_out = os.path.join(harness.HERE, "results", "partial.md")
    o.out_is_default = o.out is None
    if o.out is None:
        o.out = os.path.join(harness.HERE, "results", "latest.md") if full else o.partial_out
    return o


def main(argv=None):
    opts = parse_args(argv)
    harness.setup_logging(opts.verbose)
    if harness.ROOT not in sys.path:
        sys.path.insert(0, harness.ROOT)

    selected = [v[0] for v in VARIANTS if v[1] in opts.bench and v[3] in opts.only]
    notes = []
    bench = Bench(opts)
    rounds = harness.Rounds(opts.runs, not opts.no_warmup, timeout=opts.timeout,
                            cancel=lambda: bench.spark.sparkContext.cancelAllJobs())
    t_all = time.perf_counter()
    interrupted = False
    try:
        bench.start_spark()
        bench.build_data()
        rounds.run(selected, lambda key, label: measure(bench, key, label, notes), before=bench.ensure_spark)
    except BaseException:
        interrupted = True  # an interrupted run never replaces results/latest.md
        raise
    finally:
        table = build_table(rounds, selected)
        lines = ["# B1 feeding throughput / B4a control plane — tfos_nb vs TensorFlowOnSpark 2.2.5", ""]
        setting = ("master `%s`, spark.executor.memory=%s, spark.ui.enabled=false, executors' "
                   "TF_NUM_INTRAOP_THREADS=TF_NUM_INTEROP_THREADS=OMP_NUM_THREADS=1; %d rows x %d float32 + int label, "
                   "%d partitions, cached and counted; batch %d; 1 warm-up + %d alternating runs per variant" % (
                       opts.master, opts.executor_memory, opts.rows, NUM_FEATURES, opts.partitions, BATCH, opts.runs))
        lines += harness.machine_lines(("pyspark", "tensorflowonspark", "tfos_nb", "pyarrow", "numpy")) + [
            "- setting: " + setting]
        lines += ["- total wall: %.0f s" % (time.perf_counter() - t_all), "", table, ""]
        if "B1" in opts.bench:
            lines += ["Where B1's time goes (medians of the runs: each role's CPU-seconds while `train()` or the "
                      "reference's `collect()` ran, read from every process of the application; a role's processes "
                      "that ended within the run are not counted; the last column splits the JVMs' CPU — the driver's and the "
                      "executors' — by their threads' names: Spark's task threads reading the cache and writing Arrow, "
                      "the JIT compilers, the garbage collectors, the rest):", "", breakdown_table(rounds, selected), ""]
        lines += [
            "Ratios are median/median. B1 `rows/s` ratio > 1 means faster than the reference; for seconds "
            "(start, shutdown, start+shutdown) ratio < 1 means faster. `ratio vs ceiling` is the share of "
            "Spark's own mapInArrow→numpy rate (no TensorFlow hop); for the RDD row-API variant, of the RDD "
            "ceiling (Spark handing the cached pickled rows to Python, batched into numpy). rows/s = rows / wall time of `train()` "
            "(or of the ceiling's `collect()`).",
        ]
        if interrupted:
            lines += ["", "**Interrupted run: incomplete figures.**"]
            if opts.out_is_default:
                opts.out = opts.partial_out
        if notes:
            lines += ["", "Row-count checks that did not match:"] + ["- " + n for n in notes]
        try:
            harness.write_report("\n".join(lines) + "\n", opts.out)
            if not interrupted:
                harness.write_runs(opts.out, "B1/B4a", rounds, {v[0]: "%s: %s" % (v[1], v[2]) for v in VARIANTS},
                                   setting=setting,
                                   command_line=os.environ.get("BENCH_CMD") or harness.command())
            log.info("wrote %s", opts.out)
        except Exception as e:
            log.error("could not write %s: %s", opts.out, e)
        try:
            if bench.spark is not None:
                bench.spark.stop()
        except Exception:
            pass
        shutil.rmtree(bench.count_dir, ignore_errors=True)
    return 0 if not rounds.failures else 1


if __name__ == "__main__":
    sys.exit(main())
