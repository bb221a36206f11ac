"""Experiment tracking (MLflow): one run per job, logged from the notebook, checked on a real ``mlflow server``.

The slow tests share one ``mlflow server`` (127.0.0.1, a SQLite backend, a local artifact root; started
and stopped by a module fixture) and one real kernel (its embedded ``local-cluster`` Spark), and query
the server with ``MlflowClient``: a ``%%tfos_cluster --mlflow`` cell (params, the chief's metrics by step
equal to ``NAME.history``, the SavedModel loadable with ``mlflow.tensorflow``, the panel's link), a node
function calling ``mlflow.tensorflow.autolog()`` (still one run), a failing node (FAILED, the error
tail), ■ (KILLED), ``run_job(retries=1)`` with ``all_nodes`` and a ``log_dir`` (one run over both attempts,
the other node's metrics under ``worker_1/``, the log directory under ``tensorboard/``), a ``--background
--retries 1`` cell ended by ``%tfos_shutdown`` (one run, KILLED), a ``%%tfos_parallel`` sweep (a parent and a
child per trial), ``TFEstimator.fit`` inside ``with mlflow.start_run()``; then the same cell in a kernel on Spark Connect.
Against the same server, without Spark: the uploads of a SavedModel and a TensorBoard folder in which uid
``nobody`` planted links to a secret outside it (never uploaded), and a tracking URI carrying a password
(logged to, never shown).  The fast tests cover the missing-MLflow error (a real failed import, in a fresh
interpreter), the nodes' side of the rule for node functions that call MLflow (in a fresh interpreter), which
node's environment gets the tracking URI (a real supervisor, in a fresh interpreter), and the panel's link
(never with the URI's ``user:password@``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KERNEL, free_port, import_or_skip, wait_until
from tests.server_abuse import as_nobody, as_nobody_wait, writable_by_all

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, **(env or {})})


# -- fast: no Spark, no server -----------------------------------------------------------------
BLOCK_MLFLOW = """
import sys
class NoMlflow:  # this interpreter has no MLflow: its import fails as it would without the package
    def find_spec(self, name, path=None, target=None):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoMlflow())
"""


def test_asking_for_tracking_without_mlflow_is_an_import_error_naming_the_extra():
    result = _python(BLOCK_MLFLOW + """
from tfos_nb import TFCluster, TFParallel
from tfos_nb.runtime.driver import tracking
assert tracking.request(None) is None and tracking.request(False) is None  # not asked: no MLflow needed
for call in (lambda: tracking.request(True),
             lambda: TFCluster.run(None, print, {}, 1, mlflow=True),
             lambda: TFParallel.run(None, print, [{}], mlflow="sweeps")):
    try:
        call()
    except ImportError as exc:
        print("ImportError:", exc, "| cause:", type(exc.__cause__).__name__)
    else:
        raise SystemExit("no ImportError")
""")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3, result.stdout
    for line in lines:
        assert "pip install 'tfos_nb[mlflow]'" in line and "cause: ModuleNotFoundError" in line, line


@pytest.mark.parametrize(("role", "expected"), [
    ("chief", "chief r0 r0 http://127.0.0.1:1 False"),  # the chief logs into the job's run
    ("worker", "worker r0 None None True"),  # a worker's autologging does nothing
    ("trial", "trial r1 r1 http://127.0.0.1:1 False"),  # a sweep's trial logs into its own child run
])
def test_node_side_rule(role, expected):
    import_or_skip("mlflow")
    code = """
import os, types
from tfos_nb.runtime.executor.tracking import node as mlflow_node
import mlflow  # imported before the node's setup (e.g. by the function's globals): disarmed too
role = os.environ["ROLE"]
ctx = types.SimpleNamespace(is_chief=role == "chief", mlflow_run_id=None)
if role == "trial":
    ctx.run_index = 1
