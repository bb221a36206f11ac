"""Feeding a running cluster from Spark Structured Streaming (real Spark file-source streams, real TF nodes)."""

from __future__ import annotations

import functools
import sys

import cloudpickle
import numpy as np
import pytest

from tests.conftest import StreamSource, spark_fixture, start_cluster, wait_until
from tfos_nb import TFCluster
from tfos_nb.TFCluster import TFClusterError

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "id long, x1 double, x2 double, y double"


# foreachBatch starts PySpark's py4j callback server (one per SparkContext, stopped with it): start it
# with the session so that no_leaks counts it as Spark's, not as a port the runtime left open.
spark = spark_fixture(2, callback_server=True)


run = functools.partial(start_cluster, input_mode=TFCluster.InputMode.SPARK)


def _row(i):
    x1, x2 = (i % 7) / 7.0, (i % 5) / 5.0
    return {"id": i, "x1": x1, "x2": x2, "y": 3 * x1 - x2 + 0.5}


def Source(root):  # a StreamSource of this module's rows
    return StreamSource(root, SCHEMA, _row)


def stream_train_fun(args, ctx):
    """Fits a linear model (numpy SGD: the runtime's feed is under test here, the notebook runs Keras on a
    stream) on whatever the stream brings; remembers every id it was fed."""
    import os

    import numpy as np

    feed = ctx.get_data_feed()
    w, b = np.zeros(2), 0.0
    seen, step = [], 0
    while not feed.should_stop():
        cols = feed.next_batch_arrays(16)
        if not cols:
            continue
        ids, x1, x2, y = cols
        if (ids < 0).any():
            raise ValueError(f"poison row {int(ids.min())} in the stream")
        seen.extend(ids.tolist())
        x = np.stack([x1, x2], 1)
        err = x @ w + b - y
        w, b = w - 0.2 * 2 * x.T @ err / len(y), b - 0.2 * 2 * err.mean()
        step += 1
        ctx.report(step=step, rows=len(seen), loss=float(np.mean(err**2)))
    np.save(os.path.join(args["out"], f"{ctx.job_name}-{ctx.task_index}.npy"), np.asarray(seen, dtype="int64"))


