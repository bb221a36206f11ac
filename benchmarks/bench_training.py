#!/usr/bin/env python
"""B2 -- training parity: single-process Keras, tfos_nb and TensorFlowOnSpark 2.2.5, side by side.

One Spark application (``local-cluster[2,1,3072]`` by default); the variants alternate per
repetition after a warm-up of each; medians of ``--runs``.  Every variant trains the same Keras
MLP 784-128-10 (Adam, global batch 128) on the same seeded synthetic 10-class data and is scored
on the same held-out rows:

* ``single``  -- ``model.fit`` in this process (the same Keras as the nodes: ``tf_keras``);
* ``native``  -- the same program in 2 processes started by hand with ``TF_CONFIG``, each with its half
  of the rows in memory, 64 rows a worker a step (``native_b128``: ``.batch(128)`` a worker, a global
  batch of 256; ``native_untuned``: with the tf.data settings ``as_dataset`` gives, autotuning off);
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
``--no-breakdown`` leaves it out) times its steps and, after training, measures on the same cluster
what a step is made of:

* ``step``      -- mean wall time of a training step (epochs after the first: wall / steps);
* ``compute``   -- the same forward + backward + Adam update on one batch, no strategy, no feed;
* ``allreduce`` -- MultiWorkerMirroredStrategy's all-reduce of the model's gradient tensors
  across both nodes, alone;
* ``data``      -- one more epoch drained from the feed with no model (per-batch time);
* ``other``     -- step - compute - allreduce: Keras/Python overhead plus data stalls.

Run: ``bash benchmarks/run.sh b2`` (creates ``.venv-bench``), or directly
``.venv-bench/bin/python benchmarks/bench_training.py --rows 40000 --epochs 3 --runs 3``.
Writes ``benchmarks/results/b2-latest.md``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FEATURES = 784
CLASSES = 10
GLOBAL_BATCH = 128
NODES = 2

log = logging.getLogger("bench_training")


# --------------------------------------------------------------------------------------
# Data and model (the same for every variant)
# --------------------------------------------------------------------------------------

def make_data(rows: int, seed: int, separation: float):
    """Seeded synthetic 10-class data: class centres + isotropic noise, hard enough to stay < 0.9."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (CLASSES, FEATURES)).astype(np.float32) * separation
    y = rng.integers(0, CLASSES, rows).astype(np.int32)
    x = centres[y] + rng.normal(0.0, 1.0, (rows, FEATURES)).astype(np.float32)
    return x.astype(np.float32), y


