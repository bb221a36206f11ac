#!/usr/bin/env python
"""B4b: what a ``%%tfos_cluster`` cell costs over the same Python API call, in a real IPython kernel.

One real kernel (jupyter_client, this interpreter), one Spark application on ``--master``, the
extension loaded.  Alternating, after one warm-up of each, the client times the execute request
→ reply of

- **api**: a cell running ``cluster = TFCluster.run(sc, fn, {}, 2, input_mode=TENSORFLOW); cluster.shutdown()``
  (the panel the extension shows for API clusters included: that is what a user of the API gets);
- **cell**: a ``%%tfos_cluster --workers 2 --input-mode tensorflow`` cell whose body is the same function.

Both node functions do the same trivial work, so the difference of the medians is the magic's own
overhead (parsing, shipping the cell, its handle thread, the panel and the final table).  Target: ≤ 0.5 s.

    .venv/bin/python benchmarks/bench_cell.py [--runs 5] [--renderer auto|widget|html|text]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import harness  # noqa: E402 - the benchmarks' own helpers, beside this script

SETUP = """
import os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
for k, v in {{"TF_CPP_MIN_LOG_LEVEL": "2"}}.items():
    os.environ[k] = v
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master({master!r}).appName("b4b")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.executorEnv.TF_NUM_INTRAOP_THREADS", "1").config("spark.executorEnv.TF_NUM_INTEROP_THREADS", "2")
         .getOrCreate())
sc = spark.sparkContext
sc.setLogLevel("ERROR")
sc.parallelize(range(4), 2).count()
%load_ext tfos_nb
%config TFOSMagics.renderer = {renderer!r}
from tfos_nb import TFCluster
def node_fn(args, ctx):
    total = sum(range(1000))
    print("node", ctx.job_name, ctx.task_index, total)
"""

API = """
cluster = TFCluster.run(sc, node_fn, {}, 2, input_mode=TFCluster.InputMode.TENSORFLOW)
cluster.shutdown()
"""

CELL = """%%tfos_cluster --workers 2 --input-mode tensorflow --name b4b
total = sum(range(1000))
print("node", ctx.job_name, ctx.task_index, total)
"""


def timed(kc, code: str, timeout: float = 300) -> float:
    errors: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"].get("traceback", []))[-2000:])

    t0 = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    wall = time.perf_counter() - t0
    if reply["content"]["status"] != "ok" or errors:
        raise RuntimeError(f"cell failed: {reply['content'].get('evalue')} {''.join(errors)}")
    return wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--renderer", default="auto")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "b4b-latest.md"),
                   help="the markdown report (every run's figures beside it, .json)")
    opts = p.parse_args()

    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(os.path.join(tempfile.gettempdir(), "tfos_nb-b4b-kernel.log"), "w")  # the kernel's Spark/JVM chatter
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=ROOT, stdout=log, stderr=log)
    try:
        timed(kc, SETUP.format(master=opts.master, renderer=opts.renderer), timeout=600)
        done = [("api", "warm-up", {"s": timed(kc, API)}),  # the first start imports and forks what later ones reuse
                ("cell", "warm-up", {"s": timed(kc, CELL)})]
        api, cell = [], []
        for i in range(opts.runs):
            api.append(timed(kc, API))
            cell.append(timed(kc, CELL))
            done += [("api", f"run {i + 1}", {"s": api[-1]}), ("cell", f"run {i + 1}", {"s": cell[-1]})]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        log.close()

    a, c = statistics.median(api), statistics.median(cell)
    setting = f"master {opts.master}, renderer {opts.renderer}; 1 warm-up + {opts.runs} alternating runs"
    command = harness.command()
    lines = [
        f"B4b cell overhead — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"{platform.machine()}; {setting}",
        "",
        "| variant | median | range |",
        "|---|---|---|",
        f"| TFCluster.run + shutdown in a cell | {a:.2f} s | {min(api):.2f}–{max(api):.2f} s |",
        f"| %%tfos_cluster cell | {c:.2f} s | {min(cell):.2f}–{max(cell):.2f} s |",
        f"| **overhead** (cell − API, medians) | **{c - a:+.2f} s** | target ≤ 0.5 s: {'met' if c - a <= 0.5 else 'not met'} |",
        "",
        f"command: {command}",
    ]
    harness.write_report("\n".join(lines) + "\n", opts.out)
    harness.write_runs(opts.out, "B4b", done, {"api": "TFCluster.run + shutdown in a cell", "cell": "%%tfos_cluster cell"},
                       setting=setting, command_line=command)


if __name__ == "__main__":
    main()
