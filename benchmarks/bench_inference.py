#!/usr/bin/env python
"""B3 (batch inference): tfos_nb ``TFModel.transform`` vs PySpark's ``predict_batch_udf``, side by side.

The same SavedModel (an MLP 784-128-10 made on the driver with tf_keras, random weights) scores
the same cached DataFrame (``features array<float>[784]``, generated with numpy) in batches of
1024 rows; each scoring is ``...write.format("noop")`` over every row.

* cold: the first scoring in a fresh Spark application (new executors, new Python workers:
  TensorFlow import + model load included), alternating the variants' order per run;
* warm: in one application after a warm-up of each variant, alternating per run.

Prints a markdown table: median and range of seconds and rows/s, and the ratio to
predict_batch_udf (rows/s ratio for warm, time ratio for cold), and tfos_nb's ratio to
TensorFlowOnSpark 2.2.5's ``TFModel`` when it is installed (the benchmark venv):

    bash benchmarks/setup_env.sh && .venv-bench/bin/python benchmarks/bench_inference.py [--rows 100000] [--runs 3]

``--only`` picks variants (comma-separated prefixes: tfos_nb, predict, TFoS).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import statistics
import sys
import tempfile
import time

import data
import harness
from bench_runtime import ROLES, cpu_by_process, cpu_spent
from harness import Spread

FEATURES = 784
BATCH = 1024


def make_model(path):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tf_keras as keras

    model = keras.Sequential([keras.layers.Input((FEATURES,), name="features"),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10, name="logits")])
    model.save(path, save_format="tf")


def start_spark(opts):
    spark = harness.spark_session(opts.master, "tfos_nb-bench-B3", conf={"spark.executor.memory": opts.executor_memory})
    return spark, data.uniform_frame(spark, opts.rows, opts.partitions, opts.seed, ids=True, label=False)


def score_tfos_nb(df, export):
    from tfos_nb.pipeline import TFModel

    m = TFModel(exportDir=export, inputMapping={"features": "features"}, outputMapping={"logits": "pred"})
    m.setBatchSize(BATCH).transform(df).select("pred").write.format("noop").mode("overwrite").save()


_PBU_UDFS = {}  # export -> the predict_batch_udf: made once, as a user scoring with it again would keep it


def score_pbu(df, export):
    """``predict_batch_udf`` at its best: the UDF made once (its model cache is keyed by the UDF: a new one loads
    the model again in every worker), and each worker's garbage collector settled after the load, as tfos_nb's
    scorer settles its own (``settle_gc``: TensorFlow's objects out of the collector's full passes)."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    def make_predict_fn(path=export):
        import tensorflow as tf

        from tfos_nb.runtime.executor.collector import settle_gc

        sig = tf.saved_model.load(path).signatures["serving_default"]
        settle_gc(again=True)

        def predict(x):
            return sig(features=tf.constant(x))["logits"].numpy()
        return predict

    udf = _PBU_UDFS.get(export)
    if udf is None:
        udf = _PBU_UDFS[export] = predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()),
                                                    batch_size=BATCH, input_tensor_shapes=[[FEATURES]])
    df.select(udf("features").alias("pred")).write.format("noop").mode("overwrite").save()


def score_tfos(df, export):
    from tensorflowonspark.pipeline import TFModel as TFoSModel

    m = (TFoSModel({}).setInputMapping({"features": "features"}).setOutputMapping({"logits": "pred"})
         .setExportDir(export).setSignatureDefKey("serving_default").setTagSet("serve").setBatchSize(BATCH))
    m.transform(df).select("pred").write.format("noop").mode("overwrite").save()


VARIANTS = {"tfos_nb TFModel.transform": score_tfos_nb, "predict_batch_udf": score_pbu,
            "TFoS 2.2.5 TFModel.transform": score_tfos}
REF = "predict_batch_udf"


def timed(fn, *a):
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


def timed_by_role(fn, *a):
    """(seconds, each role's CPU-seconds meanwhile): Spark's JVMs and Python workers, read from every process of
    the application as B1 reads them (``bench_runtime.cpu_by_process``)."""
    before = cpu_by_process()
    t = timed(fn, *a)
    return t, cpu_spent(before, cpu_by_process())


def breakdown(runs, names):
    """Where the warm time goes: each variant's medians of its runs' CPU-seconds by role (no nodes here: both score
    in Spark's Python workers), their sum over the machine's cores beside the measured wall."""
    cores = os.cpu_count() or 1
    roles = [r for r in ROLES if r not in ("nodes", "node supervisors")]
    lines = ["| variant | " + " | ".join(f"{r} CPU s" for r in roles) + f" | all CPU s | all over {cores} cores | "
             "measured wall |", "|---" * (len(roles) + 4) + "|"]
    for name in names:
        measured = [m for v, run, m in runs if v == name and run.startswith("run") and "cpu driver JVM s" in m]
        if not measured:
            continue
        cpu = [statistics.median(m[f"cpu {r} s"] for m in measured) for r in roles]
        wall = statistics.median(m["warm s"] for m in measured)
        lines.append(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cpu) +
                     f" | {sum(cpu):.2f} | {sum(cpu) / cores:.2f} s | {wall:.2f} s |")
    return lines


