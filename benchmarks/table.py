"""The one current table of benchmark figures, built from every run in the results files.

    python benchmarks/table.py           # rewrite the table in docs/benchmarks.md and the README's rows
    python benchmarks/table.py --check   # exit 1, naming the file, if either differs from the results files

Each benchmark script writes ``benchmarks/results/NAME.json`` beside its report (``harness.write_runs``): every run's
figures, warm-ups marked.  :data:`ROWS` says which of them the table shows and against what; the figures are
computed here, from the runs (never copied by hand): every counted run in the order it ran, the median with the
range, and the ratio to the reference both median against median and fastest run against fastest run (on a shared
2-core machine a median of a few runs flatters whichever side was steadier).  Earlier figures live in the
changelog.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # the benchmarks' own helpers, beside this script (also when a test loads it by path)
    sys.path.insert(0, HERE)
import harness  # noqa: E402

ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
README = os.path.join(ROOT, "README.md")
DOCS_MARKERS = ("<!-- benchmarks-table: start (benchmarks/table.py writes it) -->", "<!-- benchmarks-table: end -->")
AXIS_MARKERS = ("<!-- benchmarks-partitions: start (benchmarks/table.py writes it) -->",
                "<!-- benchmarks-partitions: end -->")
#: B2's partition axis: (label, results file); every figure is judged against the first's (the same rows in 2)
AXIS = (("2 partitions, cached", "b2-partitions-cached-2.json"), ("8 partitions, cached", "b2-partitions-cached-8.json"),
        ("64 partitions, cached", "b2-partitions-cached-64.json"),
        ("200 partitions, cached", "b2-partitions-cached-200.json"),
        ("8 Parquet files, read every epoch", "b2-partitions-parquet-8.json"),
        ("200 Parquet files, read every epoch", "b2-partitions-parquet-200.json"))
README_MARKERS = ("<!-- benchmarks-readme: start (benchmarks/table.py writes it) -->", "<!-- benchmarks-readme: end -->")


@dataclass(frozen=True)
class Row:
    """One line of the table: a variant's metric in a results file, against a reference variant of the same file."""

    benchmark: str  # what is measured, in words
    results: str  # the results file (benchmarks/results/...json)
    variant: str
    metric: str  # as the benchmark recorded it: "rows/s", "fit s", "start+shutdown s"
    reference: str | tuple[str, ...] | None  # the variant it is compared with (None: none); several: their sum, round
    # by round (the training alone plus Spark's own read of the same rows: the least a Spark-fed trainer can use)
    against: str  # the reference in words
    target: str = ""
    readme: str = ""  # the README's name for it (empty: the docs' table only)

    @property
    def higher_is_better(self) -> bool:
        return self.metric.endswith("/s")


AS_A_FEED = ("native MultiWorkerMirroredStrategy reading its rows through `from_generator`, 8 batches a call, as "
             "`as_dataset()` reads a feed (no Spark)")
UNKNOWN_LENGTH = ("native MultiWorkerMirroredStrategy handed the same global batches with no Python, its length "
                  "unknown as a stream's is (no Spark)")
