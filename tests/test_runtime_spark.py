"""The runtime on real Spark (local-cluster: real master, workers, executor JVMs) and real TensorFlow."""

from __future__ import annotations

import os
import sys
import time

import cloudpickle
import numpy as np
import pytest

from tests.conftest import NODE_ENV, runtime_processes, spark_fixture, start_cluster, wait_until
from tfos_nb import TFCluster, dfutil
from tfos_nb.examples import digits

pytestmark = pytest.mark.slow
# Node functions defined here travel by value (executors cannot import this test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXECUTORS = 4


spark = spark_fixture(EXECUTORS)



@pytest.fixture(scope="module")
def digits_data(spark):
    xtr, ytr, xte, yte = digits.load_digits_arrays()
    df = digits.to_dataframe(spark, xtr, ytr, partitions=6).cache()
    df.count()
    return xtr, ytr, xte, yte, df


run = start_cluster


def accuracy(sc, export_dir, xte, yte):
    """Predict with a 2-node inference cluster; one prediction per row, in order."""
    cluster = run(sc, digits.predict_fun, {"export_dir": export_dir}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        rdd = sc.parallelize([(x,) for x in xte.tolist()], 5)
        preds = cluster.inference(rdd).collect()
    finally:
        cluster.shutdown()
    assert len(preds) == len(yte)
    return float(np.mean(np.asarray(preds) == yte)), preds


# ---------------------------------------------------------------------------


def test_mwms_chief_and_two_workers_from_dataframe(sc, digits_data, tmp_path, no_leaks):
    xtr, ytr, xte, yte, df = digits_data
    export = str(tmp_path / "model")
    # three nodes split each epoch three ways (~14 steps each): 8 epochs keep accuracy clear of 0.9 (5 gave 0.89 once)
    args = {"epochs": 8, "batch_size": 32, "export_dir": export}
    cluster = run(sc, digits.train_fun, args, 3, master_node="chief", input_mode=TFCluster.InputMode.SPARK)
    roles = sorted(n.label for n in cluster.nodes)
    assert roles == ["chief:0", "worker:0", "worker:1"]
    spec = {n.label: n for n in cluster.nodes}
    assert len({(n.host, n.port) for n in spec.values()}) == 3
    cluster.train(df, num_epochs=8)
    assert cluster.last_feed["rows"] == 8 * len(ytr) and cluster.last_feed["skipped"] == 0
    cluster.shutdown()
    nodes = cluster.nodes
    assert all(n.state == "finished" for n in nodes), [(n.label, n.state, n.error) for n in nodes]
    assert all(n.step and n.step > 0 and "loss" in n.metrics for n in nodes)
    assert cluster.status().state == "finished"
    acc, preds = accuracy(sc, export, xte, yte)
    assert acc >= 0.9, acc


def test_mwms_from_rdd_and_inference_in_order(sc, digits_data, tmp_path, no_leaks):
    xtr, ytr, xte, yte, _ = digits_data
    export = str(tmp_path / "model")
    rdd = sc.parallelize(list(zip(xtr.tolist(), ytr.tolist())), 6)
    args = {"epochs": 5, "batch_size": 32, "export_dir": export}
    with run(sc, digits.train_fun, args, 3, master_node="chief", input_mode=TFCluster.InputMode.SPARK) as cluster:
        cluster.train(rdd, num_epochs=5)
    assert cluster.status().state == "finished"
    acc, preds = accuracy(sc, export, xte, yte)
    assert acc >= 0.9, acc
    # In order: the same rows again, reversed partitions, give the same predictions reversed.
    cluster = run(sc, digits.predict_fun, {"export_dir": export}, 2, input_mode=TFCluster.InputMode.SPARK)
    try:
        again = cluster.inference(sc.parallelize([(x,) for x in xte[::-1].tolist()], 3)).collect()
    finally:
        cluster.shutdown()
    assert again == preds[::-1]


def epoch_reader(args, ctx):
    import json

    deadline = time.monotonic() + 120
    while "go" in args and not os.path.exists(args["go"]) and time.monotonic() < deadline:  # the test says when
        time.sleep(0.05)
    ds = ctx.get_data_feed().as_dataset(batch_size=16, cache=args.get("cache", False), shuffle=args.get("shuffle", 0))
    seen = []
    for _ in range(args["epochs"]):  # what model.fit(ds, epochs=3) does: one iteration per epoch
        seen.append([int(i) for _, ids in ds for i in ids.numpy()])
    with open(os.path.join(args["out"], f"node{ctx.worker_num}.json"), "w") as f:
        json.dump(seen, f)
    while "release" in args and not os.path.exists(args["release"]) and time.monotonic() < deadline:
        time.sleep(0.05)  # the test says when to return


def test_pipelined_epochs_each_iteration_reads_its_own_epoch(spark, sc, tmp_path, no_leaks):
    """train() submits the next epoch's job once the current one's tasks all started; each as_dataset
    iteration still reads exactly one epoch."""
    import json
    import threading

    n = 3000
    # Not cached: each epoch's job first runs the shuffle as a job of its own (adaptive execution), and the
    # next epoch's job must wait for the feeding stage's tasks, not that one's (it deadlocked: the next epoch's
    # feeders took both slots of a 2-slot cluster before this epoch's had started).
    df = spark.createDataFrame([(float(i), i) for i in range(n)], "x double, id long").repartition(4)
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")  # keep 4 partitions
    go = tmp_path / "go"
    cluster = run(sc, epoch_reader, {"epochs": 3, "out": str(tmp_path), "go": str(go)}, 2,
                  input_mode=TFCluster.InputMode.SPARK)
    tracker = sc.statusTracker()

    def running(epoch):
        return any((info := tracker.getJobInfo(j)) is not None and info.status == "RUNNING"
                   for j in tracker.getJobIdsForGroup(f"{cluster.state.job_group}-feed-{epoch}"))

    trainer = threading.Thread(target=cluster.train, args=(df,), kwargs={"num_epochs": 3})
    trainer.start()
    try:
        # The nodes read nothing yet, so epoch 1's 4 tasks (4 slots) wait for them: epoch 2's job is submitted.
        both = wait_until(lambda: running(1) and running(2), 60)
    finally:
        go.touch()
        trainer.join(300)
        cluster.shutdown()
        spark.conf.unset("spark.sql.adaptive.coalescePartitions.enabled")
    assert both, "epoch 2's job was not submitted while epoch 1's ran"
    assert not trainer.is_alive()
    assert cluster.last_feed == {"rows": 3 * n, "skipped": 0, "partitions": 12, "shared": 3 * n}
    per_node = [json.loads((tmp_path / f"node{i}.json").read_text()) for i in range(2)]
    for epoch in range(3):
        ids = sorted(i for node in per_node for i in node[epoch])
        assert ids == list(range(n)), f"epoch {epoch + 1}: {len(ids)} ids, {len(set(ids))} distinct"


def test_cached_dataset_replays_the_first_epoch_reshuffled_and_skips_later_epochs(spark, sc, tmp_path, no_leaks):
    """as_dataset(cache=True, shuffle=N): every iteration after the first replays this node's share of the first
    epoch (the same rows, in a new order), and the node stops reading once it is cached, so epochs fed by mistake
    are skipped rather than queued."""
    import json
    import threading

    n = 2000
    df = spark.createDataFrame([(float(i), i) for i in range(n)], "x double, id long").repartition(4)
    release = tmp_path / "release"
    args = {"epochs": 3, "out": str(tmp_path), "cache": True, "shuffle": 100, "release": str(release)}
    with run(sc, epoch_reader, args, 2, input_mode=TFCluster.InputMode.SPARK) as cluster:
        # the documented form is num_epochs=1; 3 shows the extra epochs skipped
        trainer = threading.Thread(target=cluster.train, args=(df,), kwargs={"num_epochs": 3})
        trainer.start()
        try:
            # the nodes' functions wait for the release: train() ends because they stopped reading once cached
            returned = wait_until(lambda: not trainer.is_alive(), 90)
        finally:
            release.touch()
            trainer.join(120)
    assert returned, "train() waited for the nodes' functions to return: epochs 2 and 3 stayed queued"
    assert cluster.last_feed["rows"] == n, cluster.last_feed  # the first epoch only, every row of it once
    assert cluster.last_feed["skipped"] > 0, cluster.last_feed
    assert cluster.status().state == "finished"
    per_node = [json.loads((tmp_path / f"node{i}.json").read_text()) for i in range(2)]
    assert sorted(i for node in per_node for i in node[0]) == list(range(n))
    for node in per_node:
        assert all(sorted(epoch) == sorted(node[0]) for epoch in node[1:]), "a later epoch is not the first's rows"
        assert len({tuple(epoch) for epoch in node}) == 3, "the replayed epochs came in the same order"


def test_mwms_trains_on_partitions_of_unequal_size(sc, digits_data, tmp_path, no_leaks):
    """One node gets 1,200 rows an epoch, the other 148: under MultiWorkerMirroredStrategy the nodes step together,
    so the one whose share ends first must end its epoch then (Keras gives it empty batches while its peer reads
    on), not wait for the epoch's end, which waits for the rows its peer can only read by stepping with it (it did:
    the feed timed out)."""
    xtr, ytr, *_ = digits_data
    rows = [(x, int(y)) for x, y in zip(xtr.tolist(), ytr.tolist())]  # TensorFlowOnSpark's rows: tuples
    parts = [rows[:1200], rows[1200:]]
    rdd = sc.parallelize([0, 1], 2).flatMap(lambda i: parts[i])
    args = {"epochs": 3, "batch_size": 32, "export_dir": str(tmp_path / "model")}
    with run(sc, digits.train_fun, args, 2, input_mode=TFCluster.InputMode.SPARK) as cluster:
        cluster.train(rdd, num_epochs=3, feed_timeout=90)
    assert cluster.last_feed == {"rows": 3 * len(rows), "skipped": 0, "partitions": 6, "shared": 3 * len(rows)}
    assert cluster.status().state == "finished"
    steps = {n.label: n.step for n in cluster.nodes}
    assert len(set(steps.values())) == 1 and steps["worker:0"] >= 3 * 1200 // 32, steps  # in step, the longer share


def ps_fun(args, ctx):
    import json

    import tensorflow as tf

    if ctx.job_name in ("ps", "worker"):
        cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
        server = tf.distribute.Server(cluster, job_name=ctx.job_name, task_index=ctx.task_index, start=True)
        server.join()  # stopped by the runtime at shutdown
        return
    from tfos_nb.examples import digits

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    x, y, _, _ = digits.load_digits_arrays()
    with strategy.scope():
        model = digits.build_model(0.02)

    def dataset_fn(input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512).repeat().batch(32)

    hist = model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=3,
        steps_per_epoch=20,
        verbose=0,
        callbacks=[ctx.progress_callback()],
    )
    losses = hist.history["loss"]
    print("losses", losses)
    assert losses[-1] < losses[0], losses


