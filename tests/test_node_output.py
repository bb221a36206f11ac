"""The nodes' output on the driver's stderr outside notebooks (``tfos_nb.runtime.driver.node_output``).

A batch job run by ``spark-submit`` (TensorFlowOnSpark's way) shows its nodes' lines as
``[role:index] line`` while it trains, TensorFlow's native log noise left out, unless
``TFOS_NB_NODE_OUTPUT=0`` (or ``TFCluster.run(..., node_output=False)``).  In a notebook
kernel nothing is written: the cell's panel and stream show the nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import KERNEL, NODE_ENV, kernel_execute
from tfos_nb.runtime.driver import node_output
from tfos_nb.runtime.noise import is_native_noise

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# -- the switch --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "env", "expected"),
    [
        (None, None, True),  # a plain Python process (this one): on
        (None, "0", False),
        (None, "false", False),
        (None, "off", False),
        (None, "1", True),
        (None, "", True),  # set but empty: the default
        (False, None, False),
        (False, "1", False),  # the argument wins over the environment
        (True, "0", True),
    ],
)
def test_switch_argument_then_environment_then_default(monkeypatch, argument, env, expected):
    if env is None:
        monkeypatch.delenv(node_output.ENV, raising=False)
    else:
        monkeypatch.setenv(node_output.ENV, env)
    assert node_output.wanted(argument) is expected


def test_a_bad_environment_value_is_an_error_that_names_it(monkeypatch):
    monkeypatch.setenv(node_output.ENV, "maybe")
    with pytest.raises(ValueError, match=r"^TFOS_NB_NODE_OUTPUT='maybe': use 1 \(stream the nodes' output"):
        node_output.wanted(None)


def test_lines_are_prefixed_and_native_noise_left_out():
    import io

    stream = io.StringIO()
    write = node_output.StderrLines(stream)
    write("chief:0", ["Epoch 1/3",
                      "I0000 00:00:1795340575.021916   12546 cudart_stub.cc:31] Could not find cuda drivers",
                      "2025-01-01 10:00:00.000001: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on",
                      "user line"])
    write("worker:1", ["WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"])
    assert stream.getvalue() == "[chief:0] Epoch 1/3\n[chief:0] user line\n"


@pytest.mark.slow
def test_a_notebook_kernel_keeps_its_own_display(kernel_specs):
    """In an IPython kernel the default is off (the cell shows the nodes); the variable still turns it on."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    km.start_kernel(cwd=REPO, env={**os.environ, node_output.ENV: ""})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        code = "from tfos_nb.runtime.driver import node_output\nprint(node_output.wanted(None))"
        assert kernel_execute(kc, code, 60).strip() == "False"
        code = f"import os\nos.environ[{node_output.ENV!r}] = '1'\nprint(node_output.wanted(None))"
        assert kernel_execute(kc, code, 60).strip() == "True"
    finally:
        kc.stop_channels()
        km.shutdown_kernel()  # a shutdown request, as Jupyter sends


# -- a real spark-submit -----------------------------------------------------------------------

JOB = '''
import json
import sys

from pyspark.sql import SparkSession

from tfos_nb import TFCluster


def main_fun(args, ctx):
    import numpy as np
    import tensorflow as tf

    print(f"hello from {ctx.job_name}:{ctx.task_index}", flush=True)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, epochs=2, batch_size=16, verbose=2)


spark = SparkSession.builder.appName("tfos_nb-node-output").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
cluster = TFCluster.run(spark.sparkContext, main_fun, {}, 1, master_node="chief", env=json.loads(sys.argv[2]))
cluster.shutdown(timeout=300)
with open(sys.argv[1], "w") as f:
    json.dump(cluster.logs(tail=None), f)
spark.stop()
'''


def spark_submit(tmp_path, env_extra: dict[str, str]) -> tuple[str, list[str]]:
    """Run JOB with ``spark-submit`` on a one-executor local-cluster; its whole output and the chief's logs.

    The Python driver's stderr reaches ``spark-submit``'s output (PySpark's runner merges it into stdout).
    """
    from tests.netns_cluster import pyspark_bin

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    logs = tmp_path / "logs.json"
    # TensorFlow's native INFO lines on (the filter has something to leave out), one TF thread per node
    node_env = dict(NODE_ENV, TF_CPP_MIN_LOG_LEVEL="0")
    env = {k: v for k, v in os.environ.items() if k != node_output.ENV}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, **env_extra)
    cmd = [pyspark_bin("spark-submit"), "--master", "local-cluster[1,1,1024]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.ui.showConsoleProgress=false", str(script), str(logs), json.dumps(node_env)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    return output, json.loads(logs.read_text())["chief:0"]


@pytest.mark.slow
def test_spark_submit_streams_node_lines_to_the_driver(tmp_path):
    output, logs = spark_submit(tmp_path, {})
    lines = output.splitlines()
    assert "[chief:0] hello from chief:0" in lines, output[-5000:]
    assert "[chief:0] Epoch 1/2" in lines and "[chief:0] Epoch 2/2" in lines, output[-5000:]
    assert any(line.startswith("[chief:0] 4/4 - ") and "loss: " in line for line in lines), output[-5000:]
    # the node did write TensorFlow's native noise (its log keeps it), the driver's stream left it out
    noise = [line for line in logs if is_native_noise(line)]
    assert noise, logs
    assert not [line for line in lines if line.startswith("[chief:0] ") and is_native_noise(line)], output[-5000:]
    assert not [line for line in noise if line in output]


@pytest.mark.slow
def test_spark_submit_with_node_output_off_shows_none(tmp_path):
    output, logs = spark_submit(tmp_path, {node_output.ENV: "0"})
    assert "hello from chief:0" in logs and "Epoch 1/2" in logs  # the node did print them
    assert "[chief:0]" not in output and "hello from chief" not in output, output[-5000:]
