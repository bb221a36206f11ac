"""The IPython layer, driven through a real IPython shell (and real Spark + TensorFlow for the slow tier)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import types

import pytest
from IPython.core.error import UsageError

from tests.conftest import ipython_with_tfos_nb, spark_session, wait_until
from tfos_nb.magics import ClusterFailed, ClusterHandle, _render, _spark
from tfos_nb.magics._cellfn import build

PYTHON = sys.executable


@pytest.fixture(scope="module")
def ip():
    shell = ipython_with_tfos_nb()
    leftover = shell.magics_manager.registry["TFOSMagics"].handles  # the global shell: an earlier module's clusters
    assert not leftover, f"an earlier test module left clusters in the global IPython shell: {sorted(leftover)}"
    shell.run_cell(
        textwrap.dedent(
            """
            import threading
            K = 3
            numbers = [1, 2, 3]
            lock = threading.Lock()
            def helper(x):
                return x * K
            def uses_lock():
                return lock
            """
        )
    )
    yield shell
    shell.magics_manager.registry["TFOSMagics"].shutdown_all()


# -- bad input: one-line UsageErrors, exact messages --------------------------------------
BAD_INPUT = [
    ("--bogus", "pass", "unrecognized arguments: --bogus"),
    ("--workers 0", "pass", "--workers must be an integer of at least 1, got 0"),
    ("--workers -2", "pass", "--workers must be an integer of at least 1, got -2"),
    ("--workers two", "pass", "argument --workers: invalid int value: 'two'"),
    ("--ps -1", "pass", "--ps must be an integer of at least 0, got -1"),
    ("--retries -2", "pass", "--retries must be a non-negative integer, got -2"),
    ("--epochs 0", "pass", "--epochs must be at least 1, got 0"),
    ("--deterministic --retries 1 --min-workers 1", "pass",
     "--min-workers 1 cannot go with --deterministic: a retry on fewer nodes would put other rows together in each "
     "step, so the job could not end with a clean run's weights"),
    ("--retries 1 --min-workers 0", "pass", "--min-workers must be a positive integer (chief and workers), got 0"),
    ("--retries 1 --min-workers 3", "pass", "--min-workers must be between 1 and --workers (2), got 3"),
    ("--seed -1", "pass", "--seed must be an integer from 0 to 2**32 - 1, got -1"),
    ('--resources "wrker: cpus=1"', "pass",
     "resources: unknown role 'wrker' (did you mean 'worker'?); the roles are chief, worker, ps, evaluator, *"),
    ('--resources "worker: gpus=0.75"', "pass",
     "resources['worker']['gpus'] must be whole, or a fraction of one up to 0.5 (tasks sharing a unit), got '0.75': "
     "Spark gives a task no other share"),
    ("--timeout 0", "pass", "--timeout must be more than 0 seconds, got 0"),
    ("--input-mode file", "pass",
     "argument --input-mode: invalid choice: 'file' (choose from 'spark', 'tensorflow')"),
    ("--data missing_df", "pass", "--data missing_df: no such variable in the notebook"),
    ("--data numbers", "pass", "--data numbers: expected a Spark DataFrame or RDD, got list"),
    ("--input-mode spark", "pass", "--input-mode spark needs --data VAR (a DataFrame or RDD to feed)"),
    ("--input-mode tensorflow --data numbers", "pass", "--data is fed only with --input-mode spark"),
    ("--validation-data numbers", "pass", "--validation-data needs --data (the training data it validates)"),
    ("--args numbers", "pass", "--args must be a dict or a namespace, got list"),
    ("--args nope", "pass", "--args nope: NameError: name 'nope' is not defined"),
    ("--args \"{'epochs': 'x'}\"", "pass", "--epochs must be at least 1, got 'x'"),
    ("--name K", "pass",
     "--name K: `K` is already defined in the notebook (type int); choose another --name"),
    ("--name 2fast", "pass", "--name 2fast: not a valid Python variable name"),
    ("", "x = = 1", "the cell is not valid Python: line 1: invalid syntax"),
    ("", "# only a comment",
     "the cell is empty: write the node function's body (it sees `args` and `ctx`) below the magic line"),
    ("", "print(uses_lock())",
     "cannot ship `lock` (used by `uses_lock`) to the nodes: a _thread.lock cannot be pickled "
     "(TypeError: cannot pickle '_thread.lock' object); create it inside the cell instead"),
]


@pytest.mark.parametrize(("line", "cell", "message"), BAD_INPUT, ids=[c[0] or c[1] for c in BAD_INPUT])
def test_bad_input_is_a_one_line_usage_error(ip, line, cell, message):
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("tfos_cluster", line, cell)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("magic", "line", "message"),
    [
        ("tfos_shutdown", "", "give a cluster name or --all"),
        ("tfos_shutdown", "nosuch", "no cluster named nosuch; clusters: none"),
        ("tfos_logs", "nosuch", "no cluster named nosuch; clusters: none"),
        ("tfos_logs", "", "the following arguments are required: name"),
        ("tfos_tensorboard", "", "give a cluster name (its cell ran with --tensorboard) or --logdir DIR, not both"),
        ("tfos_tensorboard", "--logdir /no/such/dir", "--logdir /no/such/dir: no such directory"),
        ("tfos_tensorboard", "nosuch", "no cluster named nosuch; clusters: none"),
    ],
)
def test_bad_input_other_magics(ip, magic, line, message):
    # the messages name no cluster: these run before the module's tests that start one (never skipped silently)
    assert not ip.magics_manager.registry["TFOSMagics"].handles, "clusters exist in this shell"
    with pytest.raises(UsageError) as info:
        ip.run_line_magic(magic, line)
    assert str(info.value) == message


def test_usage_error_keeps_the_shell_alive(ip, capsys):
    result = ip.run_cell("%%tfos_cluster --workers -1\npass")
    assert not result.success
    assert "UsageError: --workers must be an integer of at least 1, got -1" in capsys.readouterr().err
    assert ip.run_cell("1 + 1").result == 2


# -- the cell as a node function ------------------------------------------------------------
def test_cell_ships_a_snapshot_of_the_names_it_uses(ip):
    import cloudpickle

    fn, names = build("return helper(args.epochs) + len(numbers)", ip.user_ns, "t")
    assert names == ["helper", "numbers"]  # `lock`, `K`'s user `uses_lock` etc. stay home
    ip.user_ns["K"] = 100  # later changes in the notebook do not reach a cell already built
    try:
        shipped = cloudpickle.loads(cloudpickle.dumps(fn))
        assert shipped(types.SimpleNamespace(epochs=2), None) == 2 * 3 + 3
    finally:
        ip.user_ns["K"] = 3


def test_node_tracebacks_show_the_cell_lines(ip):
    import traceback

    import cloudpickle

    fn, _ = build("x = 1\nraise ValueError('boom')", ip.user_ns, "tb")
    shipped = cloudpickle.loads(cloudpickle.dumps(fn))
    with pytest.raises(ValueError) as info:
        shipped(None, None)
    text = "".join(traceback.format_exception(info.value))
    assert 'File "<%%tfos_cluster tb>", line 2' in text and "raise ValueError('boom')" in text


# -- configuration and loading ------------------------------------------------------------------
def test_config_magic_sets_traits(ip):
    magics = ip.magics_manager.registry["TFOSMagics"]
    ip.run_line_magic("config", "TFOSMagics.default_workers = 4")
    try:
        assert magics.default_workers == 4
    finally:
        ip.run_line_magic("config", "TFOSMagics.default_workers = 2")


@pytest.mark.parametrize(("setting", "message"), [
    ("shrink_after = -1.0", "TFOSMagics.shrink_after must be a non-negative number of seconds, got -1.0"),
    ("stall_after = -1.0", "TFOSMagics.stall_after must be a number of seconds (0 or None: off), got -1.0"),
])
def test_a_bad_setting_is_a_usage_error_naming_it(ip, setting, message):
    """The job's groups check the %config settings they hold too, and say them by their setting's name."""
    name = setting.split(" ", 1)[0]
    magics = ip.magics_manager.registry["TFOSMagics"]
    before = getattr(magics, name)
    ip.run_line_magic("config", f"TFOSMagics.{setting}")
    try:
        with pytest.raises(UsageError) as info:
            ip.run_cell_magic("tfos_cluster", "", "pass")
        assert str(info.value) == message
    finally:
        ip.run_line_magic("config", f"TFOSMagics.{name} = {before!r}")  # the shell's config too, which later shells read


def test_loaded_from_ipython_config(tmp_path):
    profile = tmp_path / "profile_default"
    profile.mkdir()
    (profile / "ipython_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["tfos_nb"]\nc.TFOSMagics.default_workers = 3\n'
    )
    code = (
        "m = get_ipython().magics_manager.registry['TFOSMagics']; "
        "print('workers', m.default_workers, 'cell magic', 'tfos_cluster' in get_ipython().magics_manager.magics['cell'])"
    )
    out = subprocess.run(
        [PYTHON, "-m", "IPython", "--colors=nocolor", "-c", code],
        capture_output=True, text=True, timeout=120, env={**os.environ, "IPYTHONDIR": str(tmp_path)},
    )
    assert "workers 3 cell magic True" in out.stdout, out.stdout + out.stderr


def test_importing_the_package_pulls_in_no_ipython_spark_or_tensorflow():
    code = (
        "import sys, tfos_nb, tfos_nb.magics, tfos_nb.magics._cellfn; "
        "print(sorted(m for m in ('IPython', 'pyspark', 'tensorflow') if m in sys.modules))"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_unload_removes_the_magics():
    shell = ipython_with_tfos_nb()
    shell.run_line_magic("unload_ext", "tfos_nb")
    try:
        assert "tfos_cluster" not in shell.magics_manager.magics["cell"]
        assert "TFOSMagics" not in shell.magics_manager.registry
    finally:
        shell.run_line_magic("load_ext", "tfos_nb")


def test_status_table_formatting():
    assert _render.status_table([]) == "no tfos_nb clusters in this kernel"
    table = _render.status_table([("digits", "running", 2, 12.34, "chief:0 running step 4")])
    assert table.splitlines() == [
        "name    state    nodes  elapsed  progress",
        "digits  running  2      12.3 s   chief:0 running step 4",
    ]
    node = types.SimpleNamespace(label="chief:0", state="running", step=40, total_steps=300,
                                 metrics={"epoch": 1, "loss": 0.123456})
    assert _render.node_line(node) == "chief:0 running step 40/300 loss 0.1235"
    node.metrics = {"epoch": 3, "accuracy": 0.9, "auc": 0.8, "loss": 0.3, "val_accuracy": 0.85, "val_loss": 0.35}
    assert _render.node_line(node) == "chief:0 running step 40/300 loss 0.3 val_loss 0.35 accuracy 0.9 val_accuracy 0.85"


# -- the embedded Spark Connect server needs pyspark >= 4.0 (authentication token, loopback binding) ------------------
OLD_PYSPARK = ("tfos_nb: the embedded Spark Connect server needs pyspark >= 4.0 (its authentication token and loopback "
               "binding); pyspark 3.5.3 is installed: upgrade pyspark, or use the classic embedded Spark "
               "(no TFOS_NB_SPARK_CONNECT / connect=False)")


@pytest.mark.parametrize("version", ["4.0.0", "4.3.0", "4.1.0.dev0", "4.0.0rc1", "5.0.0", "10.0.0"])
def test_pyspark_4_may_run_the_embedded_connect_server(version):
    assert _spark.connect_refusal(version) is None


@pytest.mark.parametrize("version", ["3.5.3", "3.5.9", "3.4.1", "2.4.8", "dev"])
def test_an_older_pyspark_is_refused_naming_itself_and_the_fix(version):
    assert _spark.connect_refusal(version) == OLD_PYSPARK.replace("3.5.3", version)


def test_the_installed_pyspark_runs_the_embedded_connect_server_from_4_0_and_refuses_it_before(monkeypatch):
    """pyspark 4.3 in the suite; 3.5.0 in the floor tier (scripts/check_floor.sh), where a real session is refused."""
    import pyspark

    if int(pyspark.__version__.split(".")[0]) >= 4:
        assert _spark.connect_refusal(pyspark.__version__) is None, pyspark.__version__
        return
    monkeypatch.setattr(_spark, "find_spark_context", lambda ns: None)  # whatever Spark an earlier module left
    with pytest.raises(RuntimeError) as info:
        _spark.spark_session(2, connect=True)
    assert str(info.value) == OLD_PYSPARK.replace("3.5.3", pyspark.__version__)
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ and "SPARK_LOCAL_REMOTE" not in os.environ


def test_without_pyspark_the_embedded_spark_names_the_extra(ip, monkeypatch):
    """pyspark is the ``spark`` extra (a platform's own Spark is not always a pip distribution): a kernel with no
    Spark session and no pyspark gets one sentence naming it, from the magic (UsageError) and from Python."""
    monkeypatch.setitem(sys.modules, "pyspark", None)  # what `import pyspark` meets where it is not installed
    monkeypatch.setattr(_spark, "find_spark_context", lambda ns: None)
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("tfos_cluster", "--workers 1 --name no_pyspark", "pass")
    assert str(info.value) == _spark.NO_PYSPARK
    assert "pip install 'tfos_nb[spark]'" in _spark.NO_PYSPARK
    with pytest.raises(RuntimeError) as info:
        _spark.spark_session(2)
    assert str(info.value) == _spark.NO_PYSPARK


def test_an_old_pyspark_refuses_connect_before_anything_starts(ip, monkeypatch, capsys):
    """The magics say it as a one-line UsageError, the Python API as a RuntimeError: no notice, no JVM, no
    environment of a Spark Connect server."""
    monkeypatch.setattr(_spark, "_pyspark_version", lambda: "3.5.3")
    monkeypatch.setattr(_spark, "find_spark_context", lambda ns: None)  # whatever Spark an earlier module left
    monkeypatch.setenv("TFOS_NB_SPARK_CONNECT", "1")
    environ = dict(os.environ)
    for magic, line in (("tfos_cluster", "--workers 1 --name old_connect"), ("tfos_parallel", "--runs 2 --name old_runs")):
        with pytest.raises(UsageError) as info:
            ip.run_cell_magic(magic, line, "pass")
        assert str(info.value) == OLD_PYSPARK
    for start in (lambda: _spark.spark_session(2), lambda: _spark.spark_session(2, connect=True),
                  lambda: _spark.start_embedded(2, "local-cluster[{n},1,1024]")):
        with pytest.raises(RuntimeError) as error:
            start()
        assert str(error.value) == OLD_PYSPARK
    assert "starting" not in capsys.readouterr().out
    assert dict(os.environ) == environ and not _spark._embedded_sessions
    assert "old_connect" not in ip.user_ns and "old_runs" not in ip.user_ns
    monkeypatch.delenv("TFOS_NB_SPARK_CONNECT")  # the classic embedded Spark on the same pyspark is no Connect server
    assert _spark._refusal(None) is None and _spark._refusal(False) is None and _spark._refusal(True) == OLD_PYSPARK


# -- real Spark, real TensorFlow ----------------------------------------------------------------
@pytest.fixture(scope="module")
def magic_spark(ip):
    spark = spark_session(2)
    ip.user_ns["spark"] = spark
    yield spark
    ip.magics_manager.registry["TFOSMagics"].shutdown_all()
    ip.user_ns.pop("spark", None)
    spark.stop()


@pytest.mark.slow
def test_more_nodes_than_slots(ip, magic_spark):
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("tfos_cluster", "--workers 2 --ps 1 --name too_big", "pass")
    assert str(info.value) == (
        "3 nodes need 3 Spark task slots; this Spark application has 2 (local-cluster[2,1,1024]): "
        "lower --workers/--ps, or give Spark more executors"
    )
    assert "too_big" not in ip.user_ns


@pytest.mark.slow
def test_train_digits_with_the_magic(ip, magic_spark, capsys, tmp_path):
    from tfos_nb.examples.digits import load_digits_arrays, to_dataframe

    x, y, _, _ = load_digits_arrays()
    df = to_dataframe(magic_spark, x[:640], y[:640], partitions=4).cache()
    val_df = to_dataframe(magic_spark, x[640:800], y[640:800], partitions=3).cache()  # Keras' validation_data
    ip.user_ns.update(train_df=df, val_df=val_df, export_dir=str(tmp_path / "model"),
                      bad_val=val_df.select("label", "features"), numbers=[1, 2])
    for var, message in [("numbers", "--validation-data numbers: expected a Spark DataFrame or RDD, got list"),
                         ("bad_val", "--validation-data bad_val: the set 'validation' has columns (label bigint, "
                                     "features array<float>) and the training data (features array<float>, label "
                                     "bigint): the nodes read both the same way; select the same columns, in the "
                                     "same order, with the same types")]:
        with pytest.raises(UsageError) as info:
            ip.run_cell_magic("tfos_cluster", f"--workers 2 --data train_df --validation-data {var}", "pass")
        assert str(info.value) == message
    ip.run_cell("from tfos_nb.examples.digits import build_model\ndef make_model():\n    return build_model(0.02)")
    cell = textwrap.dedent(
        """
        import tensorflow as tf
        from tfos_nb import compat
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = make_model()
        ds = ctx.get_data_feed().as_dataset(batch_size=args.batch_size)
        val = ctx.get_data_feed(qname_in="validation").as_dataset(batch_size=args.batch_size)
        hist = model.fit(ds, epochs=args.epochs, validation_data=val, verbose=0, callbacks=[ctx.progress_callback()])
        compat.export_saved_model(model, export_dir, ctx.is_chief)
        print(f"done {ctx.job_name} lr-check {args.batch_size}")
        print("val_accuracy", repr(hist.history["val_accuracy"]))
        import os
        print("seeded", os.environ["TFOS_SEED"], os.environ["TFOS_DETERMINISTIC"])
        """
    )
    # deterministic mode through the magic: 4 partitions to 2 nodes, each node's second one read after its first
    ip.run_cell_magic("tfos_cluster", "--workers 2 --data train_df --validation-data val_df --epochs 2 "
                      "--args \"{'batch_size': 32}\" --name mnist_like --seed 3 --deterministic", cell)
    out = capsys.readouterr().out
    assert "[chief:0] done chief lr-check 32" in out and "[worker:0] done worker lr-check 32" in out
    assert "[chief:0] seeded 3 1" in out and "[worker:0] seeded 3 1" in out
    handle = ip.user_ns["mnist_like"]
    assert isinstance(handle, ClusterHandle)
    result = handle.result
    assert result["state"] == "finished"
    assert result["last_feed"]["rows"] == 2 * 640
    assert set(result["metrics"]) == {"chief:0", "worker:0"}
    assert result["metrics"]["chief:0"]["epoch"] == 2 and "accuracy" in result["metrics"]["chief:0"]
    # the chief's Keras History, as printed in the cell, is what the panel and the handle show
    printed = [line for line in out.splitlines() if line.startswith("[chief:0] val_accuracy ")]
    assert len(printed) == 1, out
    val_accuracy = eval(printed[0].split(" ", 2)[2])  # a list of floats this test's cell printed
    assert result["metrics"]["chief:0"]["val_accuracy"] == pytest.approx(val_accuracy[-1], rel=1e-6)
    history = handle.history
    chief_epochs = history[(history["node"] == "chief:0") & history["val_accuracy"].notna()]
    assert list(chief_epochs["val_accuracy"]) == pytest.approx(val_accuracy, rel=1e-6)  # one report per epoch end
    assert os.path.exists(tmp_path / "model" / "saved_model.pb")
    assert handle.wait() is result


@pytest.mark.slow
def test_cell_that_terminates_early_over_three_epochs(ip, magic_spark, capsys):
    """TensorFlowOnSpark's pattern in a cell: read a little through TFNode.DataFeed, terminate(), return —
    with --epochs 3 the rest of every epoch is skipped and the cell ends normally (it failed in epoch 2)."""
    ip.user_ns["early_rdd"] = magic_spark.sparkContext.parallelize([(i, float(i)) for i in range(400)], 8)
    cell = textwrap.dedent(
        """
        from tfos_nb import TFNode
        tf_feed = TFNode.DataFeed(ctx.mgr, False)
        got = 0
        while got < 30 and not tf_feed.should_stop():
            got += len(tf_feed.next_batch(10))
        tf_feed.terminate()
        print("read", got)
        """
    )
    ip.run_cell_magic("tfos_cluster", "--workers 2 --data early_rdd --epochs 3 --name early", cell)
    assert "[chief:0] read 30" in capsys.readouterr().out
    result = ip.user_ns["early"].result
    assert result["state"] == "finished"
    feed = result["last_feed"]
    assert feed["rows"] + feed["skipped"] == 3 * 400 and feed["skipped"] > 0, feed


@pytest.mark.slow
def test_node_error_ends_the_cell_with_the_nodes_message(ip, magic_spark, capsys):
    cell = "if ctx.job_name == 'worker':\n    raise ValueError('boom on purpose')\nimport time\ntime.sleep(600)\n"
    t0 = time.monotonic()
    with pytest.raises(ClusterFailed) as info:
        ip.run_cell_magic("tfos_cluster", "--workers 2 --name failing", cell)
    # the chief's sleep was cut short by the teardown (the bound leaves room for a slow start on a busy machine)
    assert time.monotonic() - t0 < 300
    err = info.value
    assert err.node == "worker:0" and err.host
    assert str(err).startswith(f"worker:0 failed on host {err.host}")
    assert "ValueError: boom on purpose" in str(err)
    assert 'File "<%%tfos_cluster failing>", line 2' in str(err)
    rendered = err._render_traceback_()
    assert rendered[0].endswith("ValueError: boom on purpose") and "TFClusterError" in rendered[0]
    assert ip.user_ns["failing"].state == "failed"
    assert "[worker:0] ValueError: boom on purpose" in capsys.readouterr().out
    # shown by the shell as the node's error only: no frames of the magic
    result = ip.run_cell("%%tfos_cluster --workers 2 --name failing\n" + cell)
    assert isinstance(result.error_in_exec, ClusterFailed)
    shown = capsys.readouterr()
    assert "_magics.py" not in shown.out + shown.err


@pytest.mark.slow
def test_resources_per_role_in_a_cell(ip, magic_spark, capsys):
    """--resources: what the session cannot give is a UsageError before any Spark job; a request it can give
    starts each group in its own profile, and %tfos_status shows each node's grant."""
    jobs = int(magic_spark.sparkContext._jsc.sc().statusStore().jobsList(None).size())
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("tfos_cluster", '--workers 2 --resources "worker: fpga=1" --name no_fpga', "pass")
    assert str(info.value).startswith("worker asks fpga=1, but the executors have no fpga")
    assert int(magic_spark.sparkContext._jsc.sc().statusStore().jobsList(None).size()) == jobs
    assert "no_fpga" not in ip.user_ns
    ip.run_cell_magic("tfos_cluster", '--workers 2 --resources "chief: cpus=1" --name per_role',
                      "print('granted', ctx.job_name, sorted(ctx.resources))")
    handle = ip.user_ns["per_role"]
    chief, worker = handle.nodes
    assert chief.grant.cpus == 1 and chief.grant.profile_id is not None and worker.grant.profile_id is None
    capsys.readouterr()
    ip.run_line_magic("tfos_status", "")
    status = capsys.readouterr().out
    assert f"chief:0 finished [executor {chief.executor_id}: 1 cpu · profile {chief.grant.profile_id}]" in status
    assert "worker:0 finished [" not in status  # the default profile: nothing to say


@pytest.mark.slow
def test_background_status_logs_rerun_and_shutdown(ip, magic_spark, capsys):
    forever = "import time\ni = 0\nwhile True:\n    i += 1\n    ctx.report(step=i)\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"
    ip.run_cell_magic("tfos_cluster", "--workers 1 --background --name bg", forever)
    handle = ip.user_ns["bg"]
    assert "bg runs in the background" in capsys.readouterr().out
    wait_until(lambda: handle.nodes and (handle.nodes[0].step or 0) >= 3, 90, what="bg's chief to report steps")
    # output and progress reach the driver by different pipes: wait for the lines themselves
    wait_until(lambda: sum(line.startswith("[chief:0] tick ") for line in handle.output) >= 2, 90, what="bg's chief's output")
    assert handle.state == "running" and not handle.done
    ip.run_line_magic("tfos_status", "")
    status = capsys.readouterr().out
    assert status.splitlines()[0].split() == ["name", "state", "nodes", "elapsed", "progress"]
    assert any(line.startswith("bg ") and " running " in line for line in status.splitlines())
    ip.run_line_magic("tfos_logs", "bg --node chief:0 --tail 2")
    logs = capsys.readouterr().out.splitlines()
    assert len(logs) == 2 and all(line.startswith("[chief:0] tick ") for line in logs)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("tfos_logs", "bg --node worker:7")
    assert str(info.value) == "no node 'worker:7' in bg; nodes: chief:0"

    # the same --name again: the running cluster is stopped first, and the user is told
    ip.run_cell_magic("tfos_cluster", "--workers 1 --name bg", "print('second run', args.epochs)")
    out = capsys.readouterr().out
    assert "tfos_nb: stopping the running cluster bg first" in out
    assert "[chief:0] second run 1" in out
    assert handle.done and handle.state == "stopped" and handle.wait()["stopped"] == "shut down"
    assert ip.user_ns["bg"] is not handle and ip.user_ns["bg"].state == "finished"

    ip.run_cell_magic("tfos_cluster", "--workers 1 --background --name bg2", forever)
    bg2 = ip.user_ns["bg2"]
    wait_until(lambda: bg2.state == "running", 90, what="bg2 to run")
    ip.run_line_magic("tfos_shutdown", "--all")
    assert bg2.done and bg2.state == "stopped"
    assert "bg2: stopped" in capsys.readouterr().out


@pytest.mark.slow
def test_background_wait_reraises_the_node_error(ip, magic_spark):
    ip.run_cell_magic("tfos_cluster", "--workers 1 --background --name bg_fail", "print('about to fail')\n1 / 0")
    handle = ip.user_ns["bg_fail"]
    with pytest.raises(ClusterFailed) as info:
        handle.wait(timeout=90)
    assert info.value.node == "chief:0" and "ZeroDivisionError: division by zero" in str(info.value)
    assert handle.state == "failed" and handle.result["error"].startswith("chief:0 failed on host")
    assert "[chief:0] about to fail" in handle.output


@pytest.mark.slow
def test_timeout_stops_the_cluster(ip, magic_spark):
    with pytest.raises(ClusterFailed) as info:
        ip.run_cell_magic("tfos_cluster", "--workers 1 --timeout 8 --name slow", "import time\ntime.sleep(300)")
    # the message may add where the job was stuck ("; stalled then: …", when the shell's stall_after is shorter)
    assert str(info.value).startswith("cluster slow: TimeoutError: did not finish within 8 s and was torn down"), info.value


@pytest.mark.slow
def test_tensorboard_on_the_driver_for_a_logdir(ip, tmp_path, monkeypatch, capsys):
    """%tfos_tensorboard --logdir: TensorBoard started by the kernel on the driver, registered with the proxy, stopped with
    the kernel."""
    import json
    import urllib.request

    from tfos_nb import tensorboard

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    logdir = tmp_path / "logs"
    logdir.mkdir()
    ip.run_line_magic("tfos_tensorboard", f"--logdir {logdir} --height 300")
    out = capsys.readouterr().out
    cid = tensorboard.local_cluster_id(str(logdir))
    assert f"tfos_nb/tensorboard/{cid}/" in out
    record = json.loads((tmp_path / "runtime" / "tfos_nb" / f"{cid}.json").read_text())
    with urllib.request.urlopen(f"http://{record['host']}:{record['port']}/data/environment", timeout=10) as r:
        assert r.status == 200
    tb_pid = record["pid"]  # the kernel's pid: the record names who registered, not TensorBoard
    (info,) = [t for t in ip.magics_manager.registry["TFOSMagics"]._local_tensorboards.values()]
    assert info.pid != tb_pid
    ip.magics_manager.registry["TFOSMagics"].shutdown_all()
    assert not (tmp_path / "runtime" / "tfos_nb" / f"{cid}.json").exists()
    assert _wait_gone(info.pid)


def _wait_gone(pid: int) -> bool:
    import psutil

    try:
        psutil.Process(pid).wait(timeout=15)
    except psutil.NoSuchProcess:
        pass
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_tensorboard_of_a_running_cluster_and_after_it_ended(ip, magic_spark, tmp_path, monkeypatch, capsys):
    """%tfos_tensorboard NAME registers the chief's TensorBoard with the proxy; once the cluster ended, a UsageError."""
    import json

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    forever = "import time\nwhile True:\n    ctx.report(step=1)\n    time.sleep(0.2)\n"
    ip.run_cell_magic("tfos_cluster", f"--workers 1 --background --tensorboard --logdir {tmp_path / 'logs'} --name tbc",
                      forever)
    handle = ip.user_ns["tbc"]
    wait_until(lambda: handle.tensorboard_url, 120, what="tbc's TensorBoard")
    capsys.readouterr()
    ip.run_line_magic("tfos_tensorboard", "tbc")
    cid = handle.status().cluster_id
    assert f"tfos_nb/tensorboard/{cid}/" in capsys.readouterr().out
    record = json.loads((tmp_path / "runtime" / "tfos_nb" / f"{cid}.json").read_text())
    assert handle.tensorboard_url.endswith(f"{record['host']}:{record['port']}") or str(record["port"]) in \
        handle.tensorboard_url
    ip.run_line_magic("tfos_shutdown", "tbc")
    assert handle.done
    assert not (tmp_path / "runtime" / "tfos_nb" / f"{cid}.json").exists()  # withdrawn when the cluster ended
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("tfos_tensorboard", "tbc")
    assert str(info.value) == "tbc has ended and its TensorBoard with it: use --logdir DIR"


ARGS_CELL = """
print("args-check", args["batch_size"], args.batch_size, "lr" in args, args.get("lr"), args.get("nope", "-"),
      sorted(dict(args)), sorted(vars(args)), list(args) == list(args.keys()), type(args).__name__)
"""


@pytest.mark.slow
def test_args_are_read_the_way_the_user_built_them(ip, magic_spark, capsys):
    """--args (a dict or an argparse.Namespace), the magic's own --epochs and --grid all give one args object."""
    import argparse

    ip.user_ns.update(ARGS={"batch_size": 32, "lr": 0.5}, PARSED=argparse.Namespace(batch_size=16, lr=None),
                      GRID=[{"batch_size": 8}, {"batch_size": 64}])
    ip.run_cell_magic("tfos_cluster", "--workers 1 --args ARGS --epochs 2 --name args_dict", ARGS_CELL)
    ip.run_cell_magic("tfos_cluster", "--workers 1 --args PARSED --name args_parsed", ARGS_CELL)
    out = capsys.readouterr().out
    assert "[chief:0] args-check 32 32 True 0.5 - ['batch_size', 'epochs', 'lr'] ['batch_size', 'epochs', 'lr'] " \
           "True Namespace" in out
    assert "[chief:0] args-check 16 16 True None - ['batch_size', 'epochs', 'lr'] ['batch_size', 'epochs', 'lr'] " \
           "True Namespace" in out
    cell = "return {'item': args['batch_size'], 'attr': args.batch_size, 'lr': args.get('lr'), 'vars': vars(args)}"
    ip.run_cell_magic("tfos_parallel", "--grid GRID --args ARGS --name args_grid", cell)
    assert ip.user_ns["args_grid"].values == [
        {"item": 8, "attr": 8, "lr": 0.5, "vars": {"batch_size": 8, "lr": 0.5}},
        {"item": 64, "attr": 64, "lr": 0.5, "vars": {"batch_size": 64, "lr": 0.5}},
    ]


EVALUATOR_CELL = """
import json, os, time
if ctx.job_name == "evaluator":
    print("evaluator task", json.dumps(json.loads(os.environ["TF_CONFIG"])["task"]), flush=True)
    seen = 0
    while True:  # as SidecarEvaluator without max_evaluations: evaluates each new checkpoint until it is stopped
        names = sorted(os.listdir(args.ckpt)) if os.path.isdir(args.ckpt) else []
        for name in names[seen:]:
            k = int(name.split("-")[1])
            ctx.report(step=k, val_loss=1.0 / k)
            print("evaluated", name, flush=True)
        seen = len(names)
        time.sleep(0.05)
staging = args.ckpt + ".staging"
os.makedirs(staging)
for k in (1, 2, 3):
    open(os.path.join(staging, f"ckpt-{k}"), "w").close()
os.rename(staging, args.ckpt)  # three checkpoints at once: the evaluator reports them in a burst
print("trained", flush=True)
"""


@pytest.mark.slow
def test_evaluator_gets_its_grace_then_is_stopped(ip, magic_spark, capsys, tmp_path, no_leaks):
    """--evaluator: the cell ends once the chief finished and the evaluator's grace is over; the evaluator (it never
    returns) is stopped, its role and every report it made are shown, the cluster ends finished."""
    ip.user_ns["EVAL_ARGS"] = {"ckpt": str(tmp_path / "ckpt")}
    ip.run_line_magic("config", "TFOSMagics.evaluator_grace = 5")
    try:
        ip.run_cell_magic("tfos_cluster", "--workers 1 --evaluator --args EVAL_ARGS --name with_eval", EVALUATOR_CELL)
    finally:
        ip.run_line_magic("config", "TFOSMagics.evaluator_grace = 30")
    out = capsys.readouterr().out
    assert "[chief:0] trained" in out
    assert '[evaluator:0] evaluator task {"type": "evaluator", "index": 0}' in out
    assert "[evaluator:0] evaluated ckpt-3" in out
    handle = ip.user_ns["with_eval"]
    assert handle.result["state"] == "finished"
    assert {n.label: (n.job_name, n.state) for n in handle.nodes} == {
        "chief:0": ("chief", "finished"), "evaluator:0": ("evaluator", "stopped")}
    history = handle.history
    evaluated = history[history.role == "evaluator"]
    assert evaluated.node.tolist() == ["evaluator:0"] * 3
    assert evaluated.step.tolist() == [1, 2, 3] and evaluated.val_loss.tolist() == [1.0, 0.5, 1.0 / 3]
    assert handle.result["metrics"]["evaluator:0"] == {"val_loss": 1.0 / 3}