def stream_infer_fun(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_arrays(32)
        if not cols:
            continue
        ids, x1, x2, _ = cols
        if (ids < 0).any():
            raise ValueError(f"poison row {int(ids.min())} in the stream")
        feed.batch_results({"id": ids, "pred": x1 + 2.0 * x2})


def test_training_stream_feeds_every_row_exactly_once(spark, tmp_path, no_leaks):
    src, out = Source(tmp_path), tmp_path / "seen"
    out.mkdir()
    checkpoint = str(tmp_path / "checkpoint")
    cluster = run(spark.sparkContext, stream_train_fun, {"out": str(out)})
    try:
        feed = cluster.train_stream(src.stream(spark), checkpoint_location=checkpoint)
        assert feed.is_active and cluster.streams == (feed,)
        src.write(150)
        src.write(120)
        feed.process_all_available()  # new files appeared while the query ran
        assert feed.rows == 270
        src.write(90)
        src.write(77)
        feed.process_all_available()
        assert (feed.rows, feed.skipped, feed.batches) == (src.next_id, 0, 4)
        with pytest.raises(RuntimeError, match="training stream feeds this cluster"):
            cluster.train(spark.range(3))
        with pytest.raises(TypeError, match="streaming DataFrame"):
            cluster.train_stream(spark.range(3))
        feed.stop()
        assert not feed.is_active and cluster.streams == ()
        # Restarted from its checkpoint, the query feeds only the new file; availableNow ends it by itself.
        src.write(33)
        again = cluster.train_stream(src.stream(spark), checkpoint_location=checkpoint, trigger={"availableNow": True})
        assert again.wait(timeout=120) and not again.is_active
        assert (again.rows, again.batches) == (33, 1)
        total = src.next_id
        assert wait_until(lambda: cluster.status().rows_fed == total, 10)  # what the panel shows
    finally:
        cluster.shutdown()  # stops the query first, then the nodes
    assert cluster.streams == ()
    nodes = cluster.nodes
    assert all(n.state == "finished" for n in nodes), [(n.label, n.state, n.error) for n in nodes]
    seen = {p.name: np.load(p) for p in out.glob("*.npy")}
    assert len(seen) == 2 and all(len(ids) > 0 for ids in seen.values()), {k: len(v) for k, v in seen.items()}
    ids = np.concatenate(list(seen.values()))
    assert len(ids) == total and sorted(ids.tolist()) == list(range(total))  # each row once, none lost
    assert all(np.isfinite(n.metrics["loss"]) for n in nodes)
    # the streams' own counters agree: every row fed once, none skipped (last_feed is train()'s: a stream leaves it)
    assert (feed.rows + again.rows, feed.skipped, again.skipped) == (total, 0, 0)
    assert cluster.last_feed == {}


def test_inference_stream_writes_a_prediction_for_every_row_and_errors_name_the_node(spark, tmp_path, no_leaks):
    src = Source(tmp_path)
    cluster = run(spark.sparkContext, stream_infer_fun, {})
    try:
        with pytest.raises(ValueError, match="query_name"):
            cluster.inference_stream(src.stream(spark), "id long, pred double", "memory")
        feed = cluster.inference_stream(src.stream(spark), "id long, pred double", "memory",
                                        query_name="tfos_test_preds")
        files = cluster.inference_stream(src.stream(spark), "id long, pred double", "parquet",
                                         path=str(tmp_path / "preds"))
        for n in (64, 100):
            src.write(n)
        feed.process_all_available()
        files.process_all_available()
        rows = spark.table("tfos_test_preds").collect()
        on_disk = spark.read.parquet(str(tmp_path / "preds")).collect()
        assert feed.is_active and files.is_active
        for got in (rows, on_disk):
            assert sorted(r.id for r in got) == list(range(src.next_id))
            for r in got:
                assert r.pred == pytest.approx((r.id % 7) / 7.0 + 2 * (r.id % 5) / 5.0)
        # A node that raises while the stream runs: the feed's wait() names it, both queries stop.
        src.write(20, poison=True)
        with pytest.raises(TFClusterError) as info:
            feed.wait(timeout=120)
        assert "worker:" in str(info.value) and "poison row" in str(info.value), str(info.value)
        assert not feed.is_active and not files.is_active
    finally:
        cluster.shutdown()  # the error was raised already: the cluster is down, shutdown() is a no-op
    assert cluster.streams == () and cluster.status().state == "failed"


def test_magic_feeds_a_streaming_dataframe_until_tfos_shutdown(spark, tmp_path, no_leaks):
    import IPython
    from IPython.core.error import UsageError
    from IPython.testing.globalipapp import start_ipython

    start_ipython()
    ip = IPython.get_ipython()
    ip.run_line_magic("load_ext", "tfos_nb")
    magics = ip.magics_manager.registry["TFOSMagics"]
    renderer = magics.renderer
    magics.renderer = "none"
    src, out = Source(tmp_path), tmp_path / "seen"
    out.mkdir()
    val_df = spark.createDataFrame([_row(10_000 + i) for i in range(30)], SCHEMA)  # a static validation set
    names = dict(spark=spark, sdf=src.stream(spark), stream_train_fun=stream_train_fun, out_dir=str(out), val_df=val_df)
    ip.user_ns.update(names)
    try:
        with pytest.raises(UsageError, match="--epochs does not apply to a streaming --data sdf"):
            ip.run_cell_magic("tfos_cluster", "--workers 1 --data sdf --epochs 2", "pass")
        ip.run_cell_magic("tfos_cluster", "--workers 1 --data sdf --validation-data val_df --background --name streamed",
                          "v = ctx.get_data_feed(qname_in='validation')\n"
                          "print('validation ids', sorted(int(i) for c in iter(lambda: v.next_batch_arrays(8), ()) "
                          "for i in c[0]))\n"
                          "stream_train_fun({'out': out_dir}, ctx)")
        handle = ip.user_ns["streamed"]
        try:
            assert wait_until(lambda: handle.cluster is not None and handle.cluster.streams, 120), handle.state
            feed = handle.cluster.streams[0]
            src.write(40)
            src.write(25)
            feed.process_all_available()
            assert wait_until(lambda: handle.status().rows_fed == 65, 10)  # the panel's "rows fed"
        finally:
            ip.run_line_magic("tfos_shutdown", "streamed")
        assert handle.done and handle.state == "stopped" and not feed.is_active
        # the stream fed the training feed; the static DataFrame, fed once before it, the set "validation"
        assert f"validation ids {list(range(10_000, 10_030))}" in handle.logs()["chief:0"]
    finally:  # the shell is shared with other test modules: leave it as it was
        magics.renderer = renderer
        magics.handles.pop("streamed", None)
        for name in [*names, "streamed"]:
            ip.user_ns.pop(name, None)
