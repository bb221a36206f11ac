"""The doctor's verdicts from facts (pure), its text and HTML reports, and the magic's argument checks.

The real misconfigurations on real Spark are in test_doctor_spark.py, test_doctor_envs.py,
test_spark_resources.py (GPUs) and test_doctor_multihost.py (network, storage).  The probe's token file in
an export folder others can write is tested here, with what uid ``nobody`` plants at its predictable name.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_abuse import as_nobody, as_nobody_wait, writable_by_all
from tfos_nb.runtime.doctor import FAIL, OK, WARN, DoctorFailed, Report, verdicts
from tfos_nb.runtime.doctor import probe as doctor_probe

DRIVER = {"python": "3.11.7", "tfos_nb": "0.1.0", "tensorflow": "2.21.0", "tensorflow-cpu": None, "keras": "3.15.1",
          "tf_keras": "2.21.0", "pyspark": "4.3.0", "executable": "/venv/bin/python", "pyspark_python_env": None}
SESSION = {"backend": "classic", "slots": 2, "executors": 2, "default_fs": "file:///",
           "conf": {"spark.master": "spark://m:7077", "spark.dynamicAllocation.enabled": None, "spark.task.cpus": None,
                    "spark.executor.cores": "1"}}


def task(i: int, host: str = "10.0.0.10", **over: object) -> dict:
    facts = {"task": i, "executor": str(i), "host": host, "port": 20000 + i, "python": "3.11.7", "tfos_nb": "0.1.0",
             "tfos_nb_path": "/venv/tfos_nb/__init__.py", "tensorflow": "2.21.0", "keras": "3.15.1", "tf_keras": "2.21.0",
             "pyspark_module": "4.3.0", "tf_module": "2.21.0", "tf_import_s": 3.0, "executable": "/venv/bin/python",
             "spark_gpus": [], "nvidia_smi": None, "reach": {}, "seen": {}, "driver_error": None}
    facts.update(over)
    return facts


def healthy(n: int = 2) -> list[dict]:
    tasks = [task(i, host=f"10.0.0.{10 + i}") for i in range(n)]
    for t in tasks:
        t["reach"] = {str(o["task"]): None for o in tasks if o is not t}
    return tasks


def by_status(checks, status):
    return [c for c in checks if c.status == status]


def test_a_healthy_cluster_is_all_ok():
    checks = verdicts(SESSION, DRIVER, healthy(), nodes=2)
    assert by_status(checks, FAIL) == [] and by_status(checks, WARN) == [], checks
    assert {c.area for c in checks} >= {"slots", "settings", "python", "tfos_nb", "tensorflow", "keras", "gpus", "network"}


def test_too_few_slots_fail_with_the_numbers_and_the_fix():
    (fail,) = by_status(verdicts(SESSION, DRIVER, healthy(), nodes=3), FAIL)
    assert fail.area == "slots" and "3 nodes need 3 task slots" in fail.detail and "2 on 2 executor(s)" in fail.detail
    assert "local-cluster[3,1,MB]" in fail.fix


def test_dynamic_allocation_and_task_cpus_beyond_the_cores_fail():
    conf = dict(SESSION["conf"], **{"spark.dynamicAllocation.enabled": "true", "spark.task.cpus": "4"})
    fails = by_status(verdicts(dict(SESSION, conf=conf), DRIVER, healthy(), nodes=2), FAIL)
    assert {c.fix for c in fails} >= {"set spark.dynamicAllocation.enabled=false", "set spark.task.cpus to at most 1"}


def test_each_executor_problem_names_its_executor():
    tasks = healthy(3)
    tasks[1].update(tf_error="ModuleNotFoundError: No module named 'tensorflow'", tf_module=None, tf_import_s=0.01)
    tasks[2].update(tfos_nb="0.0.9", tfos_nb_path="/old/tfos_nb/__init__.py")
    fails = by_status(verdicts(dict(SESSION, slots=3), DRIVER, tasks, nodes=3), FAIL)
    tf = next(c for c in fails if c.area == "tensorflow")
    assert tf.where == "executor 1 (10.0.0.11)" and "tensorflow==2.21.0" in tf.fix
    ver = next(c for c in fails if c.area == "tfos_nb")
    assert ver.where == "executor 2 (10.0.0.12)" and "/old/tfos_nb" in ver.detail and "tfos_nb==0.1.0" in ver.fix


def test_alike_failures_on_many_executors_become_one_row_naming_them_all():
    tasks = healthy(3)
    for t in tasks:
        t.update(tf_error="ModuleNotFoundError: No module named 'tensorflow'")
    (row,) = [c for c in verdicts(dict(SESSION, slots=3), DRIVER, tasks, nodes=3) if c.area == "tensorflow"]
    assert row.status == FAIL and row.where == "executors 0 (10.0.0.10), 1 (10.0.0.11), 2 (10.0.0.12)"


def test_one_gpu_given_to_two_executors_of_a_host_fails_naming_both():
    tasks = healthy(2)
    for t in tasks:
        t.update(host="10.0.0.5", spark_gpus=["0"])
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2), FAIL)
    assert fail.area == "gpus" and fail.where == "host 10.0.0.5" and "executors 0, 1" in fail.detail
    tasks[1]["spark_gpus"] = ["1"]
    assert not by_status(verdicts(SESSION, DRIVER, tasks, nodes=2), FAIL)


def test_a_spark_gpu_nvidia_smi_does_not_show_fails():
    tasks = healthy(1)
    tasks[0].update(spark_gpus=["3"], nvidia_smi=[{"index": "0", "uuid": "GPU-1", "name": "A100"}])
    (fail,) = by_status(verdicts(dict(SESSION, slots=1), DRIVER, tasks, nodes=1), FAIL)
    assert fail.area == "gpus" and "3" in fail.detail and "discoveryScript" in fail.fix


def test_unreachable_peers_and_driver_fail_with_both_ends():
    tasks = healthy(2)
    tasks[0]["reach"] = {"1": "TimeoutError: timed out"}
    tasks[1]["driver_error"] = "ConnectionRefusedError: [Errno 111] Connection refused"
    fails = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2), FAIL)
    peer = next(c for c in fails if "node 1" in c.detail)
    assert peer.where == "executor 0 (10.0.0.10)" and "executor 1 at 10.0.0.11:20001" in peer.detail
    drv = next(c for c in fails if "driver" in c.detail)
    assert drv.where == "executor 1 (10.0.0.11)" and "spark.driver.host" in drv.fix


def test_storage_not_writable_or_not_shared_fails_and_hdfs_needs_its_environment():
    tasks = healthy(2)
    tasks[0].update(export_path="/data/out", write_error="OSError: [Errno 30] Read-only file system: '/data/out'")
    tasks[1].update(export_path="/data/out", seen={"0": None})
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2, export_dir="/data/out"), FAIL)
    assert fail.where == "executor 0 (10.0.0.10)" and "Read-only" in fail.detail
    tasks = healthy(2)
    tasks[1].update(export_path="/x", seen={"0": "FileNotFoundError: gone"})
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2, export_dir="/x"), FAIL)
    assert "not one shared directory" in fail.detail and fail.where == "executor 1 (10.0.0.11)"
    tasks = healthy(2)
    for t in tasks:
        t.update(export_path="hdfs://nn/models", export_remote=True, classpath_set=False, libhdfs=None, java_home="/j")
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2, export_dir="hdfs://nn/models"), FAIL)
    assert "CLASSPATH" in fail.detail and "libhdfs.so" in fail.detail and "hadoop classpath --glob" in fail.fix
    # TensorFlow >= 2.6 reads hdfs:// (and s3://) only through tensorflow-io: a Hadoop environment alone is not enough
    for t in tasks:
        t.update(classpath_set=True, libhdfs="/h/lib/native/libhdfs.so")
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2, export_dir="hdfs://nn/models"), FAIL)
    assert fail.detail == ("hdfs://nn/models: TensorFlow's HDFS support needs the tensorflow-io package in the "
                           "executor's environment"), fail.detail
    assert fail.fix.startswith("pip install tensorflow-io") and "import tensorflow_io" in fail.fix, fail.fix
    for t in tasks:
        t["tensorflow-io"] = "0.37.1"
    assert by_status(verdicts(SESSION, DRIVER, tasks, nodes=2, export_dir="hdfs://nn/models"), FAIL) == []
    for t in tasks:
        t.update(export_path="s3://bucket/models", **{"tensorflow-io": None})
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2, export_dir="s3://bucket/models"), FAIL)
    assert "S3 support needs the tensorflow-io package" in fail.detail and "CLASSPATH" not in fail.fix


def test_a_tf_keras_for_another_tensorflow_minor_fails():
    """tf_keras X.Y works with TensorFlow X.Y only (pip can pair them wrongly when TensorFlow was there first)."""
    tasks = healthy(2)
    tasks[1].update(tf_keras="2.21.0", tensorflow="2.17.1", tf_module="2.17.1")
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2), FAIL)
    assert fail.area == "keras" and fail.detail == (
        "tf_keras 2.21.0 with TensorFlow 2.17.1: each tf_keras release works with its own TensorFlow minor only")
    assert fail.fix == "pip install 'tf-keras~=2.17.0' on the executors"


def test_a_stage_that_could_not_run_fails_and_connect_says_what_it_allows():
    connect = dict(SESSION, backend="connect", slots=None, executors=None)
    fails = by_status(verdicts(connect, DRIVER, [], nodes=2, stage_error="did not finish in 5 s"), FAIL)
    assert fails and "did not finish" in fails[0].detail
    checks = verdicts(connect, DRIVER, healthy(), nodes=2)
    assert not by_status(checks, FAIL) and any(c.area == "session" and "Spark Connect" in c.detail for c in checks)


def test_a_stage_that_did_not_finish_checks_nothing_on_the_executors():
    # seen on a slow CI host: "network OK: every node reached every other (0 connections)" under a barrier FAIL
    checks = verdicts(SESSION, DRIVER, [], nodes=2, export_dir="/data/out",
                      stage_error="the doctor's barrier stage of 2 task(s) did not finish in 120 s")
    probed = {c.area: c for c in checks if c.area in ("gpus", "network", "storage")}
    assert set(probed) == {"gpus", "network", "storage"}
    assert all(c.status == WARN and "not checked" in c.detail for c in probed.values()), probed
    (barrier,) = [c for c in checks if c.area == "barrier"]
    assert barrier.status == FAIL and "reach each other" in barrier.fix


def test_report_text_raises_one_error_and_renders_html():
    from tfos_nb.magics._doctor import report_html

    checks = tuple(verdicts(SESSION, DRIVER, healthy(), nodes=3))
    report = Report(3, checks, "classic", "spark://m:7077", 1.5)
    text = report.text()
    assert text.splitlines()[0].startswith("tfos_nb doctor: 3 node(s) on spark://m:7077 (classic)")
    assert "FAIL  slots" in text and "fix: give Spark at least 3 slots" in text
    with pytest.raises(DoctorFailed, match="no cluster was started:\ncluster: 3 nodes need 3 task slots"):
        report.raise_for_failures()
    page = report_html(report)
    assert page.count("<tr class=\"tfos-doctor-") == len(checks) and "tfos-doctor-fail" in page
    assert OK in page and "<b>fix:</b>" in page
    Report(2, tuple(verdicts(SESSION, DRIVER, healthy(), nodes=2))).raise_for_failures()  # no FAIL: no error


def test_the_magic_refuses_bad_arguments_and_a_notebook_without_spark():
    import IPython
    from IPython.core.error import UsageError
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or IPython.get_ipython()  # None when another module started it
    shell.run_line_magic("load_ext", "tfos_nb")
    with pytest.raises(UsageError, match="--nodes must be at least 1"):
        shell.run_line_magic("tfos_doctor", "--nodes 0")
    with pytest.raises(UsageError, match="no Spark session in this notebook"):  # the fast tier starts no Spark
        shell.run_line_magic("tfos_doctor", "--nodes 2")


def test_nodes_must_be_a_positive_integer():
    from tfos_nb import doctor

    with pytest.raises(ValueError, match="nodes must be a positive integer"):
        doctor(object(), 0)


# -- the probe's token file, in an export folder other users can write ------------------------------------------
TOKEN = "0123456789abcdef"


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """An export folder every user can write and no sticky bit protects (a shared folder made 0777)."""
    with writable_by_all() as d:
        yield d


def test_the_token_file_is_new_and_0600_and_read_back(open_dir: Path) -> None:
    old = os.umask(0)
    try:
        assert doctor_probe._write_token(str(open_dir / "made"), ".tfos_doctor-r-0", TOKEN) is None
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(open_dir / "made" / ".tfos_doctor-r-0").st_mode) == 0o600
    assert doctor_probe._read_token(str(open_dir / "made"), ".tfos_doctor-r-0", TOKEN) is None
    assert "another file" in str(doctor_probe._read_token(str(open_dir / "made"), ".tfos_doctor-r-0", "f" * 16))


def test_a_symlink_planted_at_the_token_path_is_not_written_through(open_dir: Path, tmp_path: Path) -> None:
    as_nobody()
    target = tmp_path / "precious"  # root's, outside the shared folder
    target.write_text("precious\n")
    link = open_dir / ".tfos_doctor-c0ffee-1"  # task 0's file named the run: task 1's name is known
    as_nobody_wait(lambda: os.symlink(target, link))
    why = doctor_probe._write_token(str(open_dir), link.name, TOKEN)
    assert why is not None and str(link) in why and "not written through" in why, why
    assert target.read_text() == "precious\n" and link.is_symlink()
    # the verdict names the folder and the reason
    tasks = healthy(2)
    tasks[1].update(export_path=str(open_dir), write_error=why)
    (fail,) = by_status(verdicts(SESSION, DRIVER, tasks, nodes=2, export_dir=str(open_dir)), FAIL)
    assert fail.where == "executor 1 (10.0.0.11)" and "not written through" in fail.detail


def test_a_token_read_follows_no_symlink_and_takes_no_other_users_file(open_dir: Path, tmp_path: Path) -> None:
    as_nobody()
    real = tmp_path / "real"  # a file holding the token, outside the folder: seen only through a link
    real.write_text(TOKEN)
    as_nobody_wait(lambda: os.symlink(real, open_dir / ".tfos_doctor-c0ffee-1"))
    why = doctor_probe._read_token(str(open_dir), ".tfos_doctor-c0ffee-1", TOKEN)
    assert why is not None and "symlink" in why and "not followed" in why, why

    def plant() -> None:  # nobody's own file holding the token (as if it had guessed or read it)
        fd = os.open(open_dir / ".tfos_doctor-c0ffee-2", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, TOKEN.encode())
        os.close(fd)

    as_nobody_wait(plant)
    why = doctor_probe._read_token(str(open_dir), ".tfos_doctor-c0ffee-2", TOKEN)
    assert why is not None and "owned by uid" in why and "not the peer's token" in why, why


def test_the_probe_travels_by_value_where_tfos_nb_cannot_be_imported() -> None:
    """What the doctor ships (``job.ship_probe_by_value``) runs, executor id included, in a Python that has no
    tfos_nb (or another version of it): nothing in the task is pickled by reference to a tfos_nb module."""
    import cloudpickle

    from tfos_nb.runtime.doctor import job

    payload = cloudpickle.dumps(job.ship_probe_by_value().classic_task({"run": "r"}))
    code = ("import pickle, sys; sys.modules['tfos_nb'] = None\n"
            "task = pickle.loads(sys.stdin.buffer.read())\n"
            "print(task.__code__.co_freevars, task.__globals__['probe'].__globals__['executor_id']())")
    done = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, timeout=60, cwd="/")
    assert done.returncode == 0 and done.stdout.decode().split()[-1] == "driver", done