mlflow_node.setup(ctx)
import mlflow.sklearn  # a flavour imported after: disarmed as it loads
off = mlflow.autolog is mlflow_node._autolog_off and mlflow.sklearn.autolog is mlflow_node._autolog_off
print(role, ctx.mlflow_run_id, os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI"), off)
"""
    env = {"TFOS_MLFLOW_RUN_ID": "r0,r1", "TFOS_MLFLOW_TRACKING_URI": "http://127.0.0.1:1", "ROLE": role}
    env_clean = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**env_clean, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == expected


def test_the_panel_links_to_the_run_in_the_tracking_ui():
    from tfos_nb.runtime.driver.control import state
    from tfos_nb.widgets._view import panel_html, panel_model, text_line

    st = state.ClusterState("0123456789ab", "job", [("chief", 0)])
    url = "http://127.0.0.1:5000/#/experiments/1/runs/abc"
    st.tracking_url = url
    model = panel_model(st.snapshot())
    assert f'id="tfos-mlflow-0123456789ab" href="{url}"' in panel_html(model)
    assert "MLflow run" not in text_line(model)  # the text back-end: once, on the final line
    with st.lock:
        st.state = state.C_FINISHED
    assert text_line(panel_model(st.snapshot())).endswith(f"| MLflow run {url}")
    st.tracking_url = "javascript:alert(1)"  # only a web page is linked
    assert "tfos-mlflow" not in panel_html(panel_model(st.snapshot()))
    st.tracking_url = None
    assert "tfos-mlflow" not in panel_html(panel_model(st.snapshot()))


PASSWORD = "s3cret-pw"


def test_credentials_are_stripped_from_a_url_and_from_a_message():
    from tfos_nb.runtime.net import scrub_credentials, without_credentials

    assert without_credentials(f"https://alice:{PASSWORD}@mlflow.example.com:8443/x/#/runs/1") == \
        "https://mlflow.example.com:8443/x/#/runs/1"
    assert without_credentials("http://alice@127.0.0.1:5000/") == "http://127.0.0.1:5000/"
    assert without_credentials(f"postgresql://alice:{PASSWORD}@db/mlflow") == "postgresql://db/mlflow"
    assert without_credentials(f"https://alice:p@ss{PASSWORD}@h/") == "https://h/"  # an unencoded @ in it
    assert without_credentials(f"http://alice:{PASSWORD}@[::1") == "http://[::1"  # unparsable: still stripped
    for plain in ("http://127.0.0.1:5000/#/experiments/1", "databricks", "file:///tmp/mlruns", "sqlite:///m.db",
                  "https://h/?user=a@b"):
        assert without_credentials(plain) == plain
    message = f"API request to https://alice:{PASSWORD}@h/api/2.0/mlflow/runs/update failed with exception boom"
    assert scrub_credentials(message) == "API request to https://h/api/2.0/mlflow/runs/update failed with exception boom"
    from tfos_nb.runtime.driver.tracking.run import Request

    assert PASSWORD not in repr(Request(tracking_uri=f"https://alice:{PASSWORD}@h/", experiment_id="1"))


SUPERVISOR_ENV = """
import json, os, sys
from tfos_nb.runtime.executor.process.owner import tf_env
from tfos_nb.runtime.executor.process.supervisor import Supervisor
from tfos_nb.runtime.protocol import messages as m

roles, node, uri = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
meta = m.LaunchMeta(cluster_id="c0ffee", secret="00" * 32, control=["127.0.0.1", 9], hb_interval=0.5,
                    driver_timeout=10.0, env={"TFOS_MLFLOW_RUN_ID": "r0", "TFOS_MLFLOW_TRACKING_URI": uri},
                    keras="tf_keras", default_fs="file:///", driver_pid=0, roles=roles, node=node, watch_jvm=False)
sup = Supervisor(meta, b"")  # what a launch task starts for the node: it sets the node's environment
child = tf_env(dict(os.environ), sup.meta, [], False)  # the node process's environment
print(json.dumps([os.environ.get("TFOS_MLFLOW_RUN_ID"), os.environ.get("TFOS_MLFLOW_TRACKING_URI"),
                  child.get("TFOS_MLFLOW_RUN_ID"), child.get("TFOS_MLFLOW_TRACKING_URI")]))
"""


@pytest.mark.parametrize(("roles", "node", "logs"), [
    ([["chief", 0], ["worker", 0], ["worker", 1]], 0, True),
    ([["chief", 0], ["worker", 0], ["worker", 1]], 1, False),  # worker 0 beside a chief: not the one that logs
    ([["ps", 0], ["worker", 0], ["worker", 1]], 1, True),  # no chief: worker 0 logs
    ([["ps", 0], ["worker", 0], ["worker", 1]], 0, False),
    ([["ps", 0], ["worker", 0], ["worker", 1]], 2, False),
])
def test_only_the_node_that_logs_gets_the_tracking_uri(roles, node, logs):
    """The URI with its password reaches the chief's environment (and its node process's); every other node
    keeps the run id only."""
    uri = f"https://alice:{PASSWORD}@mlflow.example.com/"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFOS_MLFLOW")}
    result = subprocess.run([sys.executable, "-c", SUPERVISOR_ENV, json.dumps(roles), str(node), uri],
                            capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got == (["r0", uri, "r0", uri] if logs else ["r0", None, "r0", None])


def test_the_panel_never_shows_the_tracking_uris_password():
    import_or_skip("mlflow")
    from tfos_nb.runtime.driver.control import state
    from tfos_nb.runtime.driver.tracking.run import run_url
    from tfos_nb.widgets._view import panel_html, panel_model, text_line

    # the link as JobRun makes it (MLflow's own rule, from a REST store's host) for a URI with credentials
    url = run_url(f"https://alice:{PASSWORD}@mlflow.example.com:8443/mlflow", "1", "abc")
    assert url == "https://mlflow.example.com:8443/mlflow/#/experiments/1/runs/abc"
    st = state.ClusterState("0123456789ab", "job", [("chief", 0)])
    st.tracking_url = f"https://alice:{PASSWORD}@mlflow.example.com/#/experiments/1/runs/abc"  # however it got there
    with st.lock:
        st.state = state.C_FINISHED
    model = panel_model(st.snapshot())
    shown = [panel_html(model), panel_html(model, tensorboard=False), text_line(model), json.dumps(model)]
    for out in shown:  # the HTML display, the widget's HTML, the text back-end, the model the widget state holds
        assert PASSWORD not in out and "alice" not in out, out
    assert 'href="https://mlflow.example.com/#/experiments/1/runs/abc"' in shown[0]
    assert text_line(model).endswith("| MLflow run https://mlflow.example.com/#/experiments/1/runs/abc")


# -- slow: a real MLflow server, real kernels, real Spark ----------------------------------------
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Any:
    """A real ``mlflow server`` on loopback (SQLite backend, local artifact root), stopped with the module."""
    import_or_skip("mlflow")
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(root / "server.log", "w")  # closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)  # its own group: its workers too
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(f"{url}/health", timeout=5).status == 200, 180, interval=0.5,
                   ignore=(OSError,), proc=proc, what=f"mlflow server on {url} (log: {root / 'server.log'})")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def client(mlflow_server: str) -> Any:
    mlflow = import_or_skip("mlflow")
    return mlflow.MlflowClient(mlflow_server)


class Kernel:
    """A real kernel of this interpreter; ``run(code)`` returns the reply's content and every output message."""

    def __init__(self, kernel_specs: Any, cwd: Path, env: dict[str, str] | None = None) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
        self.km.start_kernel(cwd=str(cwd), env={**os.environ, **(env or {})})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 300, ok: bool = True) -> tuple[dict, list[dict]]:
        msgs: list[dict] = []
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=msgs.append)
        if ok:
            assert reply["content"]["status"] == "ok", (reply["content"], _text(msgs)[-3000:])
        return reply["content"], msgs

    def value(self, expr: str) -> Any:
        _, msgs = self.run(f"import json as _json\nprint('>>>' + _json.dumps({expr}))")
        # Not at a line's start: a --background job's thread may have printed into this cell just before,
        # without a newline yet (its lines reach whatever cell runs then).
        text = _streams(msgs)
        assert ">>>" in text, text[-3000:]
        return json.loads(text.rsplit(">>>", 1)[1].splitlines()[0])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel()  # a shutdown request, as Jupyter sends: its Spark stops with it