def test_parameter_server_strategy_one_ps_two_workers_and_chief(sc, no_leaks):
    t0 = time.monotonic()
    cluster = run(sc, ps_fun, {}, 4, num_ps=1, master_node="chief")
    assert sorted(n.label for n in cluster.nodes) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    cluster.shutdown(timeout=240)
    states = {n.label: n.state for n in cluster.nodes}
    assert states["chief:0"] == "finished"
    assert {states["ps:0"], states["worker:0"], states["worker:1"]} == {"stopped"}
    assert any("losses" in line for line in cluster.logs("chief:0", tail=None)["chief:0"])
    assert time.monotonic() - t0 < 240


def tf_mode_fun(args, ctx):
    import tensorflow as tf

    files = tf.io.gfile.glob(args["data"] + "/part-*")
    shard = files[ctx.task_index :: ctx.num_workers]
    spec = {"x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
    n = 0
    for rec in tf.data.TFRecordDataset(shard).map(lambda r: tf.io.parse_single_example(r, spec)):
        n += 1
        assert rec["x"].shape == (4,)
    print(f"read {n} records from {len(shard)} files")
    ctx.report(step=n, records=n)


def test_input_mode_tensorflow_reads_tfrecords(spark, sc, tmp_path, no_leaks):
    df = spark.createDataFrame([([float(i)] * 4, i) for i in range(100)], "x array<float>, y long").repartition(4)
    out = str(tmp_path / "tfr")
    dfutil.saveAsTFRecords(df, out)
    back = dfutil.loadTFRecords(sc, out)
    assert back.count() == 100 and sorted(r.y for r in back.collect()) == list(range(100))
    assert dict(back.dtypes) == {"x": "array<double>", "y": "bigint"}  # TensorFlowOnSpark: floats are doubles
    cluster = run(sc, tf_mode_fun, {"data": out}, 2, input_mode=TFCluster.InputMode.TENSORFLOW)
    cluster.shutdown(timeout=180)
    assert sum(n.step for n in cluster.nodes) == 100


def failing_fun(args, ctx):
    import time as t

    for step in range(12000):  # the other nodes run for 10 minutes unless the failure stops them
        ctx.report(step=step)
        if ctx.job_name == "worker" and ctx.task_index == 1 and step == 3:
            raise ValueError(f"boom at step {step} (t={t.time():.3f})")
        t.sleep(0.05)


def test_node_error_names_role_host_and_tail_within_seconds(sc, no_leaks):
    import re

    cluster = None
    # The node fails right after it starts: run() itself or the next call ends with its error.
    with pytest.raises(TFCluster.TFClusterError) as info:
        cluster = run(sc, failing_fun, {}, 3, master_node="chief")
        cluster.shutdown(timeout=600)
    raised_at = float(re.search(r"\(t=([0-9.]+)\)", str(info.value)).group(1))
    elapsed = time.time() - raised_at  # from the node's raise to the driver's exception
    err = info.value
    # The error reaches the driver in a heartbeat or two (0.5 s each); without that path, shutdown() would end at
    # its timeout (600 s) or when the other nodes end (10 minutes): 60 s is room for a loaded machine, a tenth of both.
    assert elapsed < 60, elapsed
    assert err.node == "worker:1" and err.host
    text = str(err)
    assert text.startswith("worker:1 failed on host ")
    assert "ValueError: boom at step 3" in text
    assert "Traceback" in text and "failing_fun" in text
    if cluster is not None:
        assert cluster.status().state == "failed"
        # every other node was stopped, nothing keeps running
        assert all(n.state in ("stopped", "failed", "finished") for n in cluster.nodes)
    assert wait_until(lambda: not runtime_processes(), 10), runtime_processes()


def test_error_during_train_ends_train(sc, digits_data, no_leaks):
    *_, df = digits_data

    def bad_reader(args, ctx):
        feed = ctx.get_data_feed()
        feed.next_batch(10)
        raise RuntimeError("cannot read this")

    cluster = run(sc, bad_reader, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    t0 = time.monotonic()
    with pytest.raises(TFCluster.TFClusterError, match="RuntimeError: cannot read this"):
        cluster.train(df, 3, feed_timeout=300)
    assert time.monotonic() - t0 < 120  # ended by the node's error, not by the feed timeout
    cluster.shutdown()  # idempotent after the teardown


def test_not_enough_executors_fails_fast(sc, no_leaks):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"asked for {EXECUTORS + 1} nodes, {EXECUTORS} task slot\(s\) available"):
        run(sc, failing_fun, {}, EXECUTORS + 1)
    assert time.monotonic() - t0 < 120  # refused up front, not after the reservation timeout (600 s)


def test_bad_arguments_are_value_errors(sc):
    with pytest.raises(ValueError, match="leaves no chief/worker node"):
        run(sc, failing_fun, {}, 2, num_ps=2)
    with pytest.raises(ValueError, match="non-negative integer"):
        run(sc, failing_fun, {}, -1)
    with pytest.raises(ValueError, match="master_node must be"):
        run(sc, failing_fun, {}, 2, master_node="boss")


def test_wrongly_shaped_rows_name_the_column(spark, sc, no_leaks):
    df = spark.createDataFrame([([1.0, 2.0], 1), ([1.0], 2)], "features array<float>, label long").coalesce(1)

    def reader(args, ctx):
        feed = ctx.get_data_feed()
        while not feed.should_stop():
            if not feed.next_batch_arrays(10):
                break

    cluster = run(sc, reader, {}, 1, input_mode=TFCluster.InputMode.SPARK)
    # The node fails while (or just after) train() hands over the rows: whichever call
    # comes next ends with the node's error naming the column.
    with pytest.raises(TFCluster.TFClusterError, match="column 'features' holds arrays of different lengths"):
        try:
            cluster.train(df, 1)
        finally:
            cluster.shutdown()


@pytest.mark.parametrize("entry", ["sc", "spark"])
def test_cluster_is_context_manager_and_shutdown_idempotent(entry, spark, sc, no_leaks):
    def noop(args, ctx):
        return None

    with run(sc if entry == "sc" else spark, noop, {}, 2) as cluster:  # TFoS passes sc; a SparkSession works too
        assert cluster.status().state in ("running", "finished")
    cluster.shutdown()
    cluster.shutdown()
    assert cluster.status().state == "finished"


def gpu_fun(args, ctx):
    print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    print("ctx.gpus=" + ",".join(g["index"] for g in ctx.gpus))


def test_gpus_from_nvidia_smi_one_per_node_and_reported(sc, tmp_path, no_leaks):
    from tests import fake_nvidia_smi

    env = dict(NODE_ENV, PATH=fake_nvidia_smi.path_with(fake_nvidia_smi.install(tmp_path / "bin")))
    cluster = run(sc, gpu_fun, {}, 2, env=env)
    cluster.shutdown(timeout=60)
    nodes = {n.label: n for n in cluster.nodes}
    got = set()
    for label, n in nodes.items():
        out = "\n".join(cluster.logs(label, tail=None)[label])
        (visible,) = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("CUDA_VISIBLE")]
        got.add(visible)
        assert f"ctx.gpus={visible}" in out
        assert n.device.startswith("NVIDIA A100-SXM4-80GB ("), n.device
    assert got == {"0", "1"}  # two nodes on one host: one GPU each, no collision


