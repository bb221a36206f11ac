#!/usr/bin/env python
"""B5's native reference: how a MultiWorkerMirroredStrategy process's memory grows with its steps, no Spark.

B5 found a ``model.fit`` node's peak RSS growing with the rows of its epoch (about 120 MiB more at
1M rows than at 100k) while a node draining the same feed into numpy stays flat.  This measures the
same Keras program as B5's ``fit`` nodes (MLP 784-128-10, Adam, accuracy; ``tf_keras`` as the nodes run it;
1 intra-op thread)
started by hand: ``--workers`` processes with ``TF_CONFIG`` on loopback ports (``--workers 1``: the
strategy without ``TF_CONFIG``, one worker), each training on ``--steps`` batches drawn from a
1,024-row array held in memory, so nothing but the training loop can grow.

* ``slices``: ``from_tensor_slices(...).repeat().batch(64).take(steps)``, a dataset of known length;
* ``generator``: ``from_generator`` yielding 128-row batches, of unknown length, as tfos_nb's
  ``feed.as_dataset(128)`` is; the strategy then splits each batch between the 2 workers' replicas
  (64 rows a step each) and asks the workers every step whether all of them still have data;
* ``generator_known``: the same generator wrapped in ``assert_cardinality(steps)``: of known length, its
  batches are split as well (64 rows a step each), but Keras counts the epoch in the unsplit batches and
  stops there: half the Keras steps, half the rows.

On 2 workers the strategy splits every batch between the replicas: ``slices`` trains 32 rows a replica a step.

Each worker warms up (20 steps), reads its RSS, trains, reads its RSS and high-water mark again and
counts the steps Keras ran (a callback).  Growth per step = (RSS after - RSS before) / steps.

Run: ``PYTHONPATH=. .venv-bench/bin/python benchmarks/bench_mwms_memory.py --steps 500,5000 --workers 1,2``.
Writes ``benchmarks/results/b5-mwms-native.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from model import build_model  # this directory is on the path: benchmarks are scripts
from native import free_ports, tf_config

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "b5-mwms-native.md"


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def worker(dataset: str, steps: int) -> None:
    """One training process: prints one JSON line with its RSS before and after ``steps`` steps."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.random((1024, 784), dtype=np.float32)
    y = rng.integers(0, 10, 1024).astype(np.int32)

    def make(n: int) -> tf.data.Dataset:
        if dataset == "slices":
            ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64).take(n)
        else:
            def gen():  # unknown length; 128-row batches, split between the replicas
                for i in range(n):
                    j = (i * 128) % 896
                    yield x[j:j + 128], y[j:j + 128]

            spec = (tf.TensorSpec((None, 784), tf.float32), tf.TensorSpec((None,), tf.int32))
            ds = tf.data.Dataset.from_generator(gen, output_signature=spec)
            if dataset == "generator_known":  # the same, of known length: Keras stops after `n` unsplit batches
                ds = ds.apply(tf.data.experimental.assert_cardinality(n))
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(opts)

    with strategy.scope():
        model = build_model("mlp")  # B2's and B5's model, compiled as they compile it

    class Count(tf.keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            Count.steps += 1

    model.fit(make(20), epochs=1, verbose=0)
    before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    model.fit(make(steps), epochs=1, verbose=0, callbacks=[Count()])
    seconds = time.perf_counter() - t0
    print(json.dumps({"before_kib": before, "after_kib": _status_kib("VmRSS"), "hwm_kib": _status_kib("VmHWM"),
                      "keras_steps": Count.steps, "seconds": seconds}), flush=True)


def measure(dataset: str, steps: int, workers: int) -> list[dict]:
    ports = free_ports(workers)
    procs = []
    for i in range(workers):
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        if workers > 1:
            env["TF_CONFIG"] = tf_config(ports, i, chief=False, host="localhost")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", dataset, str(steps)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"a worker failed (exit {p.returncode}): {dataset} {steps} steps, {workers} worker(s)")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="500,5000", help="dataset elements per run, comma-separated")
    ap.add_argument("--workers", default="1,2", help="processes per run, comma-separated")
    ap.add_argument("--datasets", default="slices,generator")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--worker", nargs=2, metavar=("DATASET", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    rows = []
    for dataset in args.datasets.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            for steps in (int(s) for s in args.steps.split(",")):
                for w in measure(dataset, steps, workers):
                    grown = (w["after_kib"] - w["before_kib"]) / 1024
                    per_step = (w["after_kib"] - w["before_kib"]) / max(1, w["keras_steps"])
                    rows.append(f"| {dataset} | {workers} | {w['keras_steps']:,} | {w['before_kib'] / 1024:.0f} | "
                                f"{w['after_kib'] / 1024:.0f} | {grown:+.0f} | {per_step:.1f} | "
                                f"{1000 * w['seconds'] / max(1, w['keras_steps']):.1f} |")
                    print(rows[-1], flush=True)
    cmd = "PYTHONPATH=. .venv-bench/bin/python benchmarks/bench_mwms_memory.py " + " ".join(sys.argv[1:])
    text = "\n".join([
        f"B5 native reference (MWMS memory against steps, no Spark) -- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores; MLP 784-128-10, Adam, tf_keras; rows a replica a step: slices 64 on 1 worker "
        "and 32 on 2, generator 128 on 1 worker and 64 on 2, generator_known 64 on 2; 1 intra-op thread",
        "",
        "| dataset | workers | Keras steps | RSS before fit (MiB) | after (MiB) | growth (MiB) | KiB a step | ms a step |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"command: `{cmd.strip()}`",
        "",
    ])
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