def build_model(kind: str = "mlp", keras3: bool = False):
    """``mlp``: 784-128-10.  ``cnn``: TensorFlowOnSpark's mnist example CNN on the rows as 28×28×1 images.
    ``keras3``: the same model written with ``import keras`` (Keras 3), not ``tf.keras`` (tf_keras on the nodes)."""
    if keras3:
        import keras as k
    else:
        import tensorflow as tf

        k = tf.keras
    if kind == "cnn":
        layers = [k.layers.Reshape((28, 28, 1)),
                  k.layers.Conv2D(32, 3, activation="relu"),
                  k.layers.MaxPooling2D(),
                  k.layers.Flatten(),
                  k.layers.Dense(64, activation="relu")]
    else:
        layers = [k.layers.Dense(128, activation="relu")]
    model = k.Sequential([k.layers.Input(shape=(FEATURES,)), *layers, k.layers.Dense(CLASSES, activation="softmax")])
    model.compile(optimizer=k.optimizers.Adam(learning_rate=1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# --------------------------------------------------------------------------------------
# Node functions (shipped by cloudpickle; self-contained)
# --------------------------------------------------------------------------------------

def tfos_nb_main(args, ctx):
    """tfos_nb's documented form, plus (optionally) the per-step breakdown."""
    import json
    import os
    import time

    t_enter = time.time()
    import numpy as np
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

    class StepTimer(callbacks_keras.callbacks.Callback):
        """Steps and wall time of the epochs after the first (which builds the graph and the collectives).

        Takes the batch logs as tensors (``_supports_tf_logs``) so that it does not make Keras
        wait for each step: a step is (later epochs' wall time) / (their steps).
        """

        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True
            self.epoch, self.steps, self.total, self.wall = 0, 0, 0, 0.0
            self.ends = []  # each epoch's end (time.time()), to line the nodes' epochs up

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            self.t0 = time.perf_counter()
            if epoch == 1:
                self.t_epoch1 = time.time()

        def on_train_batch_end(self, batch, logs=None):
            self.total += 1
            if self.epoch > 0:
                self.steps += 1

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.time())
            if epoch > 0:
                self.wall += time.perf_counter() - self.t0

    timer = StepTimer()
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
    if not args["breakdown"]:
        with open(os.path.join(args["out_dir"], "node-%d.json" % ctx.worker_num), "w") as f:
            json.dump({"fit": t_fit_end - t_fit, "step": timer.wall / timer.steps if timer.steps else None,
                       "steps": timer.total, "phases": phases}, f)
        return None

    out = {"fit": t_fit_end - t_fit, "step": timer.wall / timer.steps if timer.steps else None, "steps": timer.steps,
           "phases": phases, "fit_end": t_fit_end, "epoch_ends": timer.ends}
    per_replica = args["batch"] // strategy.num_replicas_in_sync  # the rows one step trains on, per node
    x = tf.constant(np.random.default_rng(0).random((per_replica, 784), dtype=np.float32))
    y = tf.constant(np.arange(per_replica, dtype=np.int32) % 10)

    local = args["build_model"](args["model"])  # no strategy: pure compute of one step
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def local_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, local(x, training=True))
        grads = tape.gradient(loss, local.trainable_variables)
        local.optimizer.apply_gradients(zip(grads, local.trainable_variables))
        return loss

    def timed(fn, reps=50):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    out["compute"] = timed(lambda: local_step().numpy())

    grads_like = [tf.zeros_like(v) for v in model.trainable_variables]

    @tf.function
    def allreduce():
        def fn(*g):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(g))
        return strategy.run(fn, args=tuple(grads_like))

    out["allreduce"] = timed(lambda: [t.numpy() for t in strategy.experimental_local_results(allreduce()[0])])

    # One more epoch from the driver's second train() call, drained with no model.
    it = iter(ds)
    times, t0 = [], time.perf_counter()
    for _ in it:
        now = time.perf_counter()
        times.append(now - t0)
        t0 = now
    # an element of ds feeds num_replicas_in_sync steps (Keras splits it): data time per step
    out["data"] = float(np.median(times)) / strategy.num_replicas_in_sync if times else None
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


class _PortTaken(Exception):
    """A native worker's port was taken between choosing it and TensorFlow binding it."""


def native_node(spec_path: str) -> None:
    """One process of the native run: the same Keras program, started by hand with ``TF_CONFIG``.

    Its half of the rows is in memory (``from_tensor_slices(...).batch(global batch)``, auto-sharding
    off as tfos_nb's feed has it: each process trains on its own rows).
    """
    import numpy as np

    spec = json.load(open(spec_path))
    import tensorflow as tf

    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    except tf.errors.UnknownError as exc:
        if "Could not start gRPC server" not in str(exc):
            raise
        open(spec["out"] + ".port-taken", "w").close()  # the driver starts the run again on new ports
        sys.exit(3)
    with strategy.scope():
        model = build_model(spec["model"])
    x, y = np.load(spec["x"]), np.load(spec["y"])
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(spec["batch"])
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if spec.get("untuned"):  # tfos_nb's tf.data settings: autotuning off, here and on the per-device prefetch
        from tfos_nb.runtime.executor import compat

        opts.autotune.enabled = False
        compat.untuned_device_prefetch()
    ds = ds.with_options(opts)
    timer = _later_epochs_timer(tf)
    t_fit = time.time()
    model.fit(ds, epochs=spec["epochs"], verbose=0, callbacks=[timer])
    fit = time.time() - t_fit
    # every worker saves (a collective); only the chief's copy is kept
    is_chief = spec["index"] == 0
    model.save(spec["export_dir"] if is_chief else spec["export_dir"] + "-worker%d" % spec["index"])
    with open(spec["out"], "w") as f:
        json.dump({"fit": fit, "step": timer.wall / timer.steps if timer.steps else None, "steps": timer.total}, f)