def test_cpu_only_nodes_say_cpu(sc, no_leaks):
    env = dict(NODE_ENV, PATH="/usr/bin:/bin")  # no nvidia-smi
    cluster = run(sc, gpu_fun, {}, 1, env=env)
    cluster.shutdown(timeout=60)
    assert cluster.nodes[0].device == "CPU"


def test_train_twice_on_a_running_cluster(spark, sc, no_leaks, caplog):
    def counter(args, ctx):
        feed = ctx.get_data_feed()
        n = 0
        while not feed.should_stop():
            cols = feed.next_batch_arrays(64)
            if cols:
                n += len(cols[0])
                ctx.report(step=n)
        print(f"rows {n}")

    df = spark.range(1000).selectExpr("cast(id as float) as x", "id % 10 as y").repartition(4)
    cluster = run(sc, counter, {}, 2, input_mode=TFCluster.InputMode.SPARK)
    cluster.train(df, 1)
    for bad in (0, -5, 2.5, True):  # refused up front, the cluster untouched
        with pytest.raises(ValueError, match="batch_rows must be a positive integer"):
            cluster.train(df, 1, batch_rows=bad)
    with pytest.raises(ValueError, match="batch_rows must be a positive integer"):
        cluster.inference(df.rdd, batch_rows=0)
    # TensorFlowOnSpark's second queue (issue 50): fed as a named set the nodes keep, never into the training feed
    cluster.train(df, 1, qname="validation")
    assert cluster.last_sets == {"validation": {"rows": 1000, "skipped": 0, "partitions": 4, "shared": 1000}}
    with pytest.raises(ValueError, match=r"inference\(qname='q2'\): inference feeds the nodes' 'input' feed"):
        cluster.inference(df.rdd, qname="q2")
    cluster.train(df.rdd.map(tuple), 2, qname="input", batch_rows=7)  # odd sizes are fine: batches of 7 rows
    with caplog.at_level("WARNING", logger="tfos_nb"):
        cluster.shutdown()
    # the set was fed and no node read it: said once the job ended
    assert [r.getMessage() for r in caplog.records if "no node's function read it" in r.getMessage()] == [
        "tfos_nb: the set 'validation' (1000 rows) was fed to the nodes and no node's function read it: read it with "
        "ctx.get_data_feed(qname_in='validation') (for Keras: model.fit(..., validation_data="
        "ctx.get_data_feed(qname_in='validation').as_dataset(batch_size)))"]
    assert sum(n.step for n in cluster.nodes) == 3000
    assert sum(n.rows_fed for n in cluster.nodes) == 3000


