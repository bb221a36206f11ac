"""TFCluster on a real local Spark Connect server: no SparkContext, a coordinator hosted on an executor."""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, StreamSource, connect_fixture, runtime_processes, start_cluster, wait_until
from tfos_nb import TFCluster
from tfos_nb.TFCluster import TFClusterError

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = connect_fixture(2)


run = start_cluster


def coordinators():
    return [p for p in runtime_processes() if "coordinator" in p.cmdline()]


def nothing_left():
    return wait_until(lambda: not runtime_processes(), 30) or [" ".join(p.cmdline()) for p in runtime_processes()]


def test_tensorflow_mode_runs_to_completion(spark):
    def fun(args, ctx):
        for step in range(5):
            ctx.report(step=step + 1, metrics={"loss": 1.0 / (step + 1)})
        print(f"hello from {ctx.job_name}:{ctx.task_index}")
        return ctx.task_index

    cluster = run(spark, fun, {}, 2)
    assert len(coordinators()) == 1
    cluster.shutdown(timeout=120)
    assert cluster.status().state == "finished"
    assert [n.step for n in cluster.nodes] == [5, 5]
    assert any("hello from worker:1" in line for line in cluster.logs("worker:1")["worker:1"])
    assert cluster.state.values() == {"worker:0": 0, "worker:1": 1}
    assert nothing_left() is True


def test_spark_mode_train_and_inference(spark):
    def fun(args, ctx):
        val = ctx.get_data_feed(qname_in="validation")  # the set train(..., validation=) fed before the epochs
        held = [int(i) for batch in iter(lambda: val.next_batch_arrays(64), ()) for i in batch[1]]
        print(f"validation rows {len(held)}")
        feed = ctx.get_data_feed()
        n = 0
        while not feed.should_stop():
            batch = feed.next_batch(50)
            if batch:
                if ctx.mgr is not None and isinstance(batch[0], tuple) and len(batch[0]) == 1:
                    feed.batch_results([(row[0] * 2,) for row in batch])
                else:
                    n += len(batch)
                    ctx.report(step=n)
        print(f"rows {n}")
        return held

    cluster = run(spark, fun, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    df = spark.range(0, 1000, 1, 4).selectExpr("cast(id as float) as x", "id % 10 as y")
    cluster.train(df, 2, validation=spark.range(5000, 5300, 1, 3).selectExpr("cast(id as float) as x", "id as y"))
    assert cluster.last_feed["rows"] == 2000
    assert cluster.last_sets == {"validation": {"rows": 300, "skipped": 0, "partitions": 3, "shared": 300}}
    out = cluster.inference(spark.range(0, 100, 1, 2).selectExpr("cast(id as double) as x"), schema="y double")
    assert sorted(r.y for r in out.collect()) == [2.0 * i for i in range(100)]
    cluster.shutdown(timeout=120)
    assert sum(n.step for n in cluster.nodes) == 2000  # every training row was read (inference rows answered)
    assert sorted(i for held in cluster.state.values().values() for i in held) == list(range(5000, 5300))
    assert sum(n.rows_fed for n in cluster.nodes) >= 2000
    assert nothing_left() is True


def test_rdd_input_is_refused_and_node_error_names_node_and_tail(spark):
    def fun(args, ctx):
        if ctx.task_index == 1:
            print("about to fail")
            raise ValueError("boom on connect")
        import time

        time.sleep(60)

    with pytest.raises(TFCluster.TFClusterError) as info:
        cluster = run(spark, fun, {}, 2, input_mode=TFCluster.InputMode.SPARK)
        with pytest.raises(ValueError, match="Spark Connect"):
            cluster.inference(spark.range(3))  # no schema: it would need an RDD
        cluster.shutdown(timeout=60)
    text = str(info.value)
    assert info.value.node == "worker:1" and text.startswith("worker:1 failed on host ")
    assert "ValueError: boom on connect" in text and "about to fail" in text
    assert nothing_left() is True


def test_cancel_tears_everything_down(spark):
    def fun(args, ctx):
        import time

        while True:
            ctx.report(step=1)
            time.sleep(0.1)

    cluster = run(spark, fun, {}, 2)
    assert wait_until(lambda: all(n.step == 1 for n in cluster.nodes), 30)
    assert len(coordinators()) == 1
    cluster.cancel("test")
    assert cluster.status().state in ("stopped", "failed")
    assert all(n.state in ("stopped", "failed") for n in cluster.nodes)
    assert nothing_left() is True
    assert not coordinators()


def test_tensorflowonspark_program(spark):
    def main_fun(args, ctx):
        from tfos_nb import TFNode

        feed = TFNode.DataFeed(ctx.mgr, False)
        seen = 0
        while not feed.should_stop():
            batch = feed.next_batch(args["batch"])
            seen += len(batch)
            if seen >= args["stop_after"]:
                feed.terminate()
        ctx.report(step=seen)

    rdd_rows = [(float(i), i % 3) for i in range(400)]
    df = spark.createDataFrame(rdd_rows, "x double, y long").repartition(4)
    cluster = run(spark, main_fun, {"batch": 20, "stop_after": 100}, 2, input_mode=TFCluster.InputMode.SPARK)
    cluster.train(df, 1)
    cluster.shutdown(timeout=120)
    assert cluster.status().state == "finished"
    assert all(n.step >= 100 for n in cluster.nodes)
    assert cluster.last_feed["rows"] + cluster.last_feed["skipped"] == 400
    assert nothing_left() is True


def test_not_enough_executors_fails_at_once(spark):
    """3 nodes on 2 task slots: one clear error before anything launches (not Spark's barrier retries)."""
    import time

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"not enough executors: asked for 3 nodes, 2 task slot\(s\)"):
        run(spark, lambda args, ctx: None, {}, 3)
    assert time.monotonic() - t0 < 30  # the alternative is Spark's barrier check: minutes
    assert nothing_left() is True


