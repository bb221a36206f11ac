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

and prints a markdown table (median, min-max, ratios, targets from shared BENCHMARKS.md).

Run it with ``bash benchmarks/run.sh`` (creates ``.venv-bench``); see benchmarks/README.md.
A failing variant prints ``FAILED: <reason>`` in its row; the other variants still run.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import logging
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

NUM_FEATURES = 784
BATCH = 128
DEFAULT_ROWS = 200_000
DEFAULT_PARTS = 8
DEFAULT_RUNS = 3

log = logging.getLogger("bench")


# --------------------------------------------------------------------------------------
# Functions shipped to executors (pickled by value by cloudpickle: keep them self-contained)
# --------------------------------------------------------------------------------------

def _gen_batches(seed):
    """mapInArrow function: spark.range ids -> (features array<float>[784], label int)."""
    def gen(it):
        import numpy as np
        import pyarrow as pa
        for b in it:
            ids = b.column(0).to_numpy()
            n = len(ids)
            if n == 0:
                continue
            rng = np.random.default_rng([seed, int(ids[0])])
            x = rng.random((n, NUM_FEATURES), dtype=np.float32)
            offsets = pa.array(np.arange(0, (n + 1) * NUM_FEATURES, NUM_FEATURES, dtype=np.int32))
            feats = pa.ListArray.from_arrays(offsets, pa.array(x.ravel()))
            label = pa.array(rng.integers(0, 10, n, dtype=np.int32))
            yield pa.RecordBatch.from_arrays([feats, label], names=["features", "label"])
    return gen


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