ROWS: tuple[Row, ...] = (
    Row("B1 feeding a DataFrame to 2 nodes", "latest.json", "b1_nb_df", "rows/s", "b1_tfos", "TensorFlowOnSpark 2.2.5",
        "≥ 10×", readme="feeding a DataFrame (B1)"),
    Row("B1 feeding a DataFrame to 2 nodes", "b1-shared.json", "b1_nb_df", "rows/s", "b1_ceiling",
        "Spark alone: `df.mapInArrow` → numpy", "≥ 0.95×", readme="feeding a DataFrame (B1), against Spark's own read"),
    Row("B1 feeding an RDD to 2 nodes", "latest.json", "b1_nb_rdd", "rows/s", "b1_tfos", "TensorFlowOnSpark 2.2.5"),
    Row("B1 feeding an RDD to 2 nodes", "b1-shared.json", "b1_nb_rdd", "rows/s", "b1_rdd_ceiling",
        "Spark alone: `rdd.mapPartitions` → numpy batches", "≥ 0.95×",
        readme="feeding an RDD (B1), against Spark's own read"),
    Row("B4a cluster start + shutdown, 2 nodes", "latest.json", "b4a_nb", "start+shutdown s", "b4a_tfos",
        "TensorFlowOnSpark 2.2.5", "≤ 5 s, ≤ 0.5×", readme="cluster start + shutdown, 2 nodes (B4a)"),
    Row("B2 training, MLP, 40k rows, 2 nodes, epochs of known length: `model.fit`", "b2-shared.json", "tfos_nb",
        "fit s", "native_untuned", "native MultiWorkerMirroredStrategy told its length (each worker's rows in memory, "
        "`steps_per_epoch`), the same tf.data settings", "≤ 1.05×", readme="training on 2 nodes (B2), fit"),
    Row("B2 training, MLP, 40k rows, 2 nodes, epochs of known length: wall", "b2-shared.json", "tfos_nb",
        "wall s", "native_untuned", "native MultiWorkerMirroredStrategy told its length, the same tf.data settings",
        readme="training on 2 nodes (B2), wall"),
    Row("B2 training, MLP, 40k rows, 2 nodes, epochs of known length: the machine's CPU-seconds a step, whole run",
        "b2-shared.json", "tfos_nb", "cpu ms/step", "native_untuned",
        "native MultiWorkerMirroredStrategy told its length, the same tf.data settings",
        readme="training on 2 nodes (B2), CPU a step"),
    Row("B2 training, MLP, 40k rows, 2 nodes, epochs of known length: `model.fit`", "b2-shared.json", "tfos_nb",
        "fit s", "native", "native MultiWorkerMirroredStrategy told its length, default tf.data settings (as written)"),
    Row("B2 training, MLP, 40k rows, 2 nodes, epochs of known length: `model.fit`", "b2-spark-read.json", "tfos_nb",
        "fit s", "native_untuned", "native MultiWorkerMirroredStrategy told its length, the same tf.data settings"),
    Row("B2 training, MLP, 40k rows, 2 nodes, epochs of known length: the machine's CPU-seconds a step, whole run",
        "b2-spark-read.json", "tfos_nb", "cpu ms/step", ("native_untuned", "spark_read"),
        "the same native run plus Spark alone reading each epoch into Python", "≤ 1.03×"),
    Row("B2 training, MLP, 40k rows, 2 nodes, epochs of unknown length (`TFOS_KNOWN_LENGTH=0`): `model.fit`",
        "b2-known-length.json", "tfos_nb_unknown", "fit s", "native", "native MultiWorkerMirroredStrategy told its length"),
    Row("B2 training, MLP, 40k rows, 2 nodes: `model.fit` (before epochs of known length)", "b2-latest.json", "tfos_nb",
        "fit s", "native_untuned", "native MultiWorkerMirroredStrategy, the same tf.data settings", "≤ 1.05×"),
    Row("B2 training, MLP, 40k rows, 2 nodes: wall (before epochs of known length)", "b2-latest.json", "tfos_nb",
        "wall s", "native_untuned", "native MultiWorkerMirroredStrategy, the same tf.data settings"),
    Row("B2 training, `as_dataset(cache=True)`: `model.fit`", "b2-latest.json", "tfos_nb_cache", "fit s",
        "native_untuned", "native MultiWorkerMirroredStrategy, the same tf.data settings", "≤ 1.02×",
        readme="training with `cache=True` (B2), fit"),
    Row("B2 training: the machine's CPU-seconds a step, whole run", "b2-latest.json", "tfos_nb", "cpu ms/step",
        "native_untuned", "native MultiWorkerMirroredStrategy, the same tf.data settings", "≤ 1.05×"),
    Row("B2 training: the machine's CPU-seconds a step, whole run", "b2-latest.json", "tfos_nb", "cpu ms/step",
        ("native_untuned", "spark_read"), "the same native run plus Spark alone reading each epoch into Python "
        "(the least any trainer fed by Spark every epoch uses)"),
    Row("B2 training, MLP, 40k rows, 2 nodes: `model.fit`", "b2-latest.json", "tfos_nb", "fit s",
        "native_generator_chunks", AS_A_FEED),
    Row("B2 training: the machine's CPU-seconds a step, whole run", "b2-latest.json", "tfos_nb", "cpu ms/step",
        ("native_generator_chunks", "spark_read"), "native through `from_generator` plus Spark alone reading each epoch"),
    Row("B2 training, MLP, 40k rows, 2 nodes: `model.fit`", "b2-latest.json", "tfos_nb", "fit s", "native_once",
        UNKNOWN_LENGTH),
    Row("B2 training: the machine's CPU-seconds a step, whole run", "b2-latest.json", "tfos_nb", "cpu ms/step",
        ("native_once", "spark_read"), "native, its length unknown, plus Spark alone reading each epoch (the least a "
        "stream fed by Spark every epoch uses)"),
    Row("B2 training, as written: `model.fit`", "b2-latest.json", "tfos_nb", "fit s", "native",
        "native MultiWorkerMirroredStrategy, default tf.data settings"),
    Row("B2 training, MLP, 160k rows: `model.fit`", "b2-160k.json", "tfos_nb", "fit s", "native_untuned",
        "native MultiWorkerMirroredStrategy, the same tf.data settings", "≤ 1.03×"),
    Row("B2 training, MLP, 160k rows: CPU-seconds a step", "b2-160k.json", "tfos_nb", "cpu ms/step",
        "native_untuned", "native MultiWorkerMirroredStrategy, the same tf.data settings", "≤ 1.05×"),
    Row("B2 training, MLP, 160k rows: CPU-seconds a step", "b2-160k.json", "tfos_nb", "cpu ms/step",
        ("native_untuned", "spark_read"), "the same native run plus Spark alone reading each epoch into Python"),
    Row("B2 training, MLP, 160k rows: `model.fit`", "b2-160k.json", "tfos_nb", "fit s", "native_once", UNKNOWN_LENGTH),
    Row("B2 training, MLP, 160k rows: CPU-seconds a step", "b2-160k.json", "tfos_nb", "cpu ms/step",
        ("native_once", "spark_read"), "native, its length unknown, plus Spark alone reading each epoch"),
    Row("B2 training, CNN, 20k rows: `model.fit`", "b2-cnn.json", "tfos_nb", "fit s", "native_untuned",
        "native MultiWorkerMirroredStrategy, the same tf.data settings", "≤ 1.02×"),
    Row("B2 training, CNN, 20k rows: `model.fit`", "b2-cnn.json", "tfos_nb", "fit s", "native_generator_chunks",
        AS_A_FEED),
    Row("B2 training, CNN, 20k rows: CPU-seconds a step", "b2-cnn.json", "tfos_nb", "cpu ms/step",
        ("native_untuned", "spark_read"), "the same native run plus Spark alone reading each epoch into Python"),
    Row("B2 the model written for Keras 3 (`import keras`): `model.fit`", "b2-keras3.md", "tfos_nb_keras3", "fit s",
        "tfos_nb", "the same program on tf_keras (Keras 2)"),
    Row("B2 Keras 3 in one process, no tfos_nb: `model.fit`", "b2-keras3.md", "single_keras3", "fit s", "single",
        "the same program on tf_keras (Keras 2)"),
    Row("B3 inference, 100k rows, warm: `TFModel.transform`", "b3-latest.json", "tfos_nb TFModel.transform", "warm s",
        "predict_batch_udf", "Spark's `predict_batch_udf` (its UDF made once, its workers settled)",
        "≤ 0.77× (1.3× the rate)", readme="inference, `TFModel.transform` (B3), warm"),
    Row("B3 inference, 100k rows, cold (a new Spark application)", "b3-latest.json", "tfos_nb TFModel.transform",
        "cold s", "predict_batch_udf", "Spark's `predict_batch_udf` (its UDF made once, its workers settled)",
        "≤ 1.2×"),
    Row("B4b a `%%tfos_cluster` cell, 2 nodes", "b4b-latest.json", "cell", "s", "api",
        "the same `TFCluster.run` + `shutdown()` in a cell", "≤ +0.5 s", readme="a `%%tfos_cluster` cell (B4b)"),
)


