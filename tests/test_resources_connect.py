"""Resources per role on Spark Connect (what Databricks serverless and standard access mode offer): the same
profiles through ``mapInArrow(..., profile=)``, the coordinator's stage first, the other groups once it listens.

A real local Spark Connect server with GPUs faked as in ``tests/test_role_resources.py``.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, connect_session
from tests.test_role_resources import gpu_conf, grants, show_grant
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])


DYNAMIC = {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
           "spark.dynamicAllocation.initialExecutors": "0", "spark.dynamicAllocation.minExecutors": "0"}


@pytest.fixture(params=["task profiles", "dynamic allocation"])
def spark(request, tmp_path_factory):
    """A local Connect server of 4 one-core executors (the coordinator takes a slot): fixed, or brought by dynamic
    allocation (no barrier stage, so the coordinator's task launches alone, before the other nodes)."""
    conf = gpu_conf(tmp_path_factory.mktemp("gpu-connect"))
    session = connect_session(4, conf={**conf, **(DYNAMIC if request.param == "dynamic allocation" else {})})
    yield session
    session.stop()


def test_ps_on_cpu_and_workers_on_gpus_over_spark_connect(spark, no_leaks):
    dynamic = spark.conf.get("spark.dynamicAllocation.enabled", "false") == "true"
    memory = " memory=512m" if dynamic else ""
    cluster = TFCluster.run(spark, show_grant, {}, 3, num_ps=1, env={**NODE_ENV, "PATH": "/usr/bin:/bin"},
                            resources=f"ps: cpus=1{memory}; worker: cpus=1 gpus=1{memory}")
    views = {n.label: n for n in cluster.nodes}
    cluster.shutdown(timeout=60)
    seen = grants(cluster)
    assert seen["ps:0"]["visible"] == "" and seen["ps:0"]["resources"] == {}
    w0, w1 = seen["worker:0"]["resources"]["gpu"], seen["worker:1"]["resources"]["gpu"]
    assert len(w0) == len(w1) == 1 and w0 != w1
    assert seen["worker:0"]["visible"] == w0[0] and seen["worker:1"]["visible"] == w1[0]
    # the notebook's mirror of the coordinator's state carries each node's grant
    assert views["worker:0"].grant.resources == (("gpu", tuple(w0)),)
    assert views["ps:0"].grant.profile_id not in (None, views["worker:0"].grant.profile_id)