def _write_count(count_dir, tag, n):
    if not count_dir:
        return
    try:
        path = os.path.join(count_dir, "%s-%d-%s.cnt" % (tag, os.getpid(), uuid.uuid4().hex[:8]))
        with open(path + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(path + ".tmp", path)
    except Exception:
        pass


def tfos_feed_fun(args, ctx):
    """TFoS map_fun (InputMode.SPARK): drain batches of 128 rows, convert each to numpy."""
    import numpy as np
    from tensorflowonspark import TFNode
    feed = TFNode.DataFeed(ctx.mgr, train_mode=True)
    n = 0
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if not batch:
            break
        x = np.asarray([r[0] for r in batch], dtype=np.float32)
        n += x.shape[0]
    _write_count(args.get("count_dir"), "tfos", n)


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
    _write_count(args.get("count_dir"), "tfos_nb", n)


def tfos_nb_rows_fun(args, ctx):
    """tfos_nb map_fun through TensorFlowOnSpark's row API, written as for TFoS (``tfos_feed_fun``)."""
    import numpy as np

    from tfos_nb import TFNode
    feed = TFNode.DataFeed(ctx.mgr, train_mode=True)
    n = 0
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if not batch:
            break
        x = np.asarray([r[0] for r in batch], dtype=np.float32)
        n += x.shape[0]
    _write_count(args.get("count_dir"), "tfos_nb", n)


def noop_fun(args, ctx):
    """B4a: a node that returns immediately."""
    return None


# --------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------

class VariantFailed(Exception):
    pass


class Watchdog:
    """Cancels Spark jobs, then interrupts the main thread, if a variant run takes too long."""

    def __init__(self, bench, seconds, label):
        self.bench, self.seconds, self.label = bench, seconds, label
        self.fired = False
        self._done = threading.Event()

    def _watch(self):
        if self._done.wait(self.seconds):
            return
        self.fired = True
        log.error("watchdog: %s exceeded %ss, cancelling Spark jobs", self.label, self.seconds)
        try:
            self.bench.spark.sparkContext.cancelAllJobs()
        except Exception:
            pass
        if self._done.wait(60):
            return
        log.error("watchdog: %s still stuck, interrupting the main thread", self.label)
        os.kill(os.getpid(), signal.SIGINT)

    def __enter__(self):
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        return False


def _dump_tfos_nb_state(cluster):
    """On a tfos_nb failure, log what the cluster knows (status + node log tails) for debugging."""
    for what in ("status", "logs"):
        try:
            fn = getattr(cluster, what, None)
            if fn is None:
                continue
            out = fn(tail=30) if what == "logs" else fn()
            if isinstance(out, dict):
                for node, lines in out.items():
                    log.error("tfos_nb %s[%s]:\n  %s", what, node, "\n  ".join(map(str, lines)))
            else:
                log.error("tfos_nb %s: %r", what, out)
        except Exception as e:  # diagnostics must never mask the failure
            log.error("tfos_nb %s unavailable: %s", what, e)


class Bench:
    def __init__(self, opts):
        self.opts = opts
        self.spark = None
        self.df = None
        self.rdd = None
        self.count_dir = tempfile.mkdtemp(prefix="tfos-bench-counts-")

    # ---- Spark session + data ------------------------------------------------------
    def start_spark(self):
        from pyspark.sql import SparkSession
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        # executors must import tfos_nb even when it is not pip-installed yet
        pp = os.environ.get("PYTHONPATH", "")
        if ROOT not in pp.split(os.pathsep):
            os.environ["PYTHONPATH"] = ROOT + (os.pathsep + pp if pp else "")
        b = (SparkSession.builder
             .master(self.opts.master)
             .appName("tfos_nb-bench-runtime")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", self.opts.executor_memory)
             .config("spark.python.worker.reuse", "true")  # TFoS background mode needs it (default)
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
             .config("spark.executorEnv.TF_NUM_INTRAOP_THREADS", "1")
             .config("spark.executorEnv.TF_NUM_INTEROP_THREADS", "1")
             .config("spark.executorEnv.OMP_NUM_THREADS", "1")
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2"))
        t0 = time.perf_counter()
        self.spark = b.getOrCreate()
        self.spark.sparkContext.setLogLevel("WARN")
        log.info("Spark %s session up in %.1fs (%s)", self.spark.version, time.perf_counter() - t0,
                 self.opts.master)

    def build_data(self):
        from pyspark import StorageLevel
        spark, o = self.spark, self.opts
        t0 = time.perf_counter()
        df = (spark.range(0, o.rows, 1, o.partitions)
              .mapInArrow(_gen_batches(o.seed), "features array<float>, label int"))
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        n = df.count()
        assert n == o.rows, (n, o.rows)
        self.df = df
        log.info("DataFrame cached: %d rows x %d float32, %d partitions (%.1fs)",
                 n, NUM_FEATURES, df.rdd.getNumPartitions(), time.perf_counter() - t0)
        if self.want_rdd():
            t0 = time.perf_counter()
            rdd = df.rdd.map(lambda r: (r.features, r.label)).persist(StorageLevel.MEMORY_AND_DISK)
            n = rdd.count()
            assert n == o.rows, (n, o.rows)
            self.rdd = rdd
            log.info("RDD[(features list, label)] cached: %d rows, %d partitions (%.1fs)",
                     n, rdd.getNumPartitions(), time.perf_counter() - t0)

    def want_rdd(self):
        return "B1" in self.opts.bench and ({"tfos", "tfos_nb", "ceiling"} & set(self.opts.only))

    def ensure_spark(self):
        """TFoS calls sc.stop() + sys.exit(1) on a node error: rebuild the session if that happened."""
        sc = self.spark.sparkContext if self.spark is not None else None
        if sc is not None and getattr(sc, "_jsc", None) is not None:
            return
        log.warning("Spark session was stopped (TFoS does that on errors): starting a new one")
        try:
            from tensorflowonspark import TFCluster as _T
            _T.tf_status.clear()  # TFoS module-global error state poisons every later run
        except Exception:
            pass
        self.spark = None
        self.start_spark()
        self.build_data()

    # ---- row-count check -----------------------------------------------------------
    def _reset_counts(self):
        for p in glob.glob(os.path.join(self.count_dir, "*")):
            try:
                os.remove(p)
            except OSError:
                pass

    def _read_counts(self, tag, nodes=2, wait=10.0):
        deadline = time.time() + wait
        while True:
            files = glob.glob(os.path.join(self.count_dir, tag + "-*.cnt"))
            if len(files) >= nodes or time.time() > deadline:
                break
            time.sleep(0.2)
        total = 0
        for p in files:
            try:
                total += int(open(p).read().strip() or 0)
            except Exception:
                pass
        return total, len(files)

    # ---- variants ------------------------------------------------------------------
    def _feed_args(self):
        return {"batch": BATCH, "count_dir": self.count_dir}

    def b1_tfos(self):
        from tensorflowonspark import TFCluster
        sc = self.spark.sparkContext
        self._reset_counts()
        t0 = time.perf_counter()
        cluster = TFCluster.run(sc, tfos_feed_fun, self._feed_args(), 2, num_ps=0, tensorboard=False,
                                input_mode=TFCluster.InputMode.SPARK, master_node="chief",
                                reservation_timeout=self.opts.reservation_timeout)
        t_start = time.perf_counter() - t0
        t_train = t_shut = None
        try:
            t1 = time.perf_counter()
            cluster.train(self.rdd, num_epochs=1, feed_timeout=self.opts.feed_timeout)
            t_train = time.perf_counter() - t1
        finally:
            t2 = time.perf_counter()
            try:
                cluster.shutdown()
            finally:
                signal.alarm(0)  # TFoS leaves a 3-day SIGALRM armed after shutdown()
            t_shut = time.perf_counter() - t2
        seen, nodes = self._read_counts("tfos")
        return {"rows/s": self.opts.rows / t_train, "train s": t_train, "start s": t_start,
                "shutdown s": t_shut, "_seen": (seen, nodes)}

    def _b1_tfos_nb(self, data, fun=tfos_nb_feed_fun):
        from tfos_nb import TFCluster
        sc = self.spark.sparkContext
        self._reset_counts()
        t0 = time.perf_counter()
        cluster = TFCluster.run(sc, fun, self._feed_args(), 2, num_ps=0, tensorboard=False,
                                input_mode=TFCluster.InputMode.SPARK, master_node="chief")
        t_start = time.perf_counter() - t0
        t_train = t_shut = None
        try:
            t1 = time.perf_counter()
            cluster.train(data, num_epochs=1, feed_timeout=self.opts.feed_timeout)
            t_train = time.perf_counter() - t1
        except BaseException:
            _dump_tfos_nb_state(cluster)
            raise
        finally:
            t2 = time.perf_counter()
            cluster.shutdown()
            t_shut = time.perf_counter() - t2
        seen, nodes = self._read_counts("tfos_nb")
        return {"rows/s": self.opts.rows / t_train, "train s": t_train, "start s": t_start,
                "shutdown s": t_shut, "_seen": (seen, nodes)}

    def b1_tfos_nb_rdd(self):
        return self._b1_tfos_nb(self.rdd)

    def b1_tfos_nb_df(self):
        return self._b1_tfos_nb(self.df)

    def b1_tfos_nb_rdd_rows(self):
        return self._b1_tfos_nb(self.rdd, tfos_nb_rows_fun)

    def b1_tfos_nb_df_rows(self):
        return self._b1_tfos_nb(self.df, tfos_nb_rows_fun)

    def b1_rdd_ceiling(self):
        t0 = time.perf_counter()
        out = self.rdd.mapPartitions(_rdd_ceiling_fn).collect()
        dt = time.perf_counter() - t0
        return {"rows/s": self.opts.rows / dt, "train s": dt, "_seen": (sum(out), None)}

    def b1_ceiling(self):
        t0 = time.perf_counter()
        out = self.df.mapInArrow(_ceiling_fn, "n long").collect()
        dt = time.perf_counter() - t0
        seen = sum(r.n for r in out)
        return {"rows/s": self.opts.rows / dt, "train s": dt, "_seen": (seen, None)}

    def _b4a(self, mod):
        sc = self.spark.sparkContext
        t0 = time.perf_counter()
        cluster = mod.run(sc, noop_fun, {}, 2, num_ps=0, tensorboard=False,
                          input_mode=mod.InputMode.TENSORFLOW, master_node="chief",
                          **({"reservation_timeout": self.opts.reservation_timeout}
                             if mod.__name__.startswith("tensorflowonspark") else {}))
        t_start = time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            cluster.shutdown()
        finally:
            signal.alarm(0)
        t_shut = time.perf_counter() - t1
        return {"start+shutdown s": t_start + t_shut, "start s": t_start, "shutdown s": t_shut}

    def b4a_tfos(self):
        from tensorflowonspark import TFCluster
        return self._b4a(TFCluster)

    def b4a_tfos_nb(self):
        from tfos_nb import TFCluster
        return self._b4a(TFCluster)


# (key, benchmark, variant label, framework, method, primary metric, extra metrics)
VARIANTS = [
    ("b1_tfos", "B1", "TFoS 2.2.5 (RDD)", "tfos", "b1_tfos", "rows/s", ["start s", "shutdown s"]),
    ("b1_nb_rdd", "B1", "tfos_nb (RDD)", "tfos_nb", "b1_tfos_nb_rdd", "rows/s", ["start s", "shutdown s"]),
    ("b1_nb_df", "B1", "tfos_nb (DataFrame)", "tfos_nb", "b1_tfos_nb_df", "rows/s", ["start s", "shutdown s"]),
    ("b1_nb_rdd_rows", "B1", "tfos_nb (RDD) rows: next_batch + np.asarray", "tfos_nb", "b1_tfos_nb_rdd_rows",
     "rows/s", ["start s", "shutdown s"]),
    ("b1_nb_df_rows", "B1", "tfos_nb (DataFrame) rows: next_batch + np.asarray", "tfos_nb", "b1_tfos_nb_df_rows",
     "rows/s", ["start s", "shutdown s"]),
    ("b1_ceiling", "B1", "ceiling: df.mapInArrow -> numpy", "ceiling", "b1_ceiling", "rows/s", []),
    ("b1_rdd_ceiling", "B1", "RDD ceiling: rdd.mapPartitions -> numpy batches", "ceiling", "b1_rdd_ceiling",
     "rows/s", []),
    ("b4a_tfos", "B4a", "TFoS 2.2.5", "tfos", "b4a_tfos", "start+shutdown s", ["start s", "shutdown s"]),
    ("b4a_nb", "B4a", "tfos_nb", "tfos_nb", "b4a_tfos_nb", "start+shutdown s", ["start s", "shutdown s"]),
]


# Which ceiling a B1 variant is compared with (default: b1_ceiling), and its own target where it differs.
CEILING_OF = {"b1_nb_rdd_rows": "b1_rdd_ceiling", "b1_rdd_ceiling": None}
TARGET_OF = {"b1_nb_rdd_rows": ("≥0.8× RDD ceiling", None, 0.8),
             "b1_nb_df_rows": ("≥10× TFoS, ≥0.5× ceiling", 10, 0.5)}


def one_line(e):
    if isinstance(e, VariantFailed):
        return str(e)
    s = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
    s = s.replace("|", "/")
    return s[:200]


def run_variant(bench, v, rep_label, results, failures, notes):
    key, bname, label, _fw, meth, _prim, _extra = v
    tag = "%s %s [%s]" % (bname, label, rep_label)
    log.info("---- %s", tag)
    bench.ensure_spark()
    wd = Watchdog(bench, bench.opts.timeout, tag)
    try:
        with wd:
            m = getattr(bench, meth)()
    except KeyboardInterrupt:
        if not wd.fired:
            raise
        failures[key] = "timeout after %ss (watchdog)" % bench.opts.timeout
        log.error("%s: FAILED (timeout)", tag)
        return
    except SystemExit as e:  # TFoS sys.exit(1)s after node errors (and stops the SparkContext)
        failures[key] = "SystemExit(%s) from the framework (TFoS stops Spark on node errors)" % e.code
        log.error("%s: FAILED\n%s", tag, traceback.format_exc())
        return
    except Exception as e:
        failures[key] = ("timeout after %ss (watchdog): " % bench.opts.timeout if wd.fired else "") + one_line(e)
        log.error("%s: FAILED\n%s", tag, traceback.format_exc())
        return
    seen = m.pop("_seen", None)
    if seen is not None:
        n, nodes = seen
        if n != bench.opts.rows:
            msg = "%s %s: nodes reported %d rows consumed, expected %d%s" % (
                label, rep_label, n, bench.opts.rows, "" if nodes is None else " (%d count files)" % nodes)
            notes.append(msg)
            log.warning(msg)
    log.info("%s: %s", tag, ", ".join("%s=%s" % (k, fmt(k, x)) for k, x in m.items()))
    if rep_label != "warm-up":
        for k, x in m.items():
            results.setdefault(key, {}).setdefault(k, []).append(x)


def fmt(metric, x):
    if x is None:
        return "–"
    if metric.endswith("rows/s"):
        return f"{x:,.0f}"
    return "%.2f s" % x


def fmt_ratio(r):
    return "–" if r is None else ("%.2f×" % r if r < 10 else "%.1f×" % r)


def med(results, key, metric):
    xs = results.get(key, {}).get(metric)
    return statistics.median(xs) if xs else None


def build_table(bench, results, failures, selected):
    rows = []
    hdr = ("| benchmark | variant | metric | median | min–max | n | ratio vs TFoS | ratio vs ceiling | target |\n"
           "|---|---|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        key, bname, label, fw, _m, prim, extra = v
        if key not in selected:
            continue
        ref_key = "b1_tfos" if bname == "B1" else "b4a_tfos"
        for metric in [prim] + extra:
            xs = results.get(key, {}).get(metric, [])
            if key in failures and metric == prim:
                cell = "FAILED: " + failures[key]
                if xs:
                    cell += " (after %d ok runs)" % len(xs)
                rows.append("| %s | %s | %s | %s | | | | | %s |" % (bname, label, metric, cell,
                                                                     target_text(bname, fw, metric, key)))
                continue
            if not xs:
                if key in failures:
                    continue
                rows.append("| %s | %s | %s | – | | 0 | | | |" % (bname, label, metric))
                continue
            m = statistics.median(xs)
            rng = "%s – %s" % (fmt(metric, min(xs)), fmt(metric, max(xs)))
            r_ref = r_ceil = None
            if key != ref_key:
                ref = med(results, ref_key, metric)
                r_ref = (m / ref) if ref else None
            ceil_key = CEILING_OF.get(key, "b1_ceiling")
            if bname == "B1" and metric == "rows/s" and ceil_key and key != ceil_key:
                c = med(results, ceil_key, metric)
                r_ceil = (m / c) if c else None
            tgt = target_text(bname, fw, metric, key)
            verdict = ""
            if tgt and fw == "tfos_nb":
                verdict = verdict_text(bname, metric, m, r_ref, r_ceil, key)
            rows.append("| %s | %s | %s | %s | %s | %d | %s | %s | %s%s |" % (
                bname, label, metric, fmt(metric, m), rng, len(xs), fmt_ratio(r_ref),
                fmt_ratio(r_ceil), tgt, verdict))
    return hdr + "\n" + "\n".join(rows)


def target_text(bname, fw, metric, key=None):
    if fw != "tfos_nb":
        return ""
    if key in TARGET_OF and metric == "rows/s":
        return TARGET_OF[key][0]
    if bname == "B1" and metric == "rows/s":
        return "≥10× TFoS, ≥0.5× ceiling"
    if bname == "B4a" and metric == "start+shutdown s":
        return "≤5 s, ≤0.5× TFoS"
    return ""


def verdict_text(bname, metric, m, r_ref, r_ceil, key=None):
    """' — **met**' / ' — **not met**' / ' — (incomplete)' from the checks that can be evaluated."""
    if key in TARGET_OF and metric == "rows/s":
        _, min_ref, min_ceil = TARGET_OF[key]
        checks = [None if r_ceil is None else r_ceil >= min_ceil]
        if min_ref is not None:
            checks.append(None if r_ref is None else r_ref >= min_ref)
    elif bname == "B1" and metric == "rows/s":
        checks = [None if r_ref is None else r_ref >= 10, None if r_ceil is None else r_ceil >= 0.5]
    elif bname == "B4a" and metric == "start+shutdown s":
        checks = [m <= 5.0, None if r_ref is None else r_ref <= 0.5]
    else:
        return ""
    if any(c is False for c in checks):
        return " — **not met**"
    if all(c is True for c in checks):
        return " — **met**"
    return " — (incomplete)"


def machine_lines(opts):
    try:
        mem_kb = int([l for l in open("/proc/meminfo") if l.startswith("MemTotal")][0].split()[1])
        mem = "%.1f GiB" % (mem_kb / 1024 / 1024)
    except Exception:
        mem = "?"
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except Exception:
        java = "?"
    vers = []
    for mod in ("pyspark", "tensorflowonspark", "tfos_nb", "pyarrow", "numpy"):
        try:
            from importlib.metadata import version
            vers.append("%s %s" % (mod, version(mod)))
        except Exception:
            if mod == "tfos_nb":
                try:
                    from tfos_nb import TFCluster  # noqa: F401
                    vers.append("tfos_nb (source tree)")
                except Exception as e:
                    vers.append("tfos_nb not importable (%s)" % one_line(e))
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except Exception:
        cpu = platform.processor() or "?"
    cmd = os.environ.get("BENCH_CMD") or " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    return [
        "- date: %s" % _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "- machine: `nproc`=%d (%s), memory %s, %s, Python %s, %s" % (
            os.cpu_count() or 0, cpu, mem, platform.platform(terse=True), platform.python_version(), java),
        "- versions: %s" % ", ".join(vers),
        "- command: `%s`" % cmd,
        "- setting: master `%s`, spark.executor.memory=%s, spark.ui.enabled=false, executors' "
        "TF_NUM_INTRAOP_THREADS=TF_NUM_INTEROP_THREADS=OMP_NUM_THREADS=1; %d rows x %d float32 + int label, "
        "%d partitions, cached and counted; batch %d; 1 warm-up + %d alternating runs per variant" % (
            opts.master, opts.executor_memory, opts.rows, NUM_FEATURES, opts.partitions, BATCH, opts.runs),
    ]


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
    bad = set(o.only) - {"tfos", "tfos_nb", "ceiling"}
    if bad:
        p.error("unknown --only value(s): %s" % ", ".join(sorted(bad)))
    bad = set(o.bench) - {"B1", "B4a"}
    if bad:
        p.error("unknown --bench value(s): %s" % ", ".join(sorted(bad)))
    if o.runs < 1:
        p.error("--runs must be >= 1")
    full = (o.rows == DEFAULT_ROWS and o.runs >= DEFAULT_RUNS and not o.no_warmup
            and set(o.only) == {"tfos", "tfos_nb", "ceiling"} and set(o.bench) == {"B1", "B4a"}
            and o.partitions == DEFAULT_PARTS)
    o.partial_out = os.path.join(HERE, "results", "partial.md")
    o.out_is_default = o.out is None
    if o.out is None:
        o.out = os.path.join(HERE, "results", "latest.md") if full else o.partial_out
    return o


def main(argv=None):
    opts = parse_args(argv)
    logging.basicConfig(level=logging.INFO if not opts.verbose else logging.DEBUG,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if not opts.verbose:
        logging.getLogger("tensorflowonspark").setLevel(logging.WARNING)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)

    selected = [v[0] for v in VARIANTS if v[1] in opts.bench and v[3] in opts.only]
    variants = [v for v in VARIANTS if v[0] in selected]
    results, failures, notes = {}, {}, []
    bench = Bench(opts)
    t_all = time.perf_counter()
    interrupted = False
    try:
        bench.start_spark()
        bench.build_data()
        reps = ([] if opts.no_warmup else ["warm-up"]) + ["run %d" % (i + 1) for i in range(opts.runs)]
        for rep in reps:
            for v in variants:
                if v[0] in failures:
                    continue  # a failed variant is not retried (it could hang again)
                run_variant(bench, v, rep, results, failures, notes)
    except BaseException:
        interrupted = True  # an interrupted run never replaces results/latest.md
        raise
    finally:
        table = build_table(bench, results, failures, selected)
        lines = ["# B1 feeding throughput / B4a control plane — tfos_nb vs TensorFlowOnSpark 2.2.5", ""]
        lines += machine_lines(opts)
        lines += ["- total wall: %.0f s" % (time.perf_counter() - t_all), "", table, ""]
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
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
            with open(opts.out, "w") as f:
                f.write(text)
            log.info("wrote %s", opts.out)
        except Exception as e:
            log.error("could not write %s: %s", opts.out, e)
        try:
            if bench.spark is not None:
                bench.spark.stop()
        except Exception:
            pass
        try:
            import shutil
            shutil.rmtree(bench.count_dir, ignore_errors=True)
        except Exception:
            pass
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
