#!/usr/bin/env python
"""B2 -- training parity: single-process Keras, tfos_nb and TensorFlowOnSpark 2.2.5, side by side.

One Spark application (``local-cluster[2,1,3072]`` by default); the variants alternate per
repetition after a warm-up of each; medians of ``--runs``.  Every variant trains the same Keras
MLP 784-128-10 (Adam, global batch 128) on the same seeded synthetic 10-class data and is scored
on the same held-out rows:

* ``single``  -- ``model.fit`` in this process (the same Keras as the nodes: ``tf_keras``);
* ``native``  -- the same program in 2 processes started by hand with ``TF_CONFIG``, each with its half
  of the rows in memory, 64 rows a worker a step, every row once an epoch (``native_b128``: 128 a worker, a
  global batch of 256; ``native_untuned``: with the tf.data settings ``as_dataset`` gives, autotuning off;
  ``native_generator``: untuned, the rows read through ``from_generator``, a batch a Python call;
  ``native_generator_steps``: the same, its length told; ``native_generator_chunks``: 8 batches a Python call);
* ``tfos_nb`` -- its documented form: ``TFCluster.run`` + ``cluster.train(df, num_epochs=E)``, the
  node doing ``model.fit(ctx.get_data_feed().as_dataset(...), epochs=E)`` under
  MultiWorkerMirroredStrategy (``tfos_nb_cache``: ``as_dataset(cache=True)``, one epoch fed;
  ``tfos_nb_serial``: one epoch's feeding job at a time; ``tfos_nb_keras3``: the model written with
  ``import keras``, Keras 3, whose trainer the nodes repair for MultiWorkerMirroredStrategy, beside
  ``single_keras3``, single-process Keras 3);
* ``tfos``    -- TensorFlowOnSpark 2.2.5's documented form (its ``mnist_spark`` example):
  ``from_generator`` over ``DataFeed.next_batch(1)``, ``steps_per_epoch`` capped at 90 %, ``terminate()``;
  ``tfos_batched`` asks ``next_batch`` for whole batches.

Wall time is run -> train -> shutdown.  After the timed runs, one more tfos_nb run (not timed;
``--no-breakdown`` leaves it out) times its steps (``step``: mean wall time of a step in the epochs after the
first) and, after training, measures on the same cluster what a step is made of (``model.step_parts``:
``compute``, ``allreduce``, ``data``; ``other`` = step - compute - allreduce: Keras/Python overhead plus data
stalls).

Run: ``bash benchmarks/run.sh b2`` (creates ``.venv-bench``), or directly
``.venv-bench/bin/python benchmarks/bench_training.py --rows 40000 --epochs 3 --runs 3``.
Writes ``benchmarks/results/b2-latest.md``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from unittest import mock

import data
import harness
import memory
import model as model_module
import native
from model import accuracy as model_accuracy
from model import build_model, later_epochs_timer, step_parts

FEATURES = 784
GLOBAL_BATCH = 128
NODES = 2

log = logging.getLogger("bench")


# Node functions (shipped by cloudpickle; self-contained but for the model module, shipped by value)

def tfos_nb_main(args, ctx):
    """tfos_nb's documented form, plus (optionally) the per-step breakdown."""
    import json
    import os
    import time

    t_enter = time.time()
    import tensorflow as tf

    from tfos_nb import compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    t_strategy = time.time()
    with strategy.scope():
        model = args["build_model"](args["model"], keras3=args.get("keras3", False))
    t_model = time.time()
    if args.get("keras3"):
        import keras as callbacks_keras  # Keras 3 takes its own callbacks only
    else:
        callbacks_keras = tf.keras
    feed = ctx.get_data_feed()
    # waits for the first batch; cache=True keeps the first epoch on the node for the later ones
    ds = feed.as_dataset(batch_size=args["batch"], columns=(0, 1), cache=args.get("cache", False))
    t_data = time.time()

    timer = later_epochs_timer(callbacks_keras)
    callbacks = [ctx.progress_callback(), timer] if args["progress"] else [timer]
    t_fit = time.time()
    model.fit(ds, epochs=args["epochs"], verbose=0, callbacks=callbacks)
    t_fit_end = time.time()
    if args.get("keras3"):  # every worker saves (a collective); only the chief's copy is kept
        model.save(args["export_dir"] + ".keras" if ctx.is_chief else os.path.join(args["out_dir"], "w.keras"))
    else:
        compat.export_saved_model(model, args["export_dir"], ctx.is_chief)
    phases = {"enter": t_enter, "import+strategy": t_strategy - t_enter, "model": t_model - t_strategy,
              "wait for first batch": t_data - t_model,
              "first epoch": getattr(timer, "t_epoch1", t_fit_end) - t_fit,
              "later epochs": t_fit_end - getattr(timer, "t_epoch1", t_fit_end),
              "export": time.time() - t_fit_end}
    out = {"fit": t_fit_end - t_fit, "step": timer.wall / timer.steps if timer.steps else None,
           "steps": timer.steps if args["breakdown"] else timer.total, "phases": phases}
    if args["breakdown"]:
        out.update({"fit_end": t_fit_end, "epoch_ends": timer.ends},
                   **step_parts(strategy, model, args["model"], args["batch"], ds))
    with open(os.path.join(args["out_dir"], "node-%d.json" % ctx.worker_num), "w") as f:
        json.dump(out, f)
    return None