def _text(msgs: list[dict]) -> str:
    out = []
    for m in msgs:
        c = m["content"]
        out.append(str(c.get("text", "")) + str(c.get("evalue", "")))
        out.append(str(c.get("data", {}).get("text/html", "")))
    return "".join(out)


def _streams(msgs: list[dict]) -> str:
    return "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")


def _setup(url: str, export: Path) -> str:
    # MLFLOW_TRACKING_URI in the kernel's environment before Spark starts: the executors, and so every node,
    # inherit it, as on a platform whose executors know the tracking server; a non-chief node's autolog would log
    return (f"import os\nos.environ['MLFLOW_TRACKING_URI'] = {url!r}\nimport mlflow\n"
            f"ARGS = {{'lr': 0.05, 'opt': {{'name': 'sgd'}}, 'export_dir': {str(export)!r}}}\n"
            "%load_ext tfos_nb\n%config TFOSMagics.renderer = 'html'\n")


CLUSTER_CELL = """%%tfos_cluster --workers 2 --name {name} --mlflow tfos-tracking --args ARGS
import os

for step in range(1, 6):
    ctx.report(step=step, loss=args.lr * 100 / step + ctx.task_index)
if ctx.is_chief:
    import tensorflow as tf

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return 2 * x

    tf.saved_model.save(Doubler(), args.export_dir)
    print("run id on the chief:", ctx.mlflow_run_id, os.environ.get("MLFLOW_RUN_ID"), flush=True)
"""


