#!/usr/bin/env python
"""Issue 41: a randomized stress run of the feed -- no hang, and every epoch's rows taken exactly once.

Each trial feeds a generated DataFrame (an id, a float array of width 1-64, a label) of 0-3,000 rows in 1-32
partitions laid out evenly, with empty partitions, or skewed (one partition holding 90 % of the rows), for 1-4
epochs, to 1-3 nodes of a real ``local-cluster`` application.  Two kinds of trial:

* ``keras``: the nodes train a Keras MLP under ``MultiWorkerMirroredStrategy`` with ``model.fit(
  feed.as_dataset(batch_size))`` -- several trials (``train()`` calls) on one cluster, one after another; some read
  with ``cache=True`` (one epoch fed, the rest replayed), some with a node slowed at every epoch end (a callback
  that sleeps); the rows each node took in each epoch are counted from its feed;
* ``tfos``: TensorFlowOnSpark's loop, ``while not feed.should_stop(): feed.next_batch(n)``, independent nodes, one
  trial a cluster; some end early (node 0 calls ``terminate()`` after a few batches); every row id each node took
  is returned and audited against the DataFrame's (each id exactly once per epoch, or skipped and counted so).

A trial *hangs* when its ``train()`` (or its cluster's ``shutdown()``) has not returned within ``--deadline``
seconds (a watchdog then takes every node's stacks and kills the cluster), or when it ended by a feed timeout.  The report: trials,
hangs, failures, the rows fed against the rows taken per epoch (every trial must match exactly), the slowest epoch.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/stress_feed.py --trials 200 --seed 1`` (about 25 minutes on 2
cores); writes ``benchmarks/results/stress-feed.md``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import threading
import time
from typing import Any

import cloudpickle
import harness

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NODE_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2", "OMP_NUM_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2"}


# -- the trials ---------------------------------------------------------------------------------------------------
def sizes_for(rng: random.Random, rows: int, parts: int, layout: str) -> list[int]:
    """How many of ``rows`` each of ``parts`` partitions holds, laid out ``even``, ``empty`` or ``skewed``."""
    if layout == "skewed" and parts > 1:
        big = rows * 9 // 10
        rest = [rows - big]
        out = [big] + [0] * (parts - 1)
        for i in range(rest[0]):
            out[1 + i % (parts - 1)] += 1
        rng.shuffle(out)
        return out
    holders = list(range(parts))
    if layout == "empty" and parts > 1:
        holders = sorted(rng.sample(range(parts), max(1, parts // 2)))
    out = [0] * parts
    for i in range(rows):
        out[holders[i % len(holders)]] += 1
    return out


def make_trials(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    trials = []
    for i in range(n):
        kind = rng.choice(["keras", "keras", "tfos"])
        rows = rng.choice([0, 1, 50, 500, 1500, 3000]) if kind == "tfos" else rng.choice([1, 50, 500, 1500, 3000])
        parts = rng.choice([1, 2, 3, 4, 7, 16, 32])
        layout = rng.choice(["even", "empty", "skewed"])
        trials.append({
            "id": i, "kind": kind, "nodes": rng.choice([1, 2, 3]), "rows": rows, "width": rng.choice([1, 8, 64]),
            "sizes": sizes_for(rng, rows, parts, layout), "layout": layout, "epochs": rng.randint(1, 4),
            "batch": rng.choice([1, 7, 32, 64, 256]) if kind == "tfos" else rng.choice([16, 64, 256]),
            "cache": kind == "keras" and rng.random() < 0.15,
            "slow": rng.random() < 0.2,
            "terminate_after": rng.choice([1, 3]) if kind == "tfos" and rng.random() < 0.2 else 0,
        })
    return trials


def groups(trials: list[dict[str, Any]], per_cluster: int) -> list[list[dict[str, Any]]]:
    """Keras trials share a cluster with others of the same size (a cache trial ends its cluster's feed: last);
    a tfos trial has its own."""
    out: list[list[dict[str, Any]]] = []
    open_: dict[int, list[dict[str, Any]]] = {}
    for t in trials:
        if t["kind"] == "tfos":
            out.append([t])
            continue
        group = open_.setdefault(t["nodes"], [])
        group.append(t)
        if len(group) >= per_cluster or t["cache"]:
            out.append(group)
            del open_[t["nodes"]]
    out.extend(g for g in open_.values() if g)
    return out


# -- node functions -------------------------------------------------------------------------------------------------
def keras_fun(args: dict[str, Any], ctx: Any) -> Any:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed()
    hub = feed._hub  # the node's own count of rows taken (a benchmark may look inside)
    results = []
    for t in args["trials"]:
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((t["width"],)), tf.keras.layers.Dense(4, activation="relu"),
                                         tf.keras.layers.Dense(1, activation="sigmoid")])
            model.compile(optimizer="adam", loss="binary_crossentropy")
        counts: list[int] = []
        times: list[float] = []

        class Count(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.rows, self.t0 = hub.rows, time.monotonic()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                counts.append(hub.rows - self.rows)
                times.append(time.monotonic() - self.t0)
                if t["slow"] and ctx.task_index == 0 and ctx.job_name != "chief":
                    time.sleep(0.3)  # a node slowed at every epoch boundary

        ds = feed.as_dataset(batch_size=t["batch"], columns=(1, 2), cache=t["cache"])
        model.fit(ds, epochs=t["epochs"], verbose=0, callbacks=[Count()])
        results.append({"id": t["id"], "rows": counts, "times": times})
    return results


def tfos_fun(args: dict[str, Any], ctx: Any) -> Any:
    t = args["trial"]
    feed = ctx.get_data_feed()
    ids: list[int] = []
    batches = 0
    while not feed.should_stop():
        rows = feed.next_batch(t["batch"])
        ids.extend(int(r[0]) for r in rows)
        batches += 1 if rows else 0
        if t["slow"] and ctx.task_index == 0 and batches % 10 == 0:
            time.sleep(0.05)
        if t["terminate_after"] and ctx.task_index == 0 and batches >= t["terminate_after"]:
            feed.terminate()
            break
    return {"id": t["id"], "ids": ids}


# -- the driver ----------------------------------------------------------------------------------------------------
def frame(spark: Any, t: dict[str, Any]) -> Any:
    sizes, width = t["sizes"], t["width"]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]

    def rows(p: int) -> Any:
        import random as r

        g = r.Random(p)
        for i in range(starts[p], starts[p] + sizes[p]):
            x = [g.random() for _ in range(width)]
            yield (i, x, float(x[0] > 0.5))

    rdd = spark.sparkContext.parallelize(range(len(sizes)), len(sizes)).flatMap(rows)
    return spark.createDataFrame(rdd, "id long, x array<float>, y float")


class Watchdog:
    """Kills a cluster whose trial outlives ``deadline`` seconds, after taking its nodes' stacks."""

    def __init__(self, deadline: float) -> None:
        self.deadline, self.cluster, self.fired, self.stacks = deadline, None, False, {}  # deadline: per train()
        self._done = threading.Event()

    def watch(self, cluster: Any) -> None:
        """Start (again) the deadline: each train() call and the shutdown has ``deadline`` seconds of its own."""
        self._done.set()  # the last watch's thread ends
        self.cluster, self._done = cluster, threading.Event()
        threading.Thread(target=self._run, args=(self._done,), daemon=True).start()

    def _run(self, done: threading.Event) -> None:
        if not done.wait(self.deadline) and not self.fired:
            self.fired = True
            try:
                self.stacks = self.cluster.stacks(timeout=10)
            except Exception as exc:
                self.stacks = {"error": repr(exc)}
            ctl = self.cluster._controller
            self.stacks["controller"] = repr({"assigned": getattr(ctl, "_assigned", None),
                                              "active": getattr(ctl, "_active", None),
                                              "rows_fed": [(n.label, n.rows_fed) for n in self.cluster.nodes],
                                              "feed_errors": list(ctl.feed_errors)})
            self.cluster._job.cancel("stress watchdog")

    def stop(self) -> None:
        self._done.set()


def run_group(spark: Any, group: list[dict[str, Any]], deadline: float, out: list[dict[str, Any]]) -> None:
    from tfos_nb import TFCluster

    t0 = group[0]
    kind, nodes = t0["kind"], t0["nodes"]
    fn, args = (keras_fun, {"trials": group}) if kind == "keras" else (tfos_fun, {"trial": t0})
    dog = Watchdog(deadline)
    started = time.monotonic()
    fed: dict[int, dict[str, int]] = {}
    error = None
    detail: list[str] = []
    cluster = None
    try:
        cluster = TFCluster.run(spark.sparkContext, fn, args, nodes, input_mode=TFCluster.InputMode.SPARK,
                                master_node="chief" if kind == "keras" else None, env=NODE_ENV)
        for t in group:
            dog.watch(cluster)
            cluster.train(frame(spark, t), num_epochs=1 if t["cache"] else t["epochs"], feed_timeout=deadline)
            fed[t["id"]] = dict(cluster.last_feed)
        dog.watch(cluster)
        cluster.shutdown(timeout=deadline)
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        detail = str(exc).splitlines()[-40:]
        if cluster is not None:
            try:
                cluster.shutdown(timeout=30)
            except Exception:
                pass
    finally:
        dog.stop()
    values = list(cluster.state.values().values()) if cluster is not None else []
    took = time.monotonic() - started
    for t in group:
        out.append({**check(t, fed.get(t["id"]), values, error, dog, took / len(group)), "detail": detail})


def check(t: dict[str, Any], fed: dict[str, int] | None, values: list[Any], error: str | None, dog: Watchdog,
          took: float) -> dict[str, Any]:
    """The trial's outcome: hang / failed / ok, and whether the rows taken match the rows fed."""
    hang = dog.fired or (error is not None and ("timed out" in error or "feed_timeout" in error))
    res: dict[str, Any] = {**{k: t[k] for k in ("id", "kind", "nodes", "rows", "epochs", "layout", "cache",
                                                  "slow", "terminate_after", "batch", "width")},
                           "partitions": len(t["sizes"]), "fed": fed, "hang": hang, "error": error, "seconds": round(took, 1),
                           "stacks": dog.stacks if dog.fired else None}
    if error is not None or fed is None:
        res["exact"] = False
        return res
    n, e = t["rows"], t["epochs"]
    if t["kind"] == "keras":
        per_node = [next(r for r in v if r["id"] == t["id"]) for v in values if isinstance(v, list)]
        epochs_fed = 1 if t["cache"] else e
        taken = [sum(r["rows"][k] for r in per_node) for k in range(e)]
        expected = [n] * epochs_fed + [0] * (e - epochs_fed)
        res["exact"] = taken == expected and fed["rows"] == n * epochs_fed and fed["skipped"] == 0
        res["taken"], res["expected"] = taken, expected
        res["slowest_epoch_s"] = max((x for r in per_node for x in r["times"]), default=0.0)
    else:
        ids = collections.Counter(i for v in values if isinstance(v, dict) for i in v["ids"])
        taken = sum(ids.values())
        every_once = all(c <= e for c in ids.values()) and set(ids) <= set(range(n))
        if t["terminate_after"]:  # what node 0 did not read is skipped, and counted so
            ok = taken == fed["rows"] and fed["rows"] + fed["skipped"] == n * e and every_once
        else:
            ok = taken == fed["rows"] == n * e and fed["skipped"] == 0 and all(ids[i] == e for i in range(n))
        res["exact"], res["taken"], res["expected"] = ok, taken, n * e
    return res


def report(results: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    hangs = [r for r in results if r["hang"]]
    failed = [r for r in results if r["error"] and not r["hang"]]
    inexact = [r for r in results if not r["error"] and not r["exact"]]
    slow = max((r.get("slowest_epoch_s", 0.0) for r in results), default=0.0)
    mix = collections.Counter((r["kind"], r["layout"]) for r in results)
    lines = [
        "# Feed stress run (issue 41)", "",
        f"Command: `PYTHONPATH=. .venv/bin/python benchmarks/stress_feed.py --trials {args.trials} --seed {args.seed}`"
        f" ({wall / 60:.1f} min, {time.strftime('%Y-%m-%d')}).", "",
        "| trials | hangs | failed | rows taken ≠ rows fed | slowest epoch |", "|---|---|---|---|---|",
        f"| {len(results)} | {len(hangs)} | {len(failed)} | {len(inexact)} | {slow:.1f} s |", "",
        "Mix: " + ", ".join(f"{k} {lay}: {c}" for (k, lay), c in sorted(mix.items())) + "; "
        f"nodes 1/2/3: {sum(r['nodes'] == 1 for r in results)}/{sum(r['nodes'] == 2 for r in results)}/"
        f"{sum(r['nodes'] == 3 for r in results)}; cache=True {sum(r['cache'] for r in results)}; slowed node "
        f"{sum(r['slow'] for r in results)}; early terminate() {sum(bool(r['terminate_after']) for r in results)}; "
        f"1-32 partitions, {sum(r['rows'] == 0 for r in results)} trials of no rows.", "",
    ]
    for title, rows in (("Hangs", hangs), ("Failures", failed), ("Inexact", inexact)):
        if rows:
            lines += [f"## {title}", ""] + [f"- `{json.dumps({k: v for k, v in r.items() if k not in ('stacks', 'detail')})}`"
                                            for r in rows] + [""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per-cluster", type=int, default=4)
    p.add_argument("--deadline", type=float, default=120.0)
    p.add_argument("--out", default="benchmarks/results/stress-feed.md")
    p.add_argument("--only", default="", help="comma-separated trial ids: run only the groups holding them")
    args = p.parse_args()
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = harness.spark_session("local-cluster[3,1,1024]", "tfos_nb-stress-feed",
                                  conf={"spark.task.maxFailures": "1"}, executor_env=NODE_ENV)
    trials = make_trials(args.trials, args.seed)
    only = {int(i) for i in args.only.split(",") if i}
    plan = [g for g in groups(trials, args.per_cluster) if not only or only & {t["id"] for t in g}]
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for i, group in enumerate(plan):
            run_group(spark, group, args.deadline, results)
            bad = [r for r in results[-len(group):] if r["hang"] or r["error"] or not r["exact"]]
            print(f"[{i}] {len(results)}/{len(trials)} trials, {group[0]['kind']} x{len(group)} on "
                  f"{group[0]['nodes']} node(s): {bad or 'ok'}", flush=True)
    finally:
        spark.stop()
    text = report(results, args, time.monotonic() - t0)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1)
    print(text)
    return 0 if all(not r["hang"] and not r["error"] and r["exact"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