def test_keyboard_interrupt_during_train_tears_down(spark, sc, no_leaks):
    import _thread
    import threading

    def slow_reader(args, ctx):
        import time as t

        feed = ctx.get_data_feed()
        while not feed.should_stop():
            if feed.next_batch(1):
                ctx.report(step=1)
                t.sleep(1)

    df = spark.range(100000).selectExpr("cast(id as float) as x").repartition(4)
    cluster = run(sc, slow_reader, {}, 2, input_mode=TFCluster.InputMode.SPARK)

    interrupted_at: list[float] = []

    def interrupt_when_training():
        wait_until(lambda: any(n.step for n in cluster.nodes), 60)
        interrupted_at.append(time.monotonic())
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_training, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        cluster.train(df, 1)
    took = time.monotonic() - interrupted_at[0]  # from the interrupt, not from the wait for training to start
    view = cluster.status()
    assert view.state == "stopped", view.state
    assert wait_until(lambda: not runtime_processes(), 10)
    # Uninterrupted, train() reads 100,000 rows at 1 s a row per node (hours); the teardown takes seconds: 60 s is
    # room for a loaded machine and still tells the two apart.
    assert took < 60, took


def tb_fun(args, ctx):
    import time as t

    deadline = t.monotonic() + 120
    while not os.path.exists(args["done"]) and t.monotonic() < deadline:
        t.sleep(0.2)