def _one_run(client: Any, name: str, experiment: str = "tfos-tracking") -> Any:
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`tfos_nb.name` = '{name}'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def _check_cluster_run(kernel: Kernel, client: Any, server: str, name: str, msgs: list[dict], export: Path) -> None:
    run = _one_run(client, name)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["lr"] == "0.05" and params["opt.name"] == "sgd" and params["export_dir"] == str(export)
    assert params["tfos_nb.workers"] == "2" and params["tfos_nb.ps"] == "0"
    assert params["tfos_nb.input_mode"] == "tensorflow" and params["tfos_nb.evaluator"] == "False"
    assert params["epochs"] == "1" and params["tensorflow_version"] and params["spark_version"]
    assert run.data.tags["tfos_nb.outcome"] == "finished" and run.data.tags["tfos_nb.kind"] == "cluster"
    # the chief's metrics, step by step, are the notebook's history of chief:0
    history = kernel.value(f"{name}.history.query(\"node == 'chief:0'\")[['step', 'loss']].values.tolist()")
    logged = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert logged == [(int(s), v) for s, v in history] and len(logged) == 5, (logged, history)
    assert "system/steps_per_sec/chief_0" in run.data.metrics
    # the nodes had the run's id
    assert f"run id on the chief: {run_id} {run_id}" in _text(msgs)
    # the SavedModel the job exported, as an MLflow model
    import tensorflow as tf

    mlflow = import_or_skip("mlflow")
    mlflow.set_tracking_uri(server)
    downloaded = export.parent / f"downloaded-{name}"  # (MLflow's own default: a temporary folder it leaves behind)
    downloaded.mkdir()
    model = mlflow.tensorflow.load_model(f"runs:/{run_id}/model", dst_path=str(downloaded))
    assert model(tf.constant([1.5, 2.0])).numpy().tolist() == [3.0, 4.0]
    # the panel links to the run's page in the tracking UI
    expected = f"{server}/#/experiments/{run.info.experiment_id}/runs/{run_id}"
    links = set(re.findall(r'id="tfos-mlflow-[0-9a-f]+" href="([^"]+)"', _text(msgs)))
    assert links == {expected}, links
    assert kernel.value(f"{name}.tracking_url") == expected
    with urllib.request.urlopen(expected.split("#")[0], timeout=10) as page:  # the UI's page
        assert page.status == 200 and "text/html" in page.headers["Content-Type"]
    # what one run holds (pytest -s shows it)
    artifacts, folders = [], [""]
    while folders:
        for a in client.list_artifacts(run_id, folders.pop() or None):
            (folders if a.is_dir else artifacts).append(a.path)
    print(f"\nMLflow run {run_id} ({name}): status {run.info.status}\n  params {dict(sorted(params.items()))}"
          f"\n  tags {dict(sorted((k, v) for k, v in run.data.tags.items() if k.startswith('tfos_nb.')))}"
          f"\n  metric loss by step {logged}\n  last metrics {dict(sorted(run.data.metrics.items()))}"
          f"\n  artifacts {sorted(artifacts)}\n  UI {expected}")


AUTOLOG_CELL = """%%tfos_cluster --workers 2 --epochs 2 --name auto --mlflow tfos-autolog
import mlflow
import numpy as np
import tensorflow as tf

mlflow.tensorflow.autolog()  # on every node: the chief logs into the job's run, the others do nothing
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x = np.ones((32, 3), "float32")
model.fit(x, x.sum(axis=1), batch_size=8, epochs=args.epochs, verbose=0, callbacks=[ctx.progress_callback()])
print("active after fit:", mlflow.active_run() is not None, flush=True)
import os

print("tracking uri on", ctx.job_name, os.environ.get("MLFLOW_TRACKING_URI"), flush=True)
"""

