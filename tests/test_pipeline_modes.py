"""TFEstimator's Params end to end on real Spark (local-cluster) and real TensorFlow.

``InputMode.TENSORFLOW`` (nodes read TFRecord shards themselves), ``export_fn`` (run
on the chief after training; its SavedModel is what the TFModel runs),
``NumPS`` (ParameterServerStrategy with a ClusterCoordinator on the chief),
``Tensorboard`` (served on the chief during the fit, Keras events in the
logdir) and ``Protocol`` (the collective implementation).  Each fit is small
(digits, a few dozen steps).  Which cluster a fit started is observed with the
runtime's start listeners, the hook the notebook panel uses.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import threading
import time
import urllib.request

import cloudpickle
import numpy as np
import pytest

from tests.conftest import NODE_ENV, spark_fixture, wait_until
from tfos_nb.examples import digits
from tfos_nb.pipeline import TFEstimator, TFModel, communication_options
from tfos_nb.runtime.driver.launch import start as runtime_start

pytestmark = pytest.mark.slow
# Functions defined here travel by value (executors cannot import this test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def build_model():
    """The digits MLP with a named input and output, so mappings can name them."""
    import tensorflow as tf

    inp = tf.keras.layers.Input((digits.FEATURES,), name="features")
    hidden = tf.keras.layers.Dense(64, activation="relu")(inp)
    out = tf.keras.layers.Dense(digits.CLASSES, name="logits")(hidden)
    return tf.keras.Model(inp, out)


def _compiled(learning_rate):
    import tensorflow as tf

    model = build_model()
    model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _record(path, **facts):
    """A fact from a node for the test (the local-cluster shares the file system)."""
    with open(path, "a") as f:
        f.write(json.dumps(facts) + "\n")


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# -- node functions ----------------------------------------------------------------------------


def tfrecords_train_fn(args, ctx):
    """InputMode.TENSORFLOW: each node reads its shard of the TFRecords; MWMS with args.protocol."""
    import tensorflow as tf

    from tfos_nb import compat
    from tfos_nb.pipeline import communication_options as comm

    options = comm(args.protocol)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    _record(args.facts, role=ctx.job_name, fed=ctx.mgr is not None, steps=args.steps,
            implementation=strategy.extended._communication_options.implementation.name)
    files = sorted(tf.io.gfile.glob(os.path.join(args.data, "part-*")))
    spec = {"features": tf.io.FixedLenFeature([digits.FEATURES], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(files[ctx.worker_num::ctx.num_workers])
    ds = ds.map(lambda r: tf.io.parse_single_example(r, spec)).map(lambda e: (e["features"], e["label"]))
    ds = ds.shuffle(512, seed=ctx.worker_num).repeat().batch(args.batch_size)
    opts = tf.data.Options()
    compat.disable_auto_shard(opts)  # every node already reads its own files
    with strategy.scope():
        model = _compiled(args.learning_rate)
    # Fixed steps per epoch: MWMS needs every worker to run the same number of steps.
    model.fit(ds.with_options(opts), epochs=args.epochs, steps_per_epoch=args.steps, verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.is_chief)


def checkpoint_train_fn(args, ctx):
    """InputMode.SPARK: each node trains on the batches fed to it and only the chief writes a checkpoint.

    No cross-worker strategy: how many rows each node gets depends on which
    partitions it is handed (some are empty), and MultiWorkerMirroredStrategy
    needs the same number of steps on every worker.
    """
    import tensorflow as tf

    model = _compiled(args.learning_rate)
    feed = ctx.get_data_feed()
    while not feed.should_stop():
        cols = feed.next_batch_arrays(args.batch_size)
        if cols and len(cols[0]):
            model.train_on_batch(cols[0], cols[1])
    _record(args.facts, event="trained", role=ctx.job_name, pid=os.getpid())
    if ctx.is_chief:
        tf.train.Checkpoint(model=model).save(os.path.join(args.model_dir, "ckpt"))


def softmax_export_fn(args):
    """Rebuild the model, restore the chief's checkpoint and export it with a softmax ``probs`` output."""
    import tensorflow as tf

    model = build_model()
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(args.model_dir)).expect_partial()
    probs = tf.keras.layers.Softmax(name="probs")(model.output)
    tf.keras.Model(model.input, probs).save(args.export_dir, save_format="tf")
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    _record(args.facts, event="exported", role=task["type"], index=task["index"], pid=os.getpid())