def test_the_doctor_checks_a_connect_session(spark, tmp_path):
    """The doctor's probe as a barrier mapInArrow stage: the executors' checks as on a classic session, what the
    session allows, and too few slots as one FAIL."""
    from tfos_nb import doctor

    report = doctor(spark, nodes=2, export_dir=str(tmp_path / "export"))
    print("\n" + report.text())
    assert report.backend == "connect" and report.ok and not report.warnings, report.text()
    assert {c.area for c in report.checks} >= {"session", "slots", "python", "tfos_nb", "tensorflow", "network", "storage"}
    assert "every node reached every other (2 connections)" in report.text()
    (fail,) = doctor(spark, nodes=3).failures
    assert fail.area == "slots" and "3 nodes need 3 task slots" in fail.detail


NOTEBOOK = """
import json, pathlib, sys, time
from pyspark.sql import SparkSession
from tfos_nb import TFCluster

url, env, started = sys.argv[1], json.loads(sys.argv[2]), pathlib.Path(sys.argv[3])
spark = SparkSession.builder.remote(url).getOrCreate()

def fun(args, ctx):
    import time
    while True:
        ctx.report(step=1)
        time.sleep(0.1)

cluster = TFCluster.run(spark, fun, {}, 2, env=env, notebook_timeout=5)
started.write_text("started")
time.sleep(600)  # the test kills this process: a notebook whose kernel died
"""