FAILING_CELL = """%%tfos_cluster --workers 2 --name broken --mlflow tfos-tracking
ctx.report(step=1, loss=1.0)
if ctx.job_name == "worker":
    print("about to fail", flush=True)
    raise ValueError("bad shape on purpose")
"""

LOOPING_CELL = """%%tfos_cluster --workers 2 --name looping --mlflow tfos-tracking
import time
for step in range(1, 100000):
    ctx.report(step=step, loss=1.0 / step)
    if ctx.is_chief and step == 2:
        print("step", step, flush=True)
    time.sleep(0.1)
"""

SWEEP_CELL = """%%tfos_parallel --grid grid --metric score --name sweep --mlflow tfos-tracking
ctx.report(step=1, loss=args.lr)
return {"score": args.lr * 10}
"""

ESTIMATOR_CELL = """
from tfos_nb.pipeline import TFEstimator

def train_fn(args, ctx):
    for step in range(1, 4):
        ctx.report(step=step, loss=args.lr / step)

exp = mlflow.set_experiment("tfos-estimator")
est = TFEstimator(train_fn, {"lr": 0.3}, inputMode="TENSORFLOW", clusterSize=1, epochs=2)
with mlflow.start_run(run_name="mine") as active:  # the fit logs into the caller's run
    est.fit(spark.range(4))
active_id = active.info.run_id
"""


RETRY_CELL = """
from tfos_nb import TFCluster

def flaky(args, ctx):
    if ctx.attempt == 1:  # the first attempt: worker 1 fails, so run_job starts the cluster again
        if ctx.task_index == 1:
            print("failing on attempt", ctx.attempt, flush=True)
            raise ValueError("flaky on attempt 1")
        return
    for step in range(1, 4):
        ctx.report(step=step, loss=1.0 / step + ctx.task_index)
    if ctx.task_index == 0:  # something TensorBoard would read, in the job's log directory
        os.makedirs(ctx.log_dir, exist_ok=True)
        with open(os.path.join(ctx.log_dir, "events.out.tfevents.1.test"), "w") as f:
            f.write("not a real event file")

outcome = TFCluster.run_job(spark, flaky, {{"lr": 0.1}}, 2, retries=1, name="flaky", log_dir={log_dir!r},
                            mlflow={{"experiment": "tfos-tracking", "all_nodes": True}})
print("attempts", outcome.attempts, flush=True)
"""