TFOS = "TFoS 2.2.5 TFModel.transform"


def _ratio(times, ref_times, kind):
    if not times or not ref_times:
        return "—"
    t, ref = Spread(times), Spread(ref_times)
    return f"{ref.ratio(t).median:.2f}× rows/s" if kind == "warm" else f"{t.ratio(ref).median:.2f}× time"


def row(name, times, rows, res, kind):
    t = Spread(times)
    vs_ref = "1.00× (reference)" if name == REF else _ratio(times, res.get(REF), kind)
    vs_tfos = "1.00× (reference)" if name == TFOS else _ratio(times, res.get(TFOS), kind)
    return (f"| {kind} | {name} | {t.median:.2f} | {t.min:.2f}–{t.max:.2f} | {rows / t.median:,.0f} | {t.n} | "
            f"{vs_ref} | {vs_tfos} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--runs", type=int, default=3, help="warm runs per variant (after 1 warm-up)")
    p.add_argument("--cold-runs", type=int, default=3, help="fresh Spark applications per variant")
    p.add_argument("--master", default="local-cluster[2,1,2048]")
    p.add_argument("--executor-memory", default="2048m")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--only", default="", help="comma-separated name prefixes of the variants to run")
    p.add_argument("--out", default=os.path.join(harness.HERE, "results", "b3-latest.md"),
                   help="the markdown report (every run's figures beside it, .json)")
    opts = p.parse_args(argv)
    sys.path.insert(0, harness.ROOT)
    harness.ship_by_value(data)  # the rows' generator

    export = os.path.join(tempfile.mkdtemp(prefix="tfos_nb_b3_"), "mlp")
    make_model(export)
    names = list(VARIANTS)
    try:
        import tensorflowonspark  # noqa: F401 - the reference, in the benchmark venv only
    except ImportError:
        names.remove("TFoS 2.2.5 TFModel.transform")
        print("tensorflowonspark is not installed: TFoS's TFModel is left out (use .venv-bench)", file=sys.stderr)
    if opts.only:
        names = [n for n in names if n.startswith(tuple(opts.only.split(",")))]
    cold = {n: [] for n in names}
    done = []  # (variant, run, metrics) in the order they ran: the results file's runs
    for r in range(opts.cold_runs):
        for name in names if r % 2 == 0 else names[::-1]:
            spark, df = start_spark(opts)
            try:
                cold[name].append(timed(VARIANTS[name], df, export))
                done.append((name, f"run {r + 1}", {"cold s": cold[name][-1]}))
            finally:
                spark.stop()
            print(f"cold {name}: {cold[name][-1]:.2f} s", file=sys.stderr)
    warm = {n: [] for n in names}
    spark, df = start_spark(opts)
    try:
        for name in names:
            done.append((name, "warm-up", {"warm s": timed(VARIANTS[name], df, export)}))
        for r in range(opts.runs):
            for name in names if r % 2 == 0 else names[::-1]:
                t, cpu = timed_by_role(VARIANTS[name], df, export)
                warm[name].append(t)
                done.append((name, f"run {r + 1}", {"warm s": t, **cpu}))
                print(f"warm {name}: {warm[name][-1]:.2f} s", file=sys.stderr)
    finally:
        spark.stop()

    setting = (f"{os.cpu_count()} cores, {opts.master}, {opts.rows:,} rows × {FEATURES} float32, "
               f"MLP 784-128-10 SavedModel, batch {BATCH}")
    lines = [f"B3 batch inference — {_dt.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, {setting}",
             "",
             "| | variant | median s | range s | rows/s | n | ratio vs predict_batch_udf | ratio vs TFoS |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, res in (("cold", cold), ("warm", warm)):
        for name in names:
            if res[name]:
                lines.append(row(name, res[name], opts.rows, res, kind))
    lines += ["", "Targets (B3): warm ≥ 1.3× predict_batch_udf's rows/s on every run and ≥ 4× TFoS's; cold ≤ 1.2× predict_batch_udf's "
              "time. Ratios: warm = rows/s ÷ the reference's rows/s (higher is better); cold = seconds ÷ the "
              "reference's seconds (lower is better).", "",
              "Where the warm time goes (medians of the warm runs: each role's CPU-seconds while the scoring ran, read "
              "from every process of the application):", "", *breakdown(done, names),
              "", "command: " + harness.command(argv)]
    harness.write_report("\n".join(lines) + "\n", opts.out)
    harness.write_runs(opts.out, "B3", done, {}, setting=setting, command_line=harness.command(argv))


if __name__ == "__main__":
    main()