def load(name: str, results: str | None = None) -> dict[str, Any]:
    """A results file: ``NAME.json`` (``harness.write_runs``), or a B2 report from before those (``NAME.md``) read
    from its "Every run, in order" table."""
    return _read(os.path.join(results or RESULTS, name))


@functools.cache
def _read(path: str) -> dict[str, Any]:  # several rows read one file: once
    with open(path) as f:
        return json.load(f) if path.endswith(".json") else _every_run_table(f.read(), os.path.basename(path))


def _every_run_table(text: str, name: str) -> dict[str, Any]:
    lines = text.splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.startswith("| variant | run |")), None)
    if head is None:
        raise ValueError(f"{name}: no table of every run")
    columns = [c.strip() for c in lines[head].strip("|").split("|")]
    out = []
    for line in lines[head + 2:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        metrics = {k: float(v) for k, v in zip(columns[2:], cells[2:]) if k.endswith(" s") and v}
        out.append({"variant": cells[0], "run": cells[1], "metrics": metrics})
    date = lines[0].split(" — ", 1)[1].split(",", 1)[0] if " — " in lines[0] else "?"
    return {"date": date, "runs": out}


def per_step(m: Mapping[str, float], seconds: str) -> float | None:
    """A run's ``seconds`` metric in ms per training step (``cpu s``: the machine's busy CPU time over the run, every
    process either side uses; ``cpu GROUP s``: one group's)."""
    value, steps = m.get(seconds), m.get("steps")
    return 1000.0 * value / steps if value is not None and steps else None


DERIVED = {"cpu ms/step": lambda m: per_step(m, "cpu s")}  # metrics computed from a run's recorded ones


def runs(doc: Mapping[str, Any], variant: str, metric: str) -> list[float]:
    """The counted runs of ``variant`` (warm-ups left out), in the order they ran."""
    out = []
    for r in doc["runs"]:
        if r["variant"] != variant or r["run"] == "warm-up":
            continue
        value = DERIVED[metric](r["metrics"]) if metric in DERIVED else r["metrics"].get(metric)
        if value is not None:
            out.append(float(value))
    return out


def reference_runs(doc: Mapping[str, Any], reference: str | tuple[str, ...], metric: str) -> list[float]:
    """The reference's counted runs; for several variants, the sum of their runs of the same round (the i-th of
    each: the benchmarks run the variants in rounds), as many as the variant with the fewest has."""
    if isinstance(reference, str):
        return runs(doc, reference, metric)
    each = [runs(doc, variant, metric) for variant in reference]
    return [sum(rnd) for rnd in zip(*each)]


def fmt(value: float, metric: str, scale: float | None = None) -> str:
    """A figure as the table writes it: rows/s whole, other figures with 2 decimals under 10 (``scale``: the row's
    largest figure, so that one row keeps one precision) and 1 from there."""
    if metric.endswith("/s"):
        return f"{value:,.0f}"
    return f"{value:.2f}" if (value if scale is None else scale) < 10 else f"{value:.1f}"


def unit(metric: str) -> str:
    return metric.rsplit(" ", 1)[-1] if " " in metric else metric


@dataclass(frozen=True)
class Figures:
    """A row's figures, computed from the runs."""

    row: Row
    values: list[float]
    median: float
    best: float
    ratio_median: float | None
    ratio_fastest: float | None
    n_ref: int


def figures(row: Row, results: str | None = None) -> Figures:
    doc = load(row.results, results)
    values = runs(doc, row.variant, row.metric)
    if not values:
        raise ValueError(f"{row.results}: no counted run of {row.variant!r} has {row.metric!r}")
    mine = harness.Spread(values, row.higher_is_better)
    ratio_median = ratio_fastest = None
    ref: list[float] = []
    if row.reference:
        ref = reference_runs(doc, row.reference, row.metric)
        if not ref:
            raise ValueError(f"{row.results}: no counted run of the reference {row.reference!r} has {row.metric!r}")
        got = mine.ratio(harness.Spread(ref, row.higher_is_better))
        ratio_median, ratio_fastest = got.median, got.fastest
    return Figures(row, values, mine.median, mine.fastest, ratio_median, ratio_fastest, len(ref))


def ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}×"