BACKGROUND_CELL = """%%tfos_cluster --workers 2 --name bg --mlflow tfos-tracking --background --retries 1
import time
if ctx.attempt == 1 and ctx.job_name == "worker":  # the cell starts the cluster again: attempt 2 runs on
    raise ValueError("bg fails on attempt 1")
for step in range(1, 100000):
    ctx.report(step=step, loss=1.0 / step)
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_one_mlflow_run_per_job_from_a_notebook(mlflow_server, client, kernel_specs, tmp_path):
    kernel = Kernel(kernel_specs, tmp_path)
    try:
        kernel.run(_setup(mlflow_server, tmp_path / "export"), timeout=120)
        _, msgs = kernel.run(CLUSTER_CELL.format(name="job"))
        _check_cluster_run(kernel, client, mlflow_server, "job", msgs, tmp_path / "export")

        # a node function that calls mlflow.tensorflow.autolog() on every node: still one run, the job's
        started = int(time.time() * 1000)
        _, msgs = kernel.run(AUTOLOG_CELL)
        runs = [r for e in client.search_experiments() for r in client.search_runs(
            [e.experiment_id], filter_string=f"attributes.start_time >= {started}")]
        assert len(runs) == 1, [(r.info.run_name, r.data.tags.get("tfos_nb.name")) for r in runs]
        run = runs[0]
        assert run.data.tags["tfos_nb.name"] == "auto" and run.info.status == "FINISHED"
        # autolog's params, from the chief, in the job's run, beside the job's (the same epochs: the rule in the README)
        assert str(run.data.params.get("opt_name")).lower() == "sgd", (run.data.params, _streams(msgs)[-4000:])
        assert run.data.params["batch_size"] == "8"
        # ...beside the job's: Keras fit's own `workers` does not clash with tfos_nb.workers
        assert run.data.params["epochs"] == "2" and run.data.params["tfos_nb.workers"] == "2"
        assert "loss" in run.data.metrics
        # where each node's time went over the attempt, as system metrics: four shares a node, summing to 1
        for label in ("chief_0", "worker_0"):
            shares = [run.data.metrics[f"system/time_{c}/{label}"] for c in ("input", "compute", "peers", "other")]
            assert sum(shares) == pytest.approx(1.0) and min(shares) >= 0, (label, shares)
        text = _text(msgs)
        assert text.count("active after fit: False") == 2, text[-2000:]
        for node in ("chief", "worker"):  # a worker could have logged a run of its own: its autolog did nothing
            assert f"tracking uri on {node} {mlflow_server}" in text, text[-2000:]

        # a failing node: FAILED, its error and output tail on the run
        reply, msgs = kernel.run(FAILING_CELL, ok=False)
        assert reply["status"] == "error" and "bad shape on purpose" in reply["evalue"]
        run = _one_run(client, "broken")
        assert run.info.status == "FAILED"
        assert "ValueError: bad shape on purpose" in run.data.tags["tfos_nb.error"]
        assert run.data.tags["tfos_nb.outcome"] == "failed"
        tails = [a.path for a in client.list_artifacts(run.info.run_id, "errors")]
        assert tails == ["errors/attempt1_worker_0.txt"], tails
        tail = client.download_artifacts(run.info.run_id, tails[0], str(tmp_path))
        assert "about to fail" in Path(tail).read_text() and "bad shape on purpose" in Path(tail).read_text()

        # ■ while the nodes train: KILLED
        kc, msg_id = kernel.kc, kernel.kc.execute(LOOPING_CELL)
        seen: list[str] = []
        deadline = time.monotonic() + 240
        while not any("[chief:0] step 2" in s for s in seen):
            assert time.monotonic() < deadline, "no step reported: " + "".join(seen)[-2000:]
            msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                seen.append(msg["content"]["text"])
        assert _one_run(client, "looping").info.status == "RUNNING"
        kernel.km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=120)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=120)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        wait_until(lambda: _one_run(client, "looping").info.status != "RUNNING", 60)
        run = _one_run(client, "looping")
        assert run.info.status == "KILLED" and run.data.tags["tfos_nb.outcome"] == "stopped"
        assert client.get_metric_history(run.info.run_id, "loss")  # what the nodes reported until then

        # run_job(retries=1) with all_nodes: attempt 1 fails on worker 1, attempt 2 finishes -- still ONE run
        _, msgs = kernel.run(RETRY_CELL.format(log_dir=str(tmp_path / "tb")))
        assert "attempts 2" in _text(msgs), _text(msgs)[-3000:]
        run = _one_run(client, "flaky")
        run_id = run.info.run_id
        assert run.info.status == "FINISHED" and run.data.tags["tfos_nb.outcome"] == "finished"
        assert run.data.tags["tfos_nb.attempts"] == "2" and run.data.params["tfos_nb.retries"] == "1"
        failures = run.data.tags["tfos_nb.failures"]  # the failed attempt, its node and its error
        assert failures.startswith("attempt 1: worker:1 failed") and "ValueError: flaky on attempt 1" in failures, failures
        assert "tfos_nb.error" not in run.data.tags  # it finished: the failure is history, not the outcome
        # where the retry resumed from (no Keras in this job, so no backup: from the first step)
        assert run.data.tags["tfos_nb.resumed"] == "attempt 2: from the first step (no backup yet)", run.data.tags
        assert [a.path for a in client.list_artifacts(run_id, "errors")] == ["errors/attempt1_worker_1.txt"]
        # the chief (worker 0: no chief node) under its own keys, the other node under worker_1/ (all_nodes)
        assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss")) == \
            [(s, 1.0 / s) for s in (1, 2, 3)]
        assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "worker_1/loss")) == \
            [(s, 1.0 / s + 1) for s in (1, 2, 3)]
        # the job's TensorBoard log directory (log_dir=, --logdir) under tensorboard/
        assert [a.path for a in client.list_artifacts(run_id, "tensorboard")] == \
            ["tensorboard/events.out.tfevents.1.test"]

        # a --background --retries 1 cell: its worker fails on attempt 1, attempt 2 runs on in the same run;
        # %tfos_shutdown NAME ends it KILLED
        kernel.run(BACKGROUND_CELL)
        wait_until(lambda: kernel.value("len(bg.history.query('attempt == 2')) if len(bg.history) else 0") >= 2,
                   120, interval=0.5, what="bg's reports on attempt 2")
        assert _one_run(client, "bg").info.status == "RUNNING"
        kernel.run("%tfos_shutdown bg")
        wait_until(lambda: _one_run(client, "bg").info.status != "RUNNING", 60)
        run = _one_run(client, "bg")
        assert run.info.status == "KILLED" and run.data.tags["tfos_nb.outcome"] == "stopped"
        assert run.data.tags["tfos_nb.attempts"] == "2", run.data.tags
        failures = run.data.tags["tfos_nb.failures"]
        assert failures.startswith("attempt 1: worker:0 failed") and "ValueError: bg fails on attempt 1" in failures, failures
        assert run.data.tags["tfos_nb.resumed"] == "attempt 2: from the first step (no backup yet)", run.data.tags
        assert [a.path for a in client.list_artifacts(run.info.run_id, "errors")] == ["errors/attempt1_worker_0.txt"]
        assert client.get_metric_history(run.info.run_id, "loss")

        # a sweep: a parent run, one child per trial with its grid entry and its returned metric
        kernel.run("grid = [{'lr': 0.5}, {'lr': 2.0}]")
        kernel.run(SWEEP_CELL)
        parent = _one_run(client, "sweep")
        assert parent.info.status == "FINISHED" and parent.data.tags["tfos_nb.kind"] == "parallel"
        children = sorted(client.search_runs([parent.info.experiment_id],
                                             filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"),
                          key=lambda c: int(c.data.tags["tfos_nb.run"]))
        assert [(c.data.params["lr"], c.data.metrics["score"], c.data.metrics["loss"], c.info.status)
                for c in children] == [("0.5", 5.0, 0.5, "FINISHED"), ("2.0", 20.0, 2.0, "FINISHED")]
        assert parent.data.tags["tfos_nb.best_run_id"] == children[1].info.run_id
        assert parent.data.metrics["best_score"] == 20.0

        # TFEstimator.fit inside the caller's own run logs into it (the caller's `with` ends it)
        kernel.run(ESTIMATOR_CELL)
        active_id = kernel.value("active_id")
        run = client.get_run(active_id)
        assert run.info.status == "FINISHED" and run.info.run_name == "mine"
        assert run.data.params["lr"] == "0.3" and run.data.params["tfos_nb.workers"] == "1"
        assert run.data.params["tfos_nb.num_epochs"] == "2"
        assert run.data.tags["tfos_nb.outcome"] == "finished"
        assert [(m.step, m.value) for m in sorted(client.get_metric_history(active_id, "loss"),
                                                  key=lambda m: m.step)] == [(s, 0.3 / s) for s in (1, 2, 3)]
        exp = client.get_experiment_by_name("tfos-estimator")
        assert len(client.search_runs([exp.experiment_id])) == 1  # no run of its own
    finally:
        kernel.close()


@pytest.mark.slow
def test_the_same_cell_on_spark_connect(mlflow_server, client, kernel_specs, tmp_path, monkeypatch):
    """The notebook's tracking through the Connect session's mirror: no node reaches the tracking server."""
    # the kernel starts its own local Spark Connect server, not this test process's one (see test_connect_notebook)
    env = {"TFOS_NB_SPARK_CONNECT": "1"}
    for name in ("SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    kernel = Kernel(kernel_specs, tmp_path, env)
    try:
        kernel.run(_setup(mlflow_server, tmp_path / "export"), timeout=120)
        _, msgs = kernel.run(CLUSTER_CELL.format(name="connected"), timeout=400)
        assert kernel.value("type(spark).__module__") == "pyspark.sql.connect.session"
        _check_cluster_run(kernel, client, mlflow_server, "connected", msgs, tmp_path / "export")
    finally:
        kernel.close()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can write and no sticky bit protects (a shared export folder made 0777)."""
    with writable_by_all() as d:
        yield d