def tfos_main(args, ctx):
    """TensorFlowOnSpark 2.2.5's mnist_spark form: ``from_generator`` over ``DataFeed.next_batch``.

    ``args["rows_per_call"]`` 1 is its example's idiom (one row per call, batched by tf.data);
    a larger value asks for whole batches (``next_batch(n)``), the faster idiom a user can write.
    """
    import json
    import os
    import time

    import numpy as np
    import tensorflow as tf
    from tensorflowonspark import TFNode, compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    n = args["rows_per_call"]

    def rows():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch) > 0:
                example = batch[0]
                yield (np.array(example[0]).astype(np.float32), np.array(example[1]).astype(np.int32))
            else:
                return

    def batches():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(n)
            if len(batch) > 0:
                yield (np.asarray([r[0] for r in batch], dtype=np.float32), np.asarray([r[1] for r in batch], dtype=np.int32))
            else:
                return

    if n == 1:
        ds = tf.data.Dataset.from_generator(rows, (tf.float32, tf.int32),
                                            (tf.TensorShape([784]), tf.TensorShape([]))).batch(args["batch"])
    else:
        ds = tf.data.Dataset.from_generator(batches, (tf.float32, tf.int32),
                                            (tf.TensorShape([None, 784]), tf.TensorShape([None])))
    with strategy.scope():
        model = args["build_model"](args["model"])
    steps_per_epoch_per_worker = args["rows"] / (args["batch"] * ctx.num_workers)
    t_fit = time.time()
    model.fit(x=ds, epochs=args["epochs"], steps_per_epoch=int(steps_per_epoch_per_worker * 0.9), verbose=0)
    fit = time.time() - t_fit
    compat.export_saved_model(model, args["export_dir"], ctx.job_name == "chief")
    with open(os.path.join(args["out_dir"], "node-%d.json" % ctx.worker_num), "w") as f:
        json.dump({"fit": fit}, f)
    tf_feed.terminate()


# The variants