def docs_table(results: str | None = None) -> str:
    lines = ["| benchmark | every run (in order) | median (range) | against | median / median | fastest / fastest "
             "| target | results |", "|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        f = figures(row, results)
        u, top = unit(row.metric), max(f.values)
        lines.append(
            f"| {row.benchmark} | {' · '.join(fmt(v, row.metric, top) for v in f.values)} {u} "
            f"| {fmt(f.median, row.metric, top)} {u} ({fmt(min(f.values), row.metric, top)}–{fmt(top, row.metric)}) "
            f"| {row.against} | {ratio(f.ratio_median)} | {ratio(f.ratio_fastest)} | {row.target} "
            f"| `{row.results}` |")
    if any(row.results == CPU_FILE for row in ROWS):
        lines += ["", cpu_table(results)]
    if os.path.exists(os.path.join(results or RESULTS, SCALE_FILE)):
        lines += ["", scale_table(results)]
    dates = sorted({load(name, results)["date"] for name in dict.fromkeys(r.results for r in ROWS)})
    lines += ["", "Runs of " + ", ".join(dates) + "; each results file has its command and setting, its report "
              "(`.md`) the machine. A ratio under 1 is faster for times, over 1 for rows/s."]
    return "\n".join(lines)


CPU_FILE, CPU_VARIANTS = "b2-latest.json", (("native_untuned", "native, the same tf.data settings"),
                                             ("native_once", "native, its length unknown"),
                                             ("native_generator_chunks", "native through `from_generator`, as a feed"),
                                             ("spark_read", "Spark alone: each epoch read into Python, dropped"),
                                             ("tfos_nb", "tfos_nb, every epoch through Spark"),
                                             ("tfos_nb_cache", "tfos_nb, `cache=True`"))
CPU_GROUPS = (("nodes", "the nodes (native: its 2 processes)"), ("feeders", "feeding Python workers"),
              ("JVMs", "the JVMs (executors, driver)"), ("driver", "the driver (Python)"))
JVM_THREADS = (("tasks", "Spark's task threads"), ("JIT", "JIT compilers"), ("GC", "garbage collectors"),
               ("other", "the rest (RPC, scheduler, py4j)"))


def cpu_table(results: str | None = None) -> str:
    """B2's CPU a training step by group of processes, and the JVMs' by thread (medians over the runs;
    ``memory.CPU_GROUPS``, ``memory.JVM_THREADS``)."""
    doc = load(CPU_FILE, results)

    def cell(variant: str, of_run: Callable[[Mapping[str, float]], float | None]) -> str:
        """The median over the variant's counted runs of ``of_run(metrics)``, as the table shows it."""
        got = harness.median(of_run(r["metrics"]) for r in doc["runs"] if r["variant"] == variant and r["run"] != "warm-up")
        return "" if got is None else f"{got:.1f}"

    def cells(variant: str, metrics: Sequence[str]) -> list[str]:
        return [cell(variant, lambda m, seconds=seconds: per_step(m, seconds)) for seconds in metrics]

    def feed_per_1000_rows(m: Mapping[str, float]) -> float | None:
        """The feed's CPU (feeding Python workers and JVMs) a 1,000 rows trained: a step trains a global batch."""
        feeders, jvms = per_step(m, "cpu feeders s"), per_step(m, "cpu JVMs s")
        return None if feeders is None or jvms is None else 1000.0 / batch * (feeders + jvms)

    batch = int(re.search(r"global batch (\d+)", doc["setting"]).group(1))
    present = [(v, words) for v, words in CPU_VARIANTS if runs(doc, v, "cpu s")]
    lines = ["B2, CPU milliseconds a training step, whole run (medians of the runs in `%s`; the last column: the "
             "feeding Python workers' and the JVMs' CPU milliseconds a 1,000 rows trained, %d rows a step):"
             % (CPU_FILE, batch), "",
             "| variant | " + " | ".join(words for _, words in CPU_GROUPS)
             + " | the machine, all processes | the feed, ms a 1,000 rows trained |",
             "|---|" + "---|" * (len(CPU_GROUPS) + 2)]
    lines += [f"| {words} | " + " | ".join(cells(v, [f"cpu {g} s" for g, _ in CPU_GROUPS] + ["cpu s"]) + [cell(v, feed_per_1000_rows)])
              + " |" for v, words in present]
    lines += ["", "The JVMs' part of it, by thread (ms a training step):", "",
              "| variant | " + " | ".join(words for _, words in JVM_THREADS) + " |",
              "|---|" + "---|" * len(JVM_THREADS)]
    lines += [f"| {words} | " + " | ".join(cells(v, [f"cpu JVM {k} s" for k, _ in JVM_THREADS])) + " |"
              for v, words in present]
    return "\n".join(lines)


SCALE_FILE = "b6-latest.json"
SCALE_COLUMNS = (("nodes", "nodes", "{:.0f}"), ("run s", "`run()` returned (s)", "{:.2f}"),
                 ("driver cpu %", "driver CPU, % of a core", "{:.1f}"), ("driver rss MiB", "driver RSS (MiB)", "{:.0f}"),
                 ("rtt p50 ms", "heartbeat p50 (ms)", "{:.1f}"), ("rtt p99 ms", "heartbeat p99 (ms)", "{:.1f}"),
                 ("snapshot ms", "a snapshot (ms)", "{:.1f}"), ("panel ms", "the panel from it (ms)", "{:.1f}"),
                 ("panel kB", "the panel (kB)", "{:.1f}"),
                 ("assignments/s", "feed assignments a second", "{:.0f}"),
                 ("history MB", "history, full (MB)", "{:.0f}"),
                 ("shutdown s", "`shutdown()` (s)", "{:.2f}"), ("failure named s", "a failure named (s)", "{:.2f}"),
                 ("failure raised s", "its error raised (s)", "{:.2f}"), ("mlflow calls", "MLflow calls", "{:.0f}"),
                 ("mlflow metrics", "MLflow metrics", "{:.0f}"))
CELL_FILE = "b6-cell.json"
CELL_COLUMNS = (("nodes", "nodes", "{:.0f}"), ("kernel cpu %", "kernel CPU, % of a core", "{:.1f}"),
                ("panel updates/s", "panel updates a second", "{:.1f}"), ("panel kB/s", "panel kB a second", "{:.1f}"),
                ("largest update kB", "largest update (kB)", "{:.1f}"), ("output lines/s", "output lines a second", "{:.0f}"),
                ("output kB/s", "output kB a second", "{:.1f}"), ("all iopub kB/s", "all the kernel sent, kB a second", "{:.1f}"))


def scale_table(results: str | None = None) -> str:
    """B6: the driver with simulated nodes, one row a size (``benchmarks/bench_sim.py``)."""
    doc = load(SCALE_FILE, results)
    lines = [f"B6, the driver with simulated nodes ({doc['setting']}; `{SCALE_FILE}`):", "",
             "| " + " | ".join(words for _, words, _ in SCALE_COLUMNS) + " |", "|" + "---|" * len(SCALE_COLUMNS)]
    for r in doc["runs"]:
        m = r["metrics"]
        lines.append("| " + " | ".join(form.format(m[k]) if k in m else "" for k, _, form in SCALE_COLUMNS) + " |")
    if os.path.exists(os.path.join(results or RESULTS, CELL_FILE)):
        cell = load(CELL_FILE, results)
        lines += ["", f"B6, a `%%tfos_cluster` cell of simulated nodes in a real kernel, the panel on, measured from the "
                      f"front-end's side ({cell['setting']}; `{CELL_FILE}`):", "",
                  "| " + " | ".join(words for _, words, _ in CELL_COLUMNS) + " |", "|" + "---|" * len(CELL_COLUMNS)]
        for r in cell["runs"]:
            m = r["metrics"]
            lines.append("| " + " | ".join(form.format(m[k]) if k in m else "" for k, _, form in CELL_COLUMNS) + " |")
    return "\n".join(lines)


def axis_table(results: str | None = None) -> str:
    """B2's partition axis: tfos_nb's ``model.fit`` and Spark alone reading the same epochs, each partition count
    against the same rows in 2 partitions (median against median, fastest against fastest)."""
    lines = ["| the 40k rows in | `model.fit` median (range) | against 2 partitions: median, fastest "
             "| Spark alone reading the 3 epochs: median (range) | its CPU-seconds | tfos_nb's nodes' CPU-seconds "
             "| both over 2 cores | machine busy (median) | runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = None
    for label, name in AXIS:
        if not os.path.exists(os.path.join(results or RESULTS, name)):
            continue
        doc = load(name, results)
        fit = harness.Spread(runs(doc, "tfos_nb", "fit s"), False)
        read = runs(doc, "spark_read", "wall s")
        busy = runs(doc, "tfos_nb", "cpu busy %")
        read_cpu, nodes_cpu = runs(doc, "spark_read", "cpu s"), runs(doc, "tfos_nb", "cpu nodes s")
        base = base or fit
        r = fit.ratio(base)
        lines.append(f"| {label} | {fit.median:.1f} s ({min(fit.values):.1f}–{max(fit.values):.1f}) "
                     f"| {ratio(r.median)}, {ratio(r.fastest)} "
                     f"| {statistics.median(read):.2f} s ({min(read):.2f}–{max(read):.2f}) "
                     f"| {statistics.median(read_cpu):.1f} | {statistics.median(nodes_cpu):.1f} "
                     f"| {(statistics.median(read_cpu) + statistics.median(nodes_cpu)) / 2:.1f} s "
                     f"| {statistics.median(busy):.0f} % | {len(fit.values)} |" if read and busy and read_cpu else
                     f"| {label} | {fit.median:.1f} s | {ratio(r.median)}, {ratio(r.fastest)} | | | | | | {len(fit.values)} |")
    return "\n".join(lines)


def readme_table(results: str | None = None) -> str:
    lines = ["| | tfos_nb: median of the runs (fastest) | against it: median, fastest | against |", "|---|---|---|---|"]
    for row in ROWS:
        if not row.readme:
            continue
        f = figures(row, results)
        u, top = unit(row.metric), max(f.values)
        lines.append(f"| {row.readme} | {fmt(f.median, row.metric, top)} {u} ({fmt(f.best, row.metric, top)}) "
                     f"| {ratio(f.ratio_median)}, {ratio(f.ratio_fastest)} | {row.against} |")
    return "\n".join(lines)


def replaced(text: str, markers: tuple[str, str], block: str, path: str) -> str:
    start, end = markers
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{path}: needs the markers {start!r} and {end!r} once each")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{block}\n{end}{tail}"


def targets(results: str | None = None) -> dict[str, str]:
    """Each file's text with its tables as the results files give them (B2's partition axis where the page has its
    markers)."""
    out: dict[str, str] = {}
    for path, markers, block in ((DOCS, DOCS_MARKERS, docs_table(results)), (DOCS, AXIS_MARKERS, None),
                                 (README, README_MARKERS, readme_table(results))):
        if path not in out:
            with open(path) as f:
                out[path] = f.read()
        if block is None:  # optional
            if markers[0] not in out[path]:
                continue
            block = axis_table(results)
        out[path] = replaced(out[path], markers, block, path)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a file's table differs from the results files")
    opts = p.parse_args(argv)
    stale = []
    for path, text in targets().items():
        with open(path) as f:
            if f.read() == text:
                continue
        if opts.check:
            stale.append(os.path.relpath(path, ROOT))
        else:
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {os.path.relpath(path, ROOT)}")
    if stale:
        print(f"not the results files' figures: {', '.join(stale)} (run: python benchmarks/table.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
