"""TensorFlow's thread pools per node/run process: derived from ``spark.task.cpus``, overridable."""

from __future__ import annotations

import dataclasses
import os
import sys

import cloudpickle
import pytest

from tfos_nb.runtime.executor.process import threads
from tfos_nb.runtime.executor.process.owner import tf_env
from tfos_nb.runtime.protocol import messages

# The runs' functions travel by value: executors cannot import this test module (no repo root on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_executor_cores_come_from_the_backend_command_line():
    args = [b"java", b"-cp", b"x", b"org.apache.spark.executor.CoarseGrainedExecutorBackend",
            b"--executor-id", b"0", b"--hostname", b"h", b"--cores", b"8", b"--app-id", b"a"]
    assert threads.cores_from_cmdline(args) == 8
    assert threads.cores_from_cmdline([b"java", b"--cores"]) is None
    assert threads.cores_from_cmdline([b"java", b"--cores", b"many", b""]) is None
    assert threads.executor_cores(None) is None


def test_derive_gives_the_task_its_cores_within_the_executor_and_the_machine():
    assert threads.derive(None, None, 16) == 1  # spark.task.cpus defaults to 1
    assert threads.derive(1, 8, 16) == 1
    assert threads.derive(8, 8, 16) == 8  # one node per executor: the whole executor
    assert threads.derive(4, 2, 16) == 2  # never more than the executor has
    assert threads.derive(8, None, 4) == 4  # nor than the CPUs this process may use
    assert threads.derive(0, 0, 0) == 1


def test_thread_env_keeps_an_explicit_setting_and_honours_the_override(monkeypatch):
    assert threads.thread_env({"TF_NUM_INTRAOP_THREADS": "3"}, 8) == {}  # executorEnv / env= / tf_threads win
    assert threads.thread_env({"TFOS_TF_THREADS": "0"}, 8) == {}  # TensorFlow's own default
    assert threads.thread_env({"TFOS_TF_THREADS": "5"}, 1) == {
        "TF_NUM_INTRAOP_THREADS": "5", "TF_NUM_INTEROP_THREADS": "6", "OMP_NUM_THREADS": "5"}
    derived = threads.thread_env({"OMP_NUM_THREADS": "1"}, 1)  # this test process has no executor JVM above it
    assert derived == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}
    cpus = len(os.sched_getaffinity(0))
    assert threads.thread_env({}, 64)["TF_NUM_INTRAOP_THREADS"] == str(min(64, cpus))
    # tf_env: a cell's env= is applied first, so it wins over the derivation
    meta = messages.LaunchMeta(cluster_id="c1", secret="00", control=["127.0.0.1", 9], hb_interval=0.5, driver_timeout=10.0,
                        env={"TF_NUM_INTRAOP_THREADS": "2"}, keras="tf_keras", default_fs="file:///", driver_pid=1,
                        task_cpus=8)
    env = tf_env({}, meta, [], False)
    assert env["TF_NUM_INTRAOP_THREADS"] == "2" and "TF_NUM_INTEROP_THREADS" not in env
    assert tf_env({}, dataclasses.replace(meta, env={}, task_cpus=1), [], False)["TF_NUM_INTRAOP_THREADS"] == "1"


def report_threads(args, ctx):
    return {name: os.environ.get(name) for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}


@pytest.fixture(scope="module")
def sc_two_cpu_tasks():
    """One executor of 2 cores whose tasks take both (spark.task.cpus=2), no thread settings in executorEnv."""
    import sys

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # loadDefaults=False: an earlier module's session in this process left its settings (executorEnv thread
    # counts among them) as the JVM's system properties, which a default SparkConf would take over
    conf = (SparkConf(loadDefaults=False).setMaster("local-cluster[1,2,1024]").setAppName("tfos_nb-tests-threads")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.task.cpus", "2").set("spark.task.maxFailures", "1")
            .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2"))
    spark = SparkSession(SparkContext(conf=conf))
    yield spark.sparkContext
    spark.stop()


@pytest.mark.slow
def test_a_run_gets_the_cores_of_its_task(sc_two_cpu_tasks):
    from tfos_nb import TFParallel

    runs = TFParallel.start(sc_two_cpu_tasks, report_threads, [{}], use_barrier=False, name="threads")
    (result,) = runs.wait(timeout=300)
    # 2 cores per task, read from TaskContext.cpus() and capped by the executor's --cores 2
    assert result.value == {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "3"}, result.value