def test_a_notebook_that_dies_leaves_nothing_behind(spark, tmp_path):
    """The kernel dies (SIGKILL) with a cluster running: the in-cluster coordinator stops the cluster after
    notebook_timeout, the nodes and the coordinator exit, the executors' slots are free again."""
    import json
    import os
    import subprocess

    import psutil

    script, started = tmp_path / "notebook.py", tmp_path / "started"
    script.write_text(NOTEBOOK)
    url = f"sc://localhost:{spark.conf.get('spark.connect.grpc.binding.port')}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, str(script), url, json.dumps(NODE_ENV), str(started)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(started.exists, 240, what="the cluster to start in the other process", proc=proc)

        def its_processes():
            found = []
            for p in psutil.process_iter(["cmdline"]):
                try:
                    if "tfos_nb.runtime" in (p.info.get("cmdline") or []) and p.environ().get("TFOS_DRIVER_PID") == str(proc.pid):
                        found.append(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            return found

        left = its_processes()
        assert any("coordinator" in p.cmdline() for p in left), [p.cmdline() for p in left]
        assert len(left) >= 3  # the coordinator and a supervisor (and its node) per node
        proc.kill()
        proc.wait(30)
        # notebook_timeout 5 s, then the nodes at their next heartbeat and the coordinator once they are quiet
        assert wait_until(lambda: not its_processes(), 90), [" ".join(p.cmdline()) for p in its_processes()]
        assert spark.range(0, 4, 1, 2).count() == 4
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


# -- streaming feeds: the foreachBatch function runs on the Connect server ---------------------------------------


def Source(root):  # a StreamSource of this module's rows
    return StreamSource(root, "id long, x1 double, x2 double", lambda i: {"id": i, "x1": (i % 7) / 7.0, "x2": (i % 5) / 5.0})


def stream_train_fun(args, ctx):
    """Reads whatever the stream brings; returns every id it read."""
    feed = ctx.get_data_feed()
    seen = []
    while not feed.should_stop():
        cols = feed.next_batch_arrays(16)
        if not cols:
            continue
        if (cols[0] < 0).any():
            raise ValueError(f"poison row {int(cols[0].min())} in the stream")
        seen.extend(cols[0].tolist())
        ctx.report(step=len(seen))
    return seen


def stream_infer_fun(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_arrays(32)
        if not cols:
            continue
        ids, x1, x2 = cols
        if (ids < 0).any():
            raise ValueError(f"poison row {int(ids.min())} in the stream")
        feed.batch_results({"id": ids, "pred": x1 + 2.0 * x2})


def test_training_stream_feeds_every_row_once(spark, tmp_path):
    src = Source(tmp_path)
    cluster = run(spark, stream_train_fun, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        feed = cluster.train_stream(src.stream(spark))
        assert feed.is_active and feed.on_server and cluster.streams == (feed,)
        src.write(150)
        src.write(120)
        feed.process_all_available()  # the counts are the coordinator's, current when this returns
        assert feed.rows == 270
        src.write(90)
        feed.process_all_available()
        assert (feed.rows, feed.skipped, feed.batches) == (360, 0, 3)
        with pytest.raises(RuntimeError, match="training stream feeds this cluster"):
            cluster.train(spark.range(3))
        assert wait_until(lambda: cluster.status().rows_fed == 360, 10)  # what the panel shows
        cluster.request_stop()
        assert not feed.is_active and cluster.streams == () and not spark.streams.active
        assert feed.rows == 360
    finally:
        cluster.shutdown(timeout=120)
    assert cluster.status().state == "finished"
    seen = cluster.state.values()
    assert len(seen) == 2 and all(seen.values()), seen
    assert sorted(i for ids in seen.values() for i in ids) == list(range(360))  # each row once, none lost
    assert not spark.streams.active
    assert nothing_left() is True


def test_training_stream_node_error_names_the_node(spark, tmp_path):
    src = Source(tmp_path)
    cluster = run(spark, stream_train_fun, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        feed = cluster.train_stream(src.stream(spark))
        src.write(48)  # whole batches of 16: next_batch_arrays(16) waits for 16 rows while the epoch is open
        feed.process_all_available()
        src.write(32, poison=True)
        with pytest.raises(TFClusterError) as info:
            feed.process_all_available()  # raises when the node failed before its micro-batch was taken,
            feed.wait(timeout=120)  # else the node fails after taking it: wait() sees it
        text = str(info.value)
        assert info.value.node and info.value.node.startswith("worker:") and "poison row" in text, text
        assert not feed.is_active and cluster.streams == () and not spark.streams.active
    finally:
        cluster.shutdown(timeout=60)  # the error was raised already: the cluster is down
    assert cluster.status().state == "failed"
    assert nothing_left() is True


def test_training_stream_feed_error_is_one_clear_error(spark, tmp_path):
    def idle_fun(args, ctx):
        import time

        ctx.get_data_feed()
        time.sleep(600)  # takes no data: the micro-batch's feeding task times out

    src = Source(tmp_path)
    cluster = run(spark, idle_fun, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        feed = cluster.train_stream(src.stream(spark), feed_timeout=3)
        src.write(10)
        with pytest.raises(RuntimeError) as info:
            feed.process_all_available()
        text = str(info.value)
        assert not isinstance(info.value, TFClusterError)
        assert text.startswith("feeding micro-batch 0 failed: ") and "Timeout while feeding partition 0 to worker:" in text, text
        assert "took no data for 3 s" in text and "Traceback" not in text, text
        assert not feed.is_active and cluster.streams == () and not spark.streams.active and cluster.closed
    finally:
        cluster.shutdown(timeout=60)
    assert cluster.status().state in ("stopped", "failed")
    assert nothing_left() is True


def test_inference_stream_writes_a_prediction_for_every_row(spark, tmp_path):
    src = Source(tmp_path)
    cluster = run(spark, stream_infer_fun, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        feed = cluster.inference_stream(src.stream(spark), "id long, pred double", "memory",
                                        query_name="tfos_connect_preds")
        for n in (64, 100):
            src.write(n)
        feed.process_all_available()
        rows = spark.table("tfos_connect_preds").collect()
        assert feed.is_active
        assert sorted(r.id for r in rows) == list(range(src.next_id))
        for r in rows:
            assert r.pred == pytest.approx((r.id % 7) / 7.0 + 2 * (r.id % 5) / 5.0)
        src.write(20, poison=True)  # a node raises while the stream runs: wait() names it, the query stops
        with pytest.raises(TFClusterError) as info:
            feed.wait(timeout=120)
        assert "worker:" in str(info.value) and "poison row" in str(info.value), str(info.value)
        assert not feed.is_active and not spark.streams.active
    finally:
        cluster.shutdown(timeout=60)
    assert cluster.streams == () and cluster.status().state == "failed"
    assert nothing_left() is True