def count_rows_fn(args, ctx):
    """Read the feed to its end without TensorFlow; record how many rows came."""
    feed = ctx.get_data_feed()
    rows = 0
    while not feed.should_stop():
        cols = feed.next_batch_arrays(64)
        rows += len(cols[0]) if cols else 0
    _record(args.facts, role=ctx.job_name, rows=rows)


def pss_train_fn(args, ctx):
    """ParameterServerStrategy: ps and workers serve; the chief coordinates a custom loop, then exports."""
    import tensorflow as tf

    if ctx.job_name in ("ps", "worker"):
        cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
        server = tf.distribute.Server(cluster, job_name=ctx.job_name, task_index=ctx.task_index, start=True)
        server.join()  # stopped by the runtime once the chief is done
        return
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    x, y, _, _ = digits.load_digits_arrays()
    with strategy.scope():
        model = build_model()
        optimizer = tf.keras.optimizers.legacy.Adam(learning_rate=args.learning_rate)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024).repeat().batch(args.batch_size)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        def replica_fn(batch):
            xb, yb = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(yb, model(xb, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica_fn, args=(next(it),))

    losses = []
    for _ in range(args.epochs):
        results = [coordinator.schedule(step, args=(iterator,)) for _ in range(args.steps)]
        coordinator.join()
        losses.append(float(np.mean([r.fetch() for r in results])))
    _record(args.facts, role=ctx.job_name, losses=losses, workers=len(ctx.cluster_spec.get("worker", [])),
            ps=len(ctx.cluster_spec.get("ps", [])))
    model.save(args.export_dir, save_format="tf")


def tensorboard_train_fn(args, ctx):
    """Train with a Keras TensorBoard callback on ctx.log_dir, then hold until the test has seen TensorBoard."""
    import tensorflow as tf

    x, y, _, _ = digits.load_digits_arrays()
    model = _compiled(0.01)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    model.fit(ds, epochs=2, steps_per_epoch=5, verbose=0,
              callbacks=[tf.keras.callbacks.TensorBoard(log_dir=ctx.log_dir, update_freq="batch")])
    _record(args.facts, event="trained", log_dir=ctx.log_dir)
    # The test releases the node once it has read the runs from the chief's TensorBoard (or gives up).
    deadline = time.monotonic() + args.hold_secs
    while not os.path.exists(args.release) and time.monotonic() < deadline:
        time.sleep(0.1)


# -- fixtures ----------------------------------------------------------------------------------


spark = spark_fixture(3)


@pytest.fixture(scope="module")
def digits_data():
    return digits.load_digits_arrays()


@pytest.fixture
def started():
    """The ClusterState of each cluster started during the test (runtime start listeners get its job)."""
    states = []

    def on_start(job):
        states.append(job.state)

    runtime_start.add_start_listener(on_start)
    yield states
    runtime_start.remove_start_listener(on_start)


def _test_frame(spark, xte, yte, partitions=3):
    rows = [(i, x.astype(np.float32).tolist(), int(label)) for i, (x, label) in enumerate(zip(xte, yte))]
    return spark.createDataFrame(rows, "id int, features array<float>, label long").repartition(partitions)


def _by_id(rows, col):
    rows = sorted(rows, key=lambda r: r.id)
    return np.array([r[col] for r in rows], dtype=np.float32), np.array([r.label for r in rows])


def _write_tfrecords(path, x, y, shards):
    """tf.train.Examples as ``dfutil.saveAsTFRecords`` writes them (written here, on the driver, to save the
    Python workers a TensorFlow import: saveAsTFRecords itself is tested in test_runtime_spark)."""
    import tensorflow as tf

    os.makedirs(path)
    for shard in range(shards):
        with tf.io.TFRecordWriter(os.path.join(path, f"part-r-{shard:05d}")) as w:
            for xi, yi in zip(x[shard::shards], y[shard::shards]):
                feats = {"features": tf.train.Feature(float_list=tf.train.FloatList(value=xi.tolist())),
                         "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(yi)]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())


def _serve(export, x):
    """The SavedModel's serving signature run directly on the driver: what the TFModel must reproduce."""
    import tensorflow as tf

    fn = tf.saved_model.load(export).signatures["serving_default"]
    return {k: v.numpy() for k, v in fn(features=tf.constant(x, tf.float32)).items()}


# -- tests -------------------------------------------------------------------------------------


def test_protocol_maps_to_the_collective_implementation():
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    expected = {"grpc": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL, "RING": impl.RING, " Nccl": None}
    for protocol, want in expected.items():
        if want is None:
            with pytest.raises(ValueError, match=r"Protocol must be one of \['grpc', 'ring', 'nccl'\]"):
                communication_options(protocol)
            continue
        opts = communication_options(protocol)
        assert opts.implementation == want, protocol  # what MultiWorkerMirroredStrategy takes
    for bad in ("grpc+verbs", "grpc+gdr", "rdma"):
        with pytest.raises(ValueError, match="TensorFlow 2 has no RDMA verbs"):
            TFEstimator(tfrecords_train_fn, {}).setProtocol(bad)
    assert TFEstimator().getProtocol() == "grpc"
    # The docs say so where users look: the Param's doc and the class docstring.
    assert "no RDMA verbs" in TFEstimator.protocol.doc
    assert "no RDMA verbs transport" in " ".join(TFEstimator.__doc__.split())


def test_input_mode_tensorflow_reads_tfrecords(spark, digits_data, tmp_path, started, no_leaks):
    """InputMode.TENSORFLOW: no feed; the nodes read TFRecords named by the args; the TFModel runs their export."""
    xtr, ytr, xte, yte = digits_data
    data = str(tmp_path / "tfrecords")
    _write_tfrecords(data, xtr, ytr, shards=4)
    facts, export = str(tmp_path / "facts.jsonl"), str(tmp_path / "export")
    args = {"data": data, "facts": facts, "learning_rate": 0.01, "steps": 5}  # the Steps Param wins over tf_args
    est = TFEstimator(tfrecords_train_fn, args, env=NODE_ENV).setInputMode("TENSORFLOW").setSteps(25)
    est.setClusterSize(2).setEpochs(4).setBatchSize(32).setProtocol("ring").setExportDir(export)
    est.setInputMapping({"features": "features"})
    # The DataFrame given to fit is not fed: not even its columns are looked at.
    model = est.fit(spark.range(1))

    (state,) = started
    view = state.snapshot()
    assert view.name == f"{est.uid}.fit"
    assert sorted(n.label for n in view.nodes) == ["chief:0", "worker:0"]
    assert view.rows_fed == 0 and view.feed_epoch == 0
    recs = _records(facts)
    assert sorted(r["role"] for r in recs) == ["chief", "worker"]
    assert not any(r["fed"] for r in recs), recs  # no data feed on the nodes in TENSORFLOW mode
    assert {r["implementation"] for r in recs} == {"RING"}  # Protocol reached the strategy
    assert {r["steps"] for r in recs} == {25}  # Params override tf_args (TensorFlowOnSpark's rule)

    assert isinstance(model, TFModel) and model.getExportDir() == export
    out = model.transform(_test_frame(spark, xte, yte)).select("id", "label", "logits").collect()
    logits, labels = _by_id(out, "logits")
    assert logits.shape == (len(yte), digits.CLASSES)
    acc = float(np.mean(logits.argmax(1) == labels))
    assert acc >= 0.9, acc
    np.testing.assert_allclose(logits, _serve(export, xte)["logits"], rtol=1e-5, atol=1e-5)


def test_export_fn_runs_on_the_chief_and_the_model_uses_its_export(spark, digits_data, tmp_path, started,
                                                                    no_leaks):
    """export_fn runs once, on the chief after training; TFModel runs its SavedModel (with its ``probs``)."""
    xtr, ytr, xte, yte = digits_data
    facts, export, ckpt = str(tmp_path / "facts.jsonl"), str(tmp_path / "export"), str(tmp_path / "ckpt")
    # Three partitions of data and three empty ones: empty partitions are fed too.
    rows = [(x.astype(np.float32).tolist(), int(label)) for x, label in zip(xtr, ytr)]
    sc = spark.sparkContext
    train = spark.createDataFrame(sc.parallelize(rows, 3).union(sc.parallelize([], 3)),
                                  "features array<float>, label long")
    assert train.rdd.glom().map(len).collect().count(0) == 3
    est = TFEstimator(checkpoint_train_fn, {"facts": facts, "learning_rate": 0.01}, export_fn=softmax_export_fn,
                      env=NODE_ENV)
    est.setInputMapping({"features": "features", "label": "label"}).setClusterSize(2).setEpochs(5)
    est.setBatchSize(32).setModelDir(ckpt).setExportDir(export)
    model = est.fit(train)

    recs = _records(facts)
    trained = [r for r in recs if r["event"] == "trained"]
    exported = [r for r in recs if r["event"] == "exported"]
    assert sorted(r["role"] for r in trained) == ["chief", "worker"]
    assert [(r["role"], r["index"]) for r in exported] == [("chief", 0)], recs  # once, on the chief
    chief_pid = next(r["pid"] for r in trained if r["role"] == "chief")
    assert exported[0]["pid"] == chief_pid != os.getpid()  # in the chief's node process, after its train_fn
    assert recs.index(exported[0]) > recs.index(next(r for r in trained if r["role"] == "chief"))
    (state,) = started
    assert state.snapshot().rows_fed == 5 * len(ytr)  # every row, every epoch

    # The fitted model runs export_fn's SavedModel: its signature has export_fn's ``probs`` output.
    assert model.getExportDir() == export and model.getInputMapping() == {"features": "features"}
    out = model.transform(_test_frame(spark, xte, yte)).select("id", "label", "probs").collect()
    probs, labels = _by_id(out, "probs")
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-4)
    acc = float(np.mean(probs.argmax(1) == labels))
    assert acc >= 0.85, acc  # the chief trained on its share of the rows only
    np.testing.assert_allclose(probs, _serve(export, xte)["probs"], rtol=1e-5, atol=1e-6)


def test_fit_on_an_empty_dataframe(spark, tmp_path, no_leaks):
    facts = str(tmp_path / "facts.jsonl")
    empty = spark.createDataFrame([], "features array<float>, label long")
    est = TFEstimator(count_rows_fn, {"facts": facts}, env=NODE_ENV, inputMapping={"features": "x", "label": "y"})
    model = est.setEpochs(2).fit(empty)
    assert [r["rows"] for r in _records(facts)] == [0]
    assert isinstance(model, TFModel) and not model.isDefined(model.exportDir)


def failing_export_fn(args):
    raise FileNotFoundError(f"no checkpoint in {args.model_dir}")


def test_export_fn_error_fails_fit_naming_the_chief(spark, tmp_path, no_leaks):
    from tfos_nb.TFCluster import TFClusterError

    facts = str(tmp_path / "facts.jsonl")
    empty = spark.createDataFrame([], "features array<float>, label long")
    est = TFEstimator(count_rows_fn, {"facts": facts}, export_fn=failing_export_fn, env=NODE_ENV,
                      inputMapping={"features": "x"}, modelDir=str(tmp_path / "none"))
    with pytest.raises(TFClusterError, match=r"(?s)^chief:0 failed.*FileNotFoundError: no checkpoint in .*none"):
        est.fit(empty)
    assert [r["rows"] for r in _records(facts)] == [0]  # train_fn ran first


def test_num_ps_runs_parameter_server_strategy(spark, digits_data, tmp_path, started, no_leaks):
    """NumPS=1: ps + chief (ClusterCoordinator) + worker; fit returns a model that transforms."""
    _, _, xte, yte = digits_data
    facts, export = str(tmp_path / "facts.jsonl"), str(tmp_path / "export")
    args = {"facts": facts, "learning_rate": 0.01}
    est = TFEstimator(pss_train_fn, args, env=NODE_ENV).setNumPS(1).setClusterSize(3).setEpochs(3).setSteps(40)
    est.setBatchSize(32).setExportDir(export).setInputMapping({"features": "features"})
    with pytest.raises(ValueError, match=r"NumPS=1 and MasterNode='chief' runs ParameterServerStrategy.*TENSORFLOW"):
        est.fit(spark.range(1))  # InputMode.SPARK would feed workers that only serve
    assert not started  # refused before any cluster started
    model = est.setInputMode("TENSORFLOW").fit(spark.range(1))

    (state,) = started
    view = state.snapshot()
    assert {n.label: n.state for n in view.nodes} == {"ps:0": "stopped", "chief:0": "finished",
                                                      "worker:0": "stopped"}
    (rec,) = _records(facts)
    assert (rec["role"], rec["ps"], rec["workers"]) == ("chief", 1, 1)
    losses = rec["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0] and losses[-1] < 1.0, losses
    out = model.transform(_test_frame(spark, xte, yte)).select("id", "label", "logits").collect()
    logits, labels = _by_id(out, "logits")
    acc = float(np.mean(logits.argmax(1) == labels))
    assert acc >= 0.85, acc


def test_tensorboard_serves_the_fit_logdir_on_the_chief(spark, tmp_path, started, no_leaks):
    """Tensorboard=True: during the fit the chief's TensorBoard lists the Keras callback's runs."""
    facts, release, logdir = str(tmp_path / "facts.jsonl"), str(tmp_path / "release"), str(tmp_path / "logs")
    est = TFEstimator(tensorboard_train_fn, {"facts": facts, "release": release, "hold_secs": 120}, env=NODE_ENV)
    est.setInputMode("TENSORFLOW").setTensorboard(True).setModelDir(logdir)
    result = {}

    def fit():
        try:
            result["model"] = est.fit(spark.range(1))
        except BaseException as exc:  # reported by the asserts below
            result["error"] = exc

    thread = threading.Thread(target=fit, name="test-fit")
    thread.start()
    seen = {}

    def runs(url):
        try:
            with urllib.request.urlopen(f"{url}/data/runs", timeout=5) as resp:
                seen["runs"] = json.loads(resp.read())
        except OSError as exc:
            seen["error"] = repr(exc)
            return None
        return seen["runs"]

    try:
        live = lambda: thread.is_alive() or "error" in result
        assert wait_until(lambda: not live() or (started and started[0].snapshot().tensorboard), 120), "no URL"
        url = started[0].snapshot().tensorboard
        assert url and url.startswith("http://"), (url, result)
        assert wait_until(lambda: not live() or os.path.exists(facts), 120), "the chief did not train"
        # TensorBoard rescans its logdir every few seconds: wait for the callback's run to show.
        assert wait_until(lambda: "train" in (runs(url) or []), 60, interval=0.5), seen
        assert thread.is_alive() and started[0].snapshot().state == "running"  # seen during the fit
    finally:
        with open(release, "w"):
            pass
        thread.join(180)
    assert not thread.is_alive() and isinstance(result.get("model"), TFModel), result
    (rec,) = _records(facts)
    assert rec["log_dir"] == logdir  # the chief's ctx.log_dir is ModelDir
    assert glob.glob(os.path.join(logdir, "train", "events.out.tfevents.*"))
    assert wait_until(lambda: runs(url) is None, 10), seen  # TensorBoard stopped with the cluster


def validating_train_fn(args, ctx):
    """Keras' fit with validation_data, the validation rows fed by the estimator (Validation Param)."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    train = ctx.get_data_feed().as_dataset(batch_size=args.batch_size)
    val = ctx.get_data_feed(qname_in="validation").as_dataset(batch_size=args.batch_size)
    hist = model.fit(train, validation_data=val, epochs=args.epochs, verbose=0, callbacks=[ctx.progress_callback()])
    again = ctx.get_data_feed(qname_in="validation")  # this node's share, read once more
    labels = [int(v) for cols in iter(lambda: again.next_batch_arrays(10_000), ()) for v in cols[1]]
    _record(args.facts, role=ctx.job_name, history={k: [float(v) for v in vs] for k, vs in hist.history.items()},
            validation=args.validation, labels=labels)


def test_a_validation_column_is_fed_once_and_the_model_keeps_keras_val_values(spark, digits_data, tmp_path, no_leaks):
    from pyspark.sql import functions as F

    xtr, ytr, _, _ = digits_data
    facts = str(tmp_path / "facts.jsonl")
    df = _test_frame(spark, xtr, ytr, partitions=4).withColumn("is_val", F.col("id") % 5 == 0)
    marked = sorted(int(r.label) for r in df.filter("is_val").collect())
    est = TFEstimator(validating_train_fn, {"facts": facts}, env=NODE_ENV, inputMapping={"features": "x", "label": "y"})
    model = est.setValidation("is_val").setClusterSize(2).setEpochs(2).setBatchSize(64).fit(df)
    records = _records(facts)
    assert len(records) == 2 and records[0]["history"] == records[1]["history"], records
    assert sorted(v for r in records for v in r["labels"]) == marked  # the marked rows, each once, none else
    assert records[0]["validation"] == "is_val"  # train_fn sees the Param as args.validation
    history = records[0]["history"]
    assert len(history["val_accuracy"]) == 2 and history["val_accuracy"][-1] > 0.5, history
    assert model.getValidationMetrics() == pytest.approx({"val_loss": history["val_loss"][-1],
                                                          "val_accuracy": history["val_accuracy"][-1]}, rel=1e-6)
    model.write().save(str(tmp_path / "model"))
    assert TFModel.load(str(tmp_path / "model")).getValidationMetrics() == model.getValidationMetrics()


def test_validation_param_splits_and_refuses(spark):
    from tfos_nb.pipeline._validation import split

    df = spark.range(400).selectExpr("id", "id % 3 = 0 as flag", "cast(id as string) as name")
    train, val = split(df, 0.25)
    a, b = {r.id for r in train.collect()}, {r.id for r in val.collect()}
    assert a | b == set(range(400)) and not a & b and 50 < len(b) < 150
    assert {r.id for r in split(df, 0.25)[1].collect()} == b  # seeded: the same rows at every fit
    with pytest.raises(ValueError, match="Validation column 'name' is string; it must be boolean"):
        split(df, "name")
    with pytest.raises(ValueError, match=r"Validation column 'nope' is not in the DataFrame; its columns: \['id'"):
        split(df, "nope")
    for bad in (0, 1.5, "", True):
        with pytest.raises(ValueError, match="Validation is a fraction of the rows"):
            TFEstimator().setValidation(bad)
    with pytest.raises(ValueError, match="Validation rows are fed"):
        TFEstimator(count_rows_fn, {}).setValidation(0.2).setInputMode("TENSORFLOW").fit(df)
