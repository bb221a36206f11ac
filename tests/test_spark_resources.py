"""GPUs from Spark's own task resources (spark.task.resource.gpu.amount), faked the way Spark's tests do."""

from __future__ import annotations

import json
import os
import sys

import cloudpickle
import pytest

from tests.conftest import spark_session
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    script = tmp_path_factory.mktemp("gpu") / "discover.sh"
    script.write_text('#!/bin/sh\necho \'{"name":"gpu","addresses":["0","1"]}\'\n')
    script.chmod(0o755)
    spark = spark_session(2, conf={
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": str(script),
        "spark.executor.resource.gpu.amount": "1",
        "spark.executor.resource.gpu.discoveryScript": str(script),
        "spark.task.resource.gpu.amount": "1",
    })
    yield spark.sparkContext
    spark.stop()


def show_gpus(args, ctx):
    print("VISIBLE " + json.dumps([os.environ.get("CUDA_VISIBLE_DEVICES"), [g["index"] for g in ctx.gpus]]))


def test_nodes_get_the_gpus_spark_assigned_to_their_task(sc, no_leaks):
    cluster = TFCluster.run(sc, show_gpus, {}, 2, env={"PATH": "/usr/bin:/bin"})  # no nvidia-smi at all
    cluster.shutdown(timeout=60)
    seen = []
    for label, lines in cluster.logs(tail=None).items():
        (line,) = [x for x in lines if x.startswith("VISIBLE ")]
        visible, ctx_gpus = json.loads(line[len("VISIBLE "):])
        assert visible is not None and visible == ",".join(ctx_gpus), (label, visible, ctx_gpus)
        assert len(ctx_gpus) == 1
        seen.append(visible)
    assert all(v in ("0", "1") for v in seen)
    assert all(n.device.startswith("GPU") for n in cluster.nodes), [n.device for n in cluster.nodes]


def test_the_doctor_fails_a_gpu_given_to_two_executors_of_one_host(sc, no_leaks):
    """This module's discovery script reports GPUs 0 and 1 to each of the two workers of one host, so each
    executor takes GPU 0: the doctor names the host, the GPU and both executors."""
    from tfos_nb import doctor

    report = doctor(sc, nodes=2, num_gpus=1)
    print("\n" + report.text())
    (fail,) = [c for c in report.checks if c.status == "FAIL"]
    assert fail.area == "gpus" and fail.where.startswith("host ")
    assert "GPU 0 is assigned to executors 0, 1 at once" in fail.detail, report.text()
    assert "discovery script" in fail.fix
    assert sorted(f["spark_gpus"] for f in report.executors) == [["0"], ["0"]]