def _artifacts(client: Any, run_id: str) -> dict[str, bytes]:
    out, folders = {}, [""]
    while folders:
        for a in client.list_artifacts(run_id, folders.pop() or None):
            if a.is_dir:
                folders.append(a.path)
            else:
                with tempfile.TemporaryDirectory() as scratch:
                    out[a.path] = Path(client.download_artifacts(run_id, a.path, scratch)).read_bytes()
    return out


@pytest.mark.slow
def test_uploads_never_follow_a_link_out_of_the_folder(mlflow_server, client, open_dir, tmp_path, caplog):
    """The SavedModel (``export_dir``) and the TensorBoard folder (``log_dir``) in a folder another user can write:
    the links uid nobody planted there to a secret of this user's outside it, and a hard link to it, are left out
    and named in one warning; the regular files are uploaded."""
    as_nobody()
    from tfos_nb.runtime.driver.control import state
    from tfos_nb.runtime.driver.tracking.run import JobRun, Request

    secret = tmp_path / "id_rsa"  # this user's, outside the folders (/etc/shadow as root alike)
    secret.write_text("SECRET KEY\n")
    secret.chmod(0o600)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519").write_text("SECRET KEY\n")
    export, logs = open_dir / "export", open_dir / "logs"
    for d in (export, export / "variables", logs):
        d.mkdir()
        d.chmod(0o777)
    (export / "saved_model.pb").write_bytes(b"graph")
    (export / "variables" / "variables.index").write_bytes(b"index")
    (logs / "events.out.tfevents.1.test").write_bytes(b"events")

    def plant() -> None:
        os.symlink(secret, export / "fingerprint.pb")
        os.symlink(secret, export / "variables" / "variables.data-00000-of-00001")
        os.symlink(tmp_path / "keys", export / "assets")
        os.symlink(secret, logs / "events.out.tfevents.2.test")

    as_nobody_wait(plant)
    os.link(secret, export / "keras_metadata.pb")  # a hard link (nobody may not make one here: protected_hardlinks)
    experiment = client.create_experiment("tfos-links")
    run = JobRun(Request(tracking_uri=mlflow_server, experiment_id=experiment), "links", "cluster", {})
    run.export_dir, run.log_dir = str(export), str(logs)
    with caplog.at_level(logging.WARNING, logger="tfos_nb.runtime.driver.tracking.run"):
        run.finish(state.C_FINISHED)
    assert client.get_run(run.run_id).info.status == "FINISHED"
    uploaded = _artifacts(client, run.run_id)
    assert sorted(uploaded) == ["model/MLmodel", "model/tf2model/saved_model.pb",
                                "model/tf2model/variables/variables.index", "tensorboard/events.out.tfevents.1.test"]
    assert not [p for p, data in uploaded.items() if b"SECRET" in data]
    warnings = [r.getMessage() for r in caplog.records if "not uploaded to MLflow" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert warnings[0].endswith("assets, fingerprint.pb, keras_metadata.pb, variables/variables.data-00000-of-00001")
    assert warnings[1].endswith(": events.out.tfevents.2.test") and str(logs) in warnings[1]
    assert secret.read_text() == "SECRET KEY\n"


@pytest.mark.slow
def test_a_tracking_uri_with_a_password_is_logged_to_and_never_shown(mlflow_server, client):
    """MLflow gets the whole URI (the server takes basic auth from it); the link the panel shows has none of it."""
    from tfos_nb.runtime.driver.control import state
    from tfos_nb.runtime.driver.tracking.run import JobRun, Request
    from tfos_nb.widgets._view import panel_html, panel_model, text_line

    uri = mlflow_server.replace("http://", f"http://alice:{PASSWORD}@")
    experiment = client.create_experiment("tfos-credentials")
    run = JobRun(Request(tracking_uri=uri, experiment_id=experiment), "creds", "cluster", {"lr": 0.1})
    assert run.url == f"{mlflow_server}/#/experiments/{experiment}/runs/{run.run_id}"
    assert run.node_env()["TFOS_MLFLOW_TRACKING_URI"] == uri  # for the chief's supervisor to keep (above)
    st = state.ClusterState("0123456789ab", "creds", [("chief", 0), ("worker", 0)])
    st.tracking_url = run.url
    model = panel_model(st.snapshot())
    assert PASSWORD not in panel_html(model) + text_line(model) + json.dumps(model)
    run.finish(state.C_FINISHED)
    logged = client.get_run(run.run_id)
    assert logged.info.status == "FINISHED" and logged.data.params["lr"] == "0.1"
