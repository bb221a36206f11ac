"""The doctor on a real ``local-cluster``: healthy, too few slots, a directory each executor sees alone,
``TFCluster.run(..., preflight=True)`` and ``%tfos_doctor`` in a real IPython shell.

Executors whose Python lacks TensorFlow or has another tfos_nb: test_doctor_envs.py; GPUs given twice:
test_spark_resources.py; nodes that cannot reach each other and a directory one host cannot write:
test_doctor_multihost.py.
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest

from tests.conftest import spark_fixture
from tfos_nb import TFCluster, doctor
from tfos_nb.runtime.doctor import FAIL, OK, DoctorFailed

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = spark_fixture(2)


def fails(report):
    return [c for c in report.checks if c.status == FAIL]


def test_a_healthy_cluster_is_all_ok(spark, tmp_path, no_leaks):
    export = tmp_path / "export"
    report = doctor(spark, nodes=2, export_dir=str(export))
    print("\n" + report.text())
    assert all(c.status == OK for c in report.checks), report.text()
    assert {c.area for c in report.checks} >= {"slots", "barrier", "settings", "python", "tfos_nb", "tensorflow", "keras",
                                               "pyspark", "gpus", "network", "storage"}
    assert "every node reached every other (2 connections), and the driver" in report.text()
    assert sorted(f["executor"] for f in report.executors) == ["0", "1"]
    assert list(export.iterdir()) == []  # the tokens are gone
    assert report.elapsed_s < 60


def test_too_few_slots_fail_before_any_stage_waits(spark, no_leaks):
    t0 = time.monotonic()
    report = doctor(spark, nodes=3)
    (fail,) = fails(report)
    assert fail.area == "slots" and "this application has 2 on 2 executor(s)" in fail.detail, report.text()
    assert time.monotonic() - t0 < 60  # the executors were still probed, with the 2 slots there are


def test_a_relative_directory_is_each_executors_own(spark, no_leaks):
    report = doctor(spark, nodes=2, export_dir="doctor-relative")
    found = [c for c in fails(report) if c.area == "storage"]
    assert {c.where.split(" (")[0] for c in found} == {"executor 0", "executor 1"}, report.text()
    assert all("not one shared directory" in c.detail and "absolute path" in c.fix for c in found)


def never_runs(args, ctx):
    raise AssertionError("the preflight should have stopped the cluster before it started")


def test_preflight_turns_a_fail_into_one_error_before_the_cluster_starts(spark, no_leaks):
    from tfos_nb.runtime.driver.launch.start import add_start_listener, remove_start_listener

    started = []
    add_start_listener(started.append)
    try:
        with pytest.raises(DoctorFailed, match=r"no cluster was started:\ncluster: 3 nodes need 3 task slots") as info:
            TFCluster.run(spark.sparkContext, never_runs, {}, 3, preflight=True)
    finally:
        remove_start_listener(started.append)
    assert started == [] and info.value.report.nodes == 3


def test_the_magic_shows_the_report_as_a_table(spark, no_leaks):
    import IPython
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython() or IPython.get_ipython()
    shell.run_line_magic("load_ext", "tfos_nb")
    shell.user_ns["spark"] = spark
    html = shell.display_formatter.formatters["text/html"]
    enabled, html.enabled = html.enabled, True  # as in a notebook kernel (terminal IPython shows text only)
    try:
        with capture_output() as out:
            shell.run_line_magic("tfos_doctor", "--nodes 3")
    finally:
        del shell.user_ns["spark"]  # the shell outlives this module's Spark
        html.enabled = enabled
    (shown,) = out.outputs
    page = shown.data["text/html"]
    assert page.count('class="tfos-doctor-fail"') == 1 and "3 nodes need 3 task slots" in page
    assert shown.data["text/plain"].startswith("tfos_nb doctor: 3 node(s) on local-cluster[2,1,1024] (classic)")
    assert shell.user_ns["_tfos_doctor"].failures[0].area == "slots"