def _later_epochs_timer(tf):
    """A callback timing the epochs after the first: a step = their wall time / their steps."""

    class Timer(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # do not make Keras wait for each step's logs
            self.epoch, self.steps, self.total, self.wall = 0, 0, 0, 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch, self.t0 = epoch, time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.total += 1
            self.steps += self.epoch > 0

        def on_epoch_end(self, epoch, logs=None):
            if epoch > 0:
                self.wall += time.perf_counter() - self.t0

    return Timer()


# --------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------

class Bench:
    def __init__(self, opts):
        self.opts = opts
        self.tmp = tempfile.mkdtemp(prefix="tfos-b2-")
        self.spark = None

    def start(self):
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # the nodes' Keras (tf_keras), here too
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        pp = os.environ.get("PYTHONPATH", "")
        if ROOT not in pp.split(os.pathsep):
            os.environ["PYTHONPATH"] = ROOT + (os.pathsep + pp if pp else "")
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import StorageLevel
        from pyspark.sql import SparkSession

        o = self.opts
        x, y = make_data(o.rows + o.test_rows, o.seed, o.separation)
        self.x_train, self.y_train = x[:o.rows], y[:o.rows]
        self.x_test, self.y_test = x[o.rows:], y[o.rows:]
        parts = os.path.join(self.tmp, "train.parquet")
        os.makedirs(parts)
        for i, idx in enumerate(np.array_split(np.arange(o.rows), o.partitions)):
            feats = pa.FixedSizeListArray.from_arrays(pa.array(self.x_train[idx].ravel()), FEATURES)
            table = pa.table({"features": pa.array(feats.to_pylist(), pa.list_(pa.float32())),
                              "label": pa.array(self.y_train[idx])})
            pq.write_table(table, os.path.join(parts, "part-%05d.parquet" % i))
        b = (SparkSession.builder.master(o.master).appName("tfos_nb-bench-training")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             # --file-partitions: one Spark partition per file (--partitions of them); else Spark packs the files
             # into one partition per core
             .config("spark.sql.files.maxPartitionBytes", str(max(os.path.getsize(os.path.join(parts, f))
                                                                  for f in os.listdir(parts))
                                                              if o.file_partitions else 1 << 40))
             .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"]))
        for k, v in {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1",
                     "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}.items():
            b = b.config("spark.executorEnv." + k, v)
        self.spark = b.getOrCreate()
        self.spark.sparkContext.setLogLevel("ERROR")
        self.df = self.spark.read.parquet(parts).persist(StorageLevel.MEMORY_AND_DISK)
        assert self.df.count() == o.rows
        self._rdd = None  # Python rows for the TensorFlowOnSpark variants, made on first use (at 160k rows,
        # persisting it beside the DataFrame ran the executors out of memory: exit code 52)
        self.extra = self.df.limit(GLOBAL_BATCH * 40).repartition(NODES).persist(StorageLevel.MEMORY_AND_DISK)
        self.extra.count()
        log.info("data: %d train + %d test rows, %d partitions", o.rows, o.test_rows, self.df.rdd.getNumPartitions())

    @property
    def rdd(self):
        if self._rdd is None:
            from pyspark import StorageLevel

            self._rdd = self.df.rdd.map(lambda r: (r.features, int(r.label))).persist(StorageLevel.MEMORY_AND_DISK)
            assert self._rdd.count() == self.opts.rows
        return self._rdd

    def accuracy(self, export_dir):
        import tensorflow as tf

        if os.path.exists(export_dir + ".keras"):  # the Keras 3 variant's file
            import keras

            model = keras.models.load_model(export_dir + ".keras")
        else:
            model = tf.keras.models.load_model(export_dir)
        pred = model.predict(self.x_test, batch_size=1024, verbose=0).argmax(axis=1)
        return float((pred == self.y_test).mean())

    def _export_dir(self, tag):
        d = os.path.join(self.tmp, "export-%s-%d" % (tag, time.monotonic_ns()))
        return d

    def single(self):
        import tensorflow as tf

        tf.keras.utils.set_random_seed(self.opts.seed)
        t0 = time.perf_counter()
        model = build_model(self.opts.model)
        model.fit(self.x_train, self.y_train, batch_size=GLOBAL_BATCH, epochs=self.opts.epochs, verbose=0)
        wall = time.perf_counter() - t0
        pred = model.predict(self.x_test, batch_size=1024, verbose=0).argmax(axis=1)
        steps = -(-self.opts.rows // GLOBAL_BATCH) * self.opts.epochs
        return {"wall s": wall, "fit s": wall, "steps": steps, "accuracy": float((pred == self.y_test).mean())}

    def tfos_nb(self, breakdown=False, cache=False, keras3=False, env=None, **run_kwargs):
        from tfos_nb import TFCluster

        export_dir = self._export_dir("nb")
        out_dir = tempfile.mkdtemp(dir=self.tmp)
        # as_dataset's batch is the global batch under MWMS (Keras splits it across the replicas)
        args = {"batch": GLOBAL_BATCH, "epochs": self.opts.epochs, "export_dir": export_dir,
                "breakdown": breakdown, "out_dir": out_dir, "build_model": build_model, "model": self.opts.model,
                "progress": os.environ.get("BENCH_PROGRESS", "1") == "1", "cache": cache, "keras3": keras3}
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

    def tfos_nb_keras3(self):
        """tfos_nb with the model written for Keras 3 (``import keras``); the nodes repair its trainer for MWMS."""
        return self.tfos_nb(keras3=True)

    def single_keras3(self):
        """Single-process Keras 3: the reference for the Keras 3 variant's accuracy."""
        import keras

        keras.utils.set_random_seed(self.opts.seed)
        t0 = time.perf_counter()
        model = build_model(self.opts.model, keras3=True)
        model.fit(self.x_train, self.y_train, batch_size=GLOBAL_BATCH, epochs=self.opts.epochs, verbose=0)
        wall = time.perf_counter() - t0
        pred = model.predict(self.x_test, batch_size=1024, verbose=0).argmax(axis=1)
        steps = -(-self.opts.rows // GLOBAL_BATCH) * self.opts.epochs
        return {"wall s": wall, "fit s": wall, "steps": steps, "accuracy": float((pred == self.y_test).mean())}

    def tfos_nb_cache(self):
        """tfos_nb with ``as_dataset(cache=True)``: one epoch fed, the nodes replay it for the later epochs."""
        return self.tfos_nb(cache=True)

    def tfos_nb_backup(self):
        """tfos_nb as in a job with retries: the chief's backups and each node's element log on (their cost)."""
        from tfos_nb.runtime.recovery import ledger

        folder = tempfile.mkdtemp(dir=self.tmp)
        res = self.tfos_nb(env={ledger.ENV_DIR: folder})
        done = ledger.backups(folder)
        res["backups"] = done[0].seq if done else 0
        return res

    def tfos_nb_deterministic(self):
        """tfos_nb in deterministic mode: op determinism, partitions fed in a fixed order (early ones kept aside)."""
        return self.tfos_nb(deterministic=True, seed=self.opts.seed)

    def tfos_nb_serial(self):
        """tfos_nb as before epoch pipelining: the next epoch's job starts when this one ended."""
        os.environ["TFOS_FEED_PIPELINE"] = "0"
        try:
            return self.tfos_nb()
        finally:
            del os.environ["TFOS_FEED_PIPELINE"]

    def native_b128(self):
        return self.native(per_worker_batch=GLOBAL_BATCH)

    def native_untuned(self):
        return self.native(untuned=True)

    def native(self, per_worker_batch=GLOBAL_BATCH // NODES, untuned=False):
        """The same program in NODES processes started by hand with TF_CONFIG, each with its half of the rows.

        Each process batches its rows by ``per_worker_batch``: with auto-sharding off, MultiWorkerMirroredStrategy
        trains each worker on its dataset's batch as it is (measured: ``.batch(128)`` gives 157 steps an epoch
        at 40k rows, i.e. a global batch of 256), so the global batch of 128 -- what ``single`` and tfos_nb's
        ``as_dataset(batch_size=128)`` train on, 313 steps an epoch -- is ``.batch(64)`` on each of 2 workers.
        """
        import numpy as np

        run_dir = tempfile.mkdtemp(dir=self.tmp)
        export_dir = self._export_dir("native")
        if not hasattr(self, "native_halves"):
            self.native_halves = []
            for i, idx in enumerate(np.array_split(np.arange(self.opts.rows), NODES)):
                xs, ys = os.path.join(self.tmp, "x%d.npy" % i), os.path.join(self.tmp, "y%d.npy" % i)
                np.save(xs, self.x_train[idx])
                np.save(ys, self.y_train[idx])
                self.native_halves.append((xs, ys))
        for attempt in (1, 2):
            try:
                return self._native_once(run_dir, export_dir, per_worker_batch, untuned)
            except _PortTaken:
                # _free_ports' ports were free when it closed them; another process (a Spark or TensorFlowOnSpark
                # process of an earlier variant) can take one before TensorFlow binds it: a harness race, not the
                # program's cost, so the run starts again on new ports
                log.warning("native: a worker could not bind its port (attempt %d); starting again", attempt)
        raise RuntimeError("native: the workers could not bind free ports twice")

    def _native_once(self, run_dir, export_dir, per_worker_batch, untuned=False):
        import subprocess

        ports = _free_ports(NODES)
        workers = ["127.0.0.1:%d" % p for p in ports]
        env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1",
                   TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
        procs, outs = [], []
        t0 = time.perf_counter()
        for i, (xs, ys) in enumerate(self.native_halves):
            role = ("chief", 0) if i == 0 else ("worker", i - 1)
            tf_config = {"cluster": {"chief": workers[:1], **({"worker": workers[1:]} if NODES > 1 else {})},
                         "task": {"type": role[0], "index": role[1]}}
            spec = {"x": xs, "y": ys, "batch": per_worker_batch, "epochs": self.opts.epochs, "model": self.opts.model,
                    "untuned": untuned,
                    "export_dir": export_dir, "index": i, "out": os.path.join(run_dir, "node-%d.json" % i)}
            spec_path = os.path.join(run_dir, "spec-%d.json" % i)
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            outs.append(spec["out"])
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--native-node", spec_path],
                                          env=dict(env, TF_CONFIG=json.dumps(tf_config))))
        deadline = time.monotonic() + 1800
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one worker failed: its peers would wait for it in the strategy's first collective
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        for p in procs:
            if p.poll() is None:
                p.kill()
        codes = [p.wait() for p in procs]
        if any(codes):
            if any(os.path.exists(o + ".port-taken") for o in outs):
                raise _PortTaken()
            raise RuntimeError("native node exit codes %s" % codes)
        chief = json.load(open(outs[0]))
        log.info("native: %d steps on the chief, %.1f ms a step after the first epoch", chief["steps"], 1000 * (chief["step"] or 0))
        return {"wall s": wall, "fit s": chief["fit"], "accuracy": self.accuracy(export_dir), "steps": chief["steps"],
                **({"step ms": 1000 * chief["step"]} if chief["step"] else {})}

    def tfos_batched(self):
        return self.tfos(rows_per_call=GLOBAL_BATCH // NODES)

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
            try:
                cluster.shutdown()
            finally:
                signal.alarm(0)  # TFoS leaves a SIGALRM armed after shutdown()
        wall = time.perf_counter() - t0
        fit = json.load(open(os.path.join(out_dir, sorted(os.listdir(out_dir))[0])))["fit"]
        return {"wall s": wall, "fit s": fit, "accuracy": self.accuracy(export_dir)}


def _cpu_seconds() -> tuple[float, float]:
    """The machine's CPU time so far (s, all CPUs): busy (user, nice, system, irq, softirq) and stolen by the host
    (``steal``: this VM's vCPUs waiting for a physical CPU)."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq, t.steal


def settle(window: float = 1.0, busy_below: float = 0.1, deadline: float = 60.0) -> float:
    """Wait until a ``window`` in which the machine's CPUs were busy less than ``busy_below`` of the window, all
    CPUs together (what the previous run left running -- JVM collections, exiting processes -- has ended), for at
    most ``deadline`` s; returns the seconds waited.  A run that starts on a busy machine is reported as such."""
    t0 = time.monotonic()
    while True:
        b0, _ = _cpu_seconds()
        time.sleep(window)
        busy = _cpu_seconds()[0] - b0
        if busy < busy_below * window or time.monotonic() - t0 > deadline:
            return time.monotonic() - t0


def _free_ports(n):
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


VARIANTS = {
    "single": "single-process Keras",
    "native": "native MWMS (the same program, %d processes started by hand with TF_CONFIG)" % NODES,
    "native_untuned": "native MWMS with tfos_nb's tf.data settings (autotuning off, on the per-device prefetch too)",
    "native_b128": "native MWMS with .batch(%d) on each worker (a global batch of %d: half the steps)"
                   % (GLOBAL_BATCH, GLOBAL_BATCH * NODES),
    "tfos_nb": "tfos_nb (as_dataset + model.fit)",
    "tfos_nb_cache": "tfos_nb, as_dataset(cache=True): one epoch fed, replayed on the nodes",
    "tfos_nb_keras3": "tfos_nb, the model written for Keras 3 (import keras)",
    "single_keras3": "single-process Keras 3",
    "tfos": "TensorFlowOnSpark 2.2.5, its example's idiom (from_generator over next_batch(1))",
    "tfos_batched": "TensorFlowOnSpark 2.2.5, whole batches (from_generator over next_batch(%d))" % (GLOBAL_BATCH // NODES),
    "tfos_nb_serial": "tfos_nb, one epoch's feeding job at a time (TFOS_FEED_PIPELINE=0)",
    "tfos_nb_backup": "tfos_nb with retries' backups (the chief's, at most 2 % of the time) and the nodes' element logs",
    "tfos_nb_deterministic": "tfos_nb in deterministic mode (op determinism, a fixed feed)",
}


def every_run(runs_log) -> str:
    """Each run in the order it ran, with the machine's CPU during it: a slow run on a machine busy with something
    else, or one the host took CPU from (steal), tells noise from cost."""
    lines = ["Every run, in order (settle: s waited for a quiet machine before it; CPU: the machine's busy and "
             "stolen time during the run, %% of its %d CPUs):" % (os.cpu_count() or 1), "",
             "| variant | run | wall s | fit s | settle s | CPU busy | CPU steal |", "|---|---|---|---|---|---|---|"]
    for key, rep, m in runs_log:
        lines.append("| %s | %s | %.1f | %s | %.1f | %.0f %% | %.1f %% |" % (
            key, rep, m["wall s"], "%.1f" % m["fit s"] if m.get("fit s") is not None else "", m["settle s"],
            m["cpu busy %"], m["cpu steal %"]))
    return "\n".join(lines)


def table(results, failures, opts, phases=None):
    def med(key, m):
        v = results.get(key, {}).get(m)
        return statistics.median(v) if v else None

    def rng(key, m):
        v = results.get(key, {}).get(m)
        return "%.1f–%.1f" % (min(v), max(v)) if v else ""

    lines = ["| variant | wall (median) | range | `model.fit` (chief) | range | steps | accuracy | wall vs native | fit vs native |",
             "|---|---|---|---|---|---|---|---|---|"]
    native_wall, native_fit = med("native", "wall s"), med("native", "fit s")
    for key in opts.only:
        if key in failures:
            lines.append("| %s | FAILED: %s | | | | | | | |" % (VARIANTS[key], failures[key]))
            continue
        w = med(key, "wall s")
        if w is None:
            continue
        f = med(key, "fit s")
        st = med(key, "steps")
        lines.append("| %s | %.1f s | %s s | %s | %s | %s | %.3f | %s | %s |" % (
            VARIANTS[key], w, rng(key, "wall s"), "%.1f s" % f if f is not None else "",
            rng(key, "fit s") + " s" if f is not None else "", "%d" % st if st else "", med(key, "accuracy"),
            "%.2f×" % (w / native_wall) if native_wall and key != "native" else "",
            "%.2f×" % (f / native_fit) if native_fit and f is not None and key != "native" else ""))
    steps = [(k, med(k, "step ms")) for k in ("native", "tfos_nb") if med(k, "step ms")]
    if steps:
        lines += ["", "a training step (ms, the chief, epochs after the first): " + ", ".join("%s %.1f" % kv for kv in steps)]
    if opts.breakdown and "tfos_nb" in results:
        parts = [(k, med("tfos_nb", k + " ms")) for k in ("step", "compute", "allreduce", "other", "data")]
        lines += ["", "tfos_nb per-step breakdown (ms, mean over nodes, one extra run): " + ", ".join(
            "%s %.1f" % (k, v) for k, v in parts if v is not None),
            "(data = one epoch drained from the feed alone, per step; other = step - compute - allreduce)"]
        if phases:
            lines += ["", "tfos_nb phases of that run (s; node phases from node 0): " + ", ".join(
                "%s %.1f" % kv for kv in phases.items())]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=40_000)
    p.add_argument("--test-rows", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--file-partitions", action="store_true",
                   help="feed one Spark partition per file (--partitions of them) instead of one per core")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--separation", type=float, default=0.105, help="class-centre scale: 0.105 gives ≈0.84 single-process accuracy")
    p.add_argument("--master", default="local-cluster[2,1,3072]")
    p.add_argument("--only", default="single,native,tfos_nb,tfos_batched,tfos")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                   help="mlp: 784-128-10; cnn: TensorFlowOnSpark's mnist CNN (compute-bound)")
    p.add_argument("--native-node", help=argparse.SUPPRESS)
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false")
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--out", default=os.path.join(HERE, "results", "b2-latest.md"))
    opts = p.parse_args(argv)
    if opts.native_node:
        native_node(opts.native_node)
        return 0
    opts.only = [k for k in opts.only.split(",") if k]
    unknown = set(opts.only) - set(VARIANTS)
    if unknown:
        p.error("unknown variant(s): %s" % ", ".join(sorted(unknown)))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    bench = Bench(opts)
    results, failures = {}, {}
    runs_log: list[tuple[str, str, dict]] = []
    try:
        bench.start()
        reps = (["warm-up"] if opts.warmup else []) + ["run %d" % i for i in range(1, opts.runs + 1)]
        for rep in reps:
            for key in opts.only:
                if key in failures:
                    continue
                waited = settle()
                cpu0, steal0, t0 = *_cpu_seconds(), time.perf_counter()
                try:
                    m = getattr(bench, key)()
                except Exception as e:  # one variant's failure must not hide the others
                    failures[key] = ("%s: %s" % (type(e).__name__, str(e).strip().splitlines()[:1])).replace("|", "/")
                    log.exception("%s %s failed", key, rep)
                    continue
                cpu1, steal1 = _cpu_seconds()
                # the machine's CPU during the run, as a share of both CPUs' time: what the run (and anything
                # else) used, and what the host took from this VM
                span = (time.perf_counter() - t0) * (os.cpu_count() or 1)
                m.update({"settle s": waited, "cpu busy %": 100 * (cpu1 - cpu0) / span,
                          "cpu steal %": 100 * (steal1 - steal0) / span})
                log.info("%s [%s]: %s", key, rep, ", ".join("%s=%.3f" % kv for kv in m.items()))
                runs_log.append((key, rep, m))
                if rep != "warm-up":
                    for k, v in m.items():
                        results.setdefault(key, {}).setdefault(k, []).append(v)
        if opts.breakdown and "tfos_nb" in opts.only and "tfos_nb" not in failures:
            try:
                m = bench.tfos_nb(breakdown=True)
                log.info("tfos_nb [breakdown]: %s", ", ".join("%s=%.3f" % kv for kv in m.items()))
                for k, v in m.items():
                    if k.endswith(" ms"):
                        results["tfos_nb"].setdefault(k, []).append(v)
            except Exception:
                log.exception("tfos_nb breakdown run failed")
    finally:
        if bench.spark is not None:
            bench.spark.stop()
        shutil.rmtree(bench.tmp, ignore_errors=True)
    head = ("B2 training parity — %s, %s cores, %s; %s model; %d rows × %d float32, %d epochs, "
            "global batch %d, %d nodes (MWMS), %s; medians of %d") % (
        _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), os.cpu_count(), platform.machine(),
        opts.model, opts.rows, FEATURES, opts.epochs, GLOBAL_BATCH, NODES, opts.master, opts.runs)
    cmd = "command: " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:]))
    text = "\n\n".join([head, table(results, failures, opts, getattr(bench, "phases", None)), every_run(runs_log), cmd]) + "\n"
    print(text)
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out, "w") as f:
        f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