def test_tensorboard_on_the_chief_serves_its_url(sc, tmp_path, no_leaks):
    import urllib.request

    done = tmp_path / "done"
    cluster = run(sc, tb_fun, {"done": str(done)}, 2, master_node="chief", tensorboard=True,
                  log_dir=str(tmp_path / "logs"))
    try:
        assert wait_until(lambda: cluster.tensorboard_url() is not None, 30)
        url = cluster.tensorboard_url()
        assert url.startswith("http://") and url.rsplit(":", 1)[1].isdigit()

        def serves() -> bool:
            try:
                with urllib.request.urlopen(url + "/data/environment", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        assert wait_until(serves, 90, interval=0.5), url
    finally:
        done.write_text("ok")
        cluster.shutdown(timeout=60)
    assert not serves()  # stopped with its node


def test_start_waits_for_the_executors_the_configuration_promises(monkeypatch):
    """Executors register seconds apart on a busy machine: a local-cluster[3,…] with one up waits for the others."""
    from types import SimpleNamespace

    from tfos_nb.runtime.driver.launch import slots

    now = [0.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(slots, "time", clock)
    # one executor up at once, the second 8 s later, the third 20 s later
    monkeypatch.setattr(slots, "available_slots", lambda sc: (1 + (now[0] >= 8) + (now[0] >= 20),) * 2)
    slots.wait_for_slots(SimpleNamespace(master="local-cluster[3,1,1024]"), 3, 120)
    assert now[0] >= 20
    # promised too few: the answer comes once they are all up, naming them all
    now[0] = 0.0
    with pytest.raises(RuntimeError, match=r"asked for 4 nodes, 3 task slot\(s\) available on 3 executor"):
        slots.wait_for_slots(SimpleNamespace(master="local-cluster[3,1,1024]"), 4, 120)
    assert 20 <= now[0] < 21
    # a master that does not say its size: give up once the count stopped changing
    now[0] = 0.0
    unsized = SimpleNamespace(master="spark://h:7077", getConf=lambda: {})
    with pytest.raises(RuntimeError, match=r"asked for 3 nodes, 1 task slot\(s\) available on 1 executor"):
        slots.wait_for_slots(unsized, 3, 120)
    assert now[0] < 8


def test_the_doctor_waits_for_executors_still_registering_on_a_master_that_does_not_say_its_size(monkeypatch):
    """A standalone application's executors come up after its session: the doctor's slot count is the one they
    settle at, not the 0 of the first instant (a healthy two-host cluster was once reported as "0 slots")."""
    from types import SimpleNamespace

    from tfos_nb.runtime.doctor import job as doctor_job
    from tfos_nb.runtime.driver.launch import slots

    now = [0.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(slots, "time", clock)
    # no executor for 6 s, then one, then the second at 7 s
    monkeypatch.setattr(slots, "available_slots", lambda sc: ((now[0] >= 6) + (now[0] >= 7),) * 2)
    hadoop = SimpleNamespace(get=lambda key: None)
    sc = SimpleNamespace(master="spark://h:7077", getConf=lambda: {}, parallelize=None,
                         _jsc=SimpleNamespace(hadoopConfiguration=lambda: hadoop))
    facts = doctor_job.session_facts(sc, 2)
    assert (facts["slots"], facts["executors"]) == (2, 2), facts
    assert 7 <= now[0] < 8