class Bench:
    def __init__(self, opts):
        self.opts = opts
        self.tmp = tempfile.mkdtemp(prefix="tfos-b2-")
        self.spark = None

    def start(self):
        from pyspark import StorageLevel

        harness.prepare_env(legacy_keras=True)  # the nodes' Keras (tf_keras), here too
        harness.ship_by_value(model_module)
        o = self.opts
        x, y = data.labelled(o.rows + o.test_rows, o.seed, o.separation)
        self.x_train, self.y_train = x[:o.rows], y[:o.rows]
        self.x_test, self.y_test = x[o.rows:], y[o.rows:]
        parts = os.path.join(self.tmp, "train.parquet")
        data.write_partitions(self.x_train, self.y_train, parts, o.partitions)
        # --file-partitions: one Spark partition per file (--partitions of them); else Spark packs the files
        # into one partition per core
        biggest = max(os.path.getsize(os.path.join(parts, f)) for f in os.listdir(parts))
        self.spark = harness.spark_session(
            o.master, "tfos_nb-bench-training",
            conf={"spark.sql.files.maxPartitionBytes": str(biggest if o.file_partitions else 1 << 40)},
            executor_env={**harness.NODE_ENV, "TF_USE_LEGACY_KERAS": "1"})
        self.df = self.spark.read.parquet(parts)
        if not o.uncached:  # --uncached: every epoch (and train()'s count) reads the Parquet files again
            self.df = self.df.persist(StorageLevel.MEMORY_AND_DISK)
        assert self.df.count() == o.rows
        self._rdd = None  # Python rows for the TensorFlowOnSpark variants, made on first use (at 160k rows,
        # persisting it beside the DataFrame ran the executors out of memory: exit code 52)
        self.extra = self.df.limit(GLOBAL_BATCH * 40).repartition(NODES).persist(StorageLevel.MEMORY_AND_DISK)
        self.extra.count()
        log.info("data: %d train + %d test rows, %d partitions", o.rows, o.test_rows, self.df.rdd.getNumPartitions())

    @property
    def rdd(self):
        if self._rdd is None:
            self._rdd = data.row_rdd(self.df, self.opts.rows)
        return self._rdd

    def accuracy(self, export_dir):
        import tensorflow as tf

        if os.path.exists(export_dir + ".keras"):  # the Keras 3 variant's file
            import keras

            model = keras.models.load_model(export_dir + ".keras")
        else:
            model = tf.keras.models.load_model(export_dir)
        return model_accuracy(model, self.x_test, self.y_test)

    def _export_dir(self, tag):
        return os.path.join(self.tmp, "export-%s-%d" % (tag, time.monotonic_ns()))

    def single(self, keras3=False):
        if keras3:
            import keras
        else:
            import tensorflow as tf

            keras = tf.keras
        keras.utils.set_random_seed(self.opts.seed)
        t0 = time.perf_counter()
        model = build_model(self.opts.model, keras3=keras3)
        model.fit(self.x_train, self.y_train, batch_size=GLOBAL_BATCH, epochs=self.opts.epochs, verbose=0)
        wall = time.perf_counter() - t0
        steps = -(-self.opts.rows // GLOBAL_BATCH) * self.opts.epochs
        return {"wall s": wall, "fit s": wall, "steps": steps, "accuracy": model_accuracy(model, self.x_test, self.y_test)}

    def tfos_nb(self, breakdown=False, cache=False, keras3=False, backup=False, deterministic=False, serial=False,
                unknown_length=False):
        """``backup``: the chief's backups and each node's element log on, as in a job with retries (their cost);
        ``deterministic``: op determinism, partitions fed in a fixed order (early ones kept aside); ``serial``: as
        before epoch pipelining, the next epoch's job starts when this one ended; ``unknown_length``: as before the
        count, epochs of unknown length (TFOS_KNOWN_LENGTH=0: TensorFlow's per-step has-data check on)."""
        from tfos_nb import TFCluster
        from tfos_nb.runtime.recovery import ledger

        folder = tempfile.mkdtemp(dir=self.tmp) if backup else None
        env = {ledger.ENV_DIR: folder} if folder else None
        run_kwargs = {"deterministic": True, "seed": self.opts.seed} if deterministic else {}
        export_dir = self._export_dir("nb")
        out_dir = tempfile.mkdtemp(dir=self.tmp)
        # as_dataset's batch is the global batch under MWMS (Keras splits it across the replicas)
        args = {"batch": GLOBAL_BATCH, "epochs": self.opts.epochs, "export_dir": export_dir,
                "breakdown": breakdown, "out_dir": out_dir, "build_model": build_model, "model": self.opts.model,
                "progress": os.environ.get("BENCH_PROGRESS", "1") == "1", "cache": cache, "keras3": keras3}
        with mock.patch.dict(os.environ, {**({"TFOS_FEED_PIPELINE": "0"} if serial else {}),
                                          **({"TFOS_KNOWN_LENGTH": "0"} if unknown_length else {})}):
            t0, w0 = time.perf_counter(), time.time()
            cluster = TFCluster.run(self.spark.sparkContext, tfos_nb_main, args, NODES, num_ps=0,
                                    input_mode=TFCluster.InputMode.SPARK, master_node="chief", env=env, **run_kwargs)
            t_run = time.perf_counter() - t0
            try:
                # with cache=True one epoch crosses Spark; the nodes replay it for the others
                cluster.train(self.df, num_epochs=1 if cache else self.opts.epochs)
                if breakdown:
                    cluster.train(self.extra, num_epochs=1)  # drained by the nodes with no model
            finally:
                t1 = time.perf_counter()
                cluster.shutdown()
                t_shutdown = time.perf_counter() - t1
        wall = time.perf_counter() - t0
        reports = sorted(f for f in os.listdir(out_dir) if f.endswith(".json"))  # a Keras 3 worker's w.keras too
        nodes = [json.load(open(os.path.join(out_dir, f))) for f in reports]
        res = {"wall s": wall, "fit s": nodes[0]["fit"], "accuracy": self.accuracy(export_dir)}
        if nodes[0].get("steps"):
            res["steps"] = nodes[0]["steps"]
        if folder:
            done = ledger.backups(folder)
            res["backups"] = done[0].seq if done else 0
        if nodes[0].get("step") and not breakdown:
            res["step ms"] = 1000 * nodes[0]["step"]
        chief = nodes[0]["phases"]
        log.info("tfos_nb phases (s, the chief): TFCluster.run() %.1f, to the node function %.1f, %s, "
                 "train() to shutdown() %.1f, shutdown() %.1f", t_run, chief["enter"] - w0,
                 ", ".join("%s %.1f" % kv for kv in chief.items() if kv[0] != "enter"), t1 - t0 - t_run, t_shutdown)
        if breakdown:
            for i, n in enumerate(nodes):
                log.info("node %d: fit ended %+.2f s after node 0's, phases %s; epochs ended at %s s after node 0's start",
                         i, n["fit_end"] - nodes[0]["fit_end"],
                         ", ".join("%s %.2f" % kv for kv in n["phases"].items() if kv[0] != "enter"),
                         ", ".join("%.2f" % (t - nodes[0]["phases"]["enter"]) for t in n.get("epoch_ends", [])))
            for k in ("step", "compute", "allreduce", "data"):
                vals = [n[k] for n in nodes if n.get(k) is not None]
                if vals:
                    res[k + " ms"] = 1000 * statistics.mean(vals)
            if "step ms" in res and "compute ms" in res and "allreduce ms" in res:
                res["other ms"] = res["step ms"] - res["compute ms"] - res["allreduce ms"]
            self.phases = {"TFCluster.run()": t_run, "run() to node function": chief["enter"] - w0,
                           **{k: v for k, v in chief.items() if k != "enter"}, "shutdown()": t_shutdown}
        return res

    def spark_read(self):
        """Spark alone, the floor of any program that reads the DataFrame from Spark every epoch: each epoch, the
        same cached DataFrame read by Python workers (``mapInArrow``, Spark's Arrow path, as tfos_nb's feeding
        tasks read it) that count its rows and drop them.  No TensorFlow; ``steps`` is the training run's."""
        def sink(batches):
            import pyarrow as pa

            n = 0
            for b in batches:
                n += b.num_rows
            yield pa.RecordBatch.from_pydict({"n": [n]}, schema=pa.schema([("n", pa.int64())]))

        t0 = time.perf_counter()
        rows = sum(sum(r["n"] for r in self.df.mapInArrow(sink, "n long").collect()) for _ in range(self.opts.epochs))
        wall = time.perf_counter() - t0
        assert rows == self.opts.rows * self.opts.epochs, rows
        return {"wall s": wall, "steps": -(-self.opts.rows // GLOBAL_BATCH) * self.opts.epochs}

    def native(self, per_worker_batch=GLOBAL_BATCH // NODES, untuned=False, source="slices"):
        """The same program in NODES processes started by hand with TF_CONFIG, each with its half of the rows.

        Each process trains ``per_worker_batch`` rows a step, every row of its half once an epoch
        (``native.node``): 64 on each of 2 workers is the global batch of 128 that ``single`` and tfos_nb's
        ``as_dataset(batch_size=128)`` train on.  ``source``: how a worker reads its rows (``native.INPUTS``).
        """
        run_dir = tempfile.mkdtemp(dir=self.tmp)
        export_dir = self._export_dir("native")
        if not hasattr(self, "native_halves"):
            self.native_halves = native.write_shares(self.x_train, self.y_train, NODES, self.tmp)
        wall, chief = native.train(self.native_halves, run_dir, {
            "batch": per_worker_batch, "epochs": self.opts.epochs, "model": self.opts.model, "untuned": untuned,
            "input": source,
            "export_dir": export_dir})
        return {"wall s": wall, "fit s": chief["fit"], "accuracy": self.accuracy(export_dir), "steps": chief["steps"],
                **({"step ms": 1000 * chief["step"]} if chief["step"] else {})}

    def tfos(self, rows_per_call=1):
        from tensorflowonspark import TFCluster

        export_dir = self._export_dir("tfos")
        out_dir = tempfile.mkdtemp(dir=self.tmp)
        args = {"batch": GLOBAL_BATCH // NODES, "epochs": self.opts.epochs, "rows": self.opts.rows,
                "export_dir": export_dir, "build_model": build_model, "model": self.opts.model,
                "rows_per_call": rows_per_call, "out_dir": out_dir}
        t0 = time.perf_counter()
        cluster = TFCluster.run(self.spark.sparkContext, tfos_main, args, NODES, num_ps=0, tensorboard=False,
                                input_mode=TFCluster.InputMode.SPARK, master_node="chief")
        try:
            cluster.train(self.rdd, num_epochs=self.opts.epochs)
        finally:
            harness.shutdown(cluster)
        wall = time.perf_counter() - t0
        fit = json.load(open(os.path.join(out_dir, sorted(os.listdir(out_dir))[0])))["fit"]
        return {"wall s": wall, "fit s": fit, "accuracy": self.accuracy(export_dir)}


# key: (its name in the report, the Bench method that runs it, the method's arguments)
VARIANTS = {
    "single": ("single-process Keras", "single", {}),
    "native": ("native MWMS (the same program, %d processes started by hand with TF_CONFIG)" % NODES, "native", {}),
    "native_untuned": ("native MWMS with tfos_nb's tf.data settings (autotuning off, on the per-device prefetch too)",
                       "native", {"untuned": True}),
    "native_generator": ("native MWMS reading its rows in memory through from_generator, a batch of %d an element "
                         "(as as_dataset read a feed before it took 8 at once), tfos_nb's tf.data settings" % GLOBAL_BATCH, "native",
                         {"untuned": True, "source": "generator"}),
    "native_generator_steps": ("native MWMS reading its rows through from_generator, 64 rows a worker an element, "
                               "repeated, with steps_per_epoch (its length told, as native's)", "native",
                               {"untuned": True, "source": "generator_steps"}),
    "native_once": ("native MWMS reading its rows from_tensor_slices, a global batch an element, its length made "
                    "unknown (as as_dataset, with no Python in the pipeline)", "native", {"untuned": True, "source": "slices_once"}),
    "native_generator_chunks": ("native MWMS reading its rows through from_generator, %d batches of %d a Python call, "
                                "batched again by tf.data (of unknown length), as as_dataset reads a feed"
                                % (native.CHUNK, GLOBAL_BATCH), "native",
                                {"untuned": True, "source": "generator_chunks"}),
    "native_b128": ("native MWMS with %d rows a worker a step (a global batch of %d: half the steps)"
                    % (GLOBAL_BATCH, GLOBAL_BATCH * NODES), "native", {"per_worker_batch": GLOBAL_BATCH}),
    "tfos_nb": ("tfos_nb (as_dataset + model.fit)", "tfos_nb", {}),
    "spark_read": ("Spark alone: every epoch's rows read into Python workers and dropped (no training)", "spark_read", {}),
    "tfos_nb_cache": ("tfos_nb, as_dataset(cache=True): one epoch fed, replayed on the nodes", "tfos_nb", {"cache": True}),
    "tfos_nb_keras3": ("tfos_nb, the model written for Keras 3 (import keras)", "tfos_nb", {"keras3": True}),
    "single_keras3": ("single-process Keras 3", "single", {"keras3": True}),
    "tfos": ("TensorFlowOnSpark 2.2.5, its example's idiom (from_generator over next_batch(1))", "tfos", {}),
    "tfos_batched": ("TensorFlowOnSpark 2.2.5, whole batches (from_generator over next_batch(%d))" % (GLOBAL_BATCH // NODES),
                     "tfos", {"rows_per_call": GLOBAL_BATCH // NODES}),
    "tfos_nb_unknown": ("tfos_nb with epochs of unknown length (TFOS_KNOWN_LENGTH=0: no count, TensorFlow's "
                        "per-step check that every worker has data)", "tfos_nb", {"unknown_length": True}),
    "tfos_nb_serial": ("tfos_nb, one epoch's feeding job at a time (TFOS_FEED_PIPELINE=0)", "tfos_nb", {"serial": True}),
    "tfos_nb_backup": ("tfos_nb with retries' backups (the chief's, at most 2 % of the time) and the nodes' element logs",
                       "tfos_nb", {"backup": True}),
    "tfos_nb_deterministic": ("tfos_nb in deterministic mode (op determinism, a fixed feed)", "tfos_nb",
                              {"deterministic": True}),
}


def table(rounds, opts, phases=None):
    med = rounds.median

    def rng(key, m):
        sp = rounds.spread(key, m)
        return "%.1f–%.1f" % (sp.min, sp.max) if sp else ""

    # the ratios are against the strongest native measured: with tfos_nb's tf.data settings where it ran (the program
    # as written sometimes waits about 7 s as its iterator is freed: docs/benchmarks.md, B2)
    ref = "native_untuned" if med("native_untuned", "fit s") is not None else "native"
    lines = harness.table(["variant", "wall (median)", "range", "`model.fit` (chief)", "range", "steps", "accuracy",
                           "wall vs %s" % ref, "fit vs %s" % ref], [])
    ref_wall, ref_fit = med(ref, "wall s"), med(ref, "fit s")
    for key in opts.only:
        if key in rounds.failures:
            lines.append("| %s | FAILED: %s | | | | | | | |" % (VARIANTS[key][0], rounds.failures[key]))
            continue
        w = med(key, "wall s")
        if w is None:
            continue
        f = med(key, "fit s")
        st = med(key, "steps")
        acc = med(key, "accuracy")
        lines.append("| %s | %.1f s | %s s | %s | %s | %s | %s | %s | %s |" % (
            VARIANTS[key][0], w, rng(key, "wall s"), "%.1f s" % f if f is not None else "",
            rng(key, "fit s") + " s" if f is not None else "", "%d" % st if st else "",
            "%.3f" % acc if acc is not None else "",
            "%.2f×" % (w / ref_wall) if ref_wall and key != ref else "",
            "%.2f×" % (f / ref_fit) if ref_fit and f is not None and key != ref else ""))
    cpu_lines = []
    for key in rounds.results:
        st = med(key, "steps")
        if not st:
            continue
        parts = [(g, med(key, f"cpu {g} s")) for g, _ in memory.CPU_GROUPS] + [("the machine", med(key, "cpu s"))]
        jvm = [(k, med(key, f"cpu JVM {k} s")) for k in [*(k for k, _ in memory.JVM_THREADS), "other"]]
        cpu_lines.append("%s: %s (JVMs' threads: %s)" % (
            key, ", ".join("%s %.2f" % (g, 1000 * v / st) for g, v in parts if v is not None),
            ", ".join("%s %.2f" % (k, 1000 * v / st) for k, v in jvm if v is not None)))
    if cpu_lines:
        lines += ["", "CPU a training step (ms, medians over the runs, whole run; the processes by group, the "
                  "machine's busy time, and the Spark JVMs' CPU by thread):", ""] + ["- " + c for c in cpu_lines]
    steps = [(k, med(k, "step ms")) for k in ("native", "tfos_nb") if med(k, "step ms")]
    if steps:
        lines += ["", "a training step (ms, the chief, epochs after the first): " + ", ".join("%s %.1f" % kv for kv in steps)]
    if opts.breakdown and "tfos_nb" in rounds.results:
        parts = [(k, med("tfos_nb", k + " ms")) for k in ("step", "compute", "allreduce", "other", "data")]
        lines += ["", "tfos_nb per-step breakdown (ms, mean over nodes, one extra run): " + ", ".join(
            "%s %.1f" % (k, v) for k, v in parts if v is not None),
            "(data = one epoch drained from the feed alone, per step; other = step - compute - allreduce)"]
        if phases:
            lines += ["", "tfos_nb phases of that run (s; node phases from node 0): " + ", ".join(
                "%s %.1f" % kv for kv in phases.items())]
    return "\n".join(lines)


def with_cpu(run):
    """``run()``'s metrics plus the CPU seconds each group of processes used during it (``memory.CPU_GROUPS``:
    the nodes or native workers, the feeding Python workers, the JVMs, the driver)."""
    sampler = memory.Sampler(interval=0.25)
    sampler.start()
    try:
        before = memory.jvm_threads()
        m = run()
        jvm = memory.jvm_threads_used(before, memory.jvm_threads())
    finally:
        sampler.stop()
    log.info("CPU s by kind of process: %s", ", ".join("%s %.2f" % kv for kv in sorted(sampler.cpu_by_kind().items())))
    return {**m, **sampler.cpu_by_group(), **jvm}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=40_000)
    p.add_argument("--test-rows", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--file-partitions", action="store_true",
                   help="feed one Spark partition per file (--partitions of them) instead of one per core")
    p.add_argument("--uncached", action="store_true",
                   help="feed the Parquet files as read, not a cached DataFrame (each epoch reads them again)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--separation", type=float, default=0.105, help="class-centre scale: 0.105 gives ≈0.84 single-process accuracy")
    p.add_argument("--master", default="local-cluster[2,1,3072]")
    p.add_argument("--only", default="single,native,tfos_nb,tfos_batched,tfos")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                   help="mlp: 784-128-10; cnn: TensorFlowOnSpark's mnist CNN (compute-bound)")
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false")
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--out", default=os.path.join(harness.HERE, "results", "b2-latest.md"))
    opts = p.parse_args(argv)
    opts.only = [k for k in opts.only.split(",") if k]
    unknown = set(opts.only) - set(VARIANTS)
    if unknown:
        p.error("unknown variant(s): %s" % ", ".join(sorted(unknown)))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    bench = Bench(opts)
    # a failure's reason as it has always read here: the type, then the first line in a list
    rounds = harness.Rounds(opts.runs, opts.warmup, settle=True, describe=lambda e: (
        "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[:1])).replace("|", "/"))
    try:
        bench.start()
        rounds.run(opts.only, lambda key, _label: with_cpu(lambda: getattr(bench, VARIANTS[key][1])(**VARIANTS[key][2])))
        if opts.breakdown and "tfos_nb" in opts.only and "tfos_nb" not in rounds.failures:
            try:
                m = bench.tfos_nb(breakdown=True)
                log.info("tfos_nb [breakdown]: %s", ", ".join("%s=%.3f" % kv for kv in m.items()))
                rounds.add("tfos_nb", {k: v for k, v in m.items() if k.endswith(" ms")})
            except Exception:
                log.exception("tfos_nb breakdown run failed")
    finally:
        if bench.spark is not None:
            bench.spark.stop()
        shutil.rmtree(bench.tmp, ignore_errors=True)
    setting = "%s model; %d rows × %d float32, %d epochs, global batch %d, %d nodes (MWMS), %s; medians of %d" % (
        opts.model, opts.rows, FEATURES, opts.epochs, GLOBAL_BATCH, NODES, opts.master, opts.runs)
    head = "B2 training parity — %s, %s cores, %s; %s" % (harness.now_utc(), os.cpu_count(), platform.machine(), setting)
    text = "\n\n".join([head, table(rounds, opts, getattr(bench, "phases", None)), harness.every_run(rounds),
                         "command: " + harness.command(argv)]) + "\n"
    harness.write_report(text, opts.out)
    harness.write_runs(opts.out, "B2", rounds, {k: v[0] for k, v in VARIANTS.items()},
                       setting=setting, command_line=harness.command(argv))
    return 1 if rounds.failures else 0


if __name__ == "__main__":
    sys.exit(main())
