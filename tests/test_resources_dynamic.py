"""Resources per role with dynamic allocation: each role's launch stage brings executors of its own profile.

Spark cannot run a barrier stage with dynamic allocation on (SPARK-24942), so the groups' stages are plain ones,
joined by tfos_nb's reservation. Real ``local-cluster`` Spark, GPUs faked as in ``tests/test_role_resources.py``;
no executor at the start.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, spark_session
from tests.test_role_resources import gpu_conf, grants, show_grant
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    conf = {**gpu_conf(tmp_path_factory.mktemp("gpu-dyn")),
            "spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.initialExecutors": "0", "spark.dynamicAllocation.minExecutors": "0",
            "spark.dynamicAllocation.executorIdleTimeout": "5s"}
    spark = spark_session(3, conf=conf)
    yield spark.sparkContext
    spark.stop()


def executor_profiles(sc) -> dict[str, int]:
    """Spark's own record: each live executor's ResourceProfile id (the status store the Spark UI reads)."""
    summaries = sc._jsc.sc().statusStore().executorList(True)
    out = {}
    for i in range(summaries.size()):
        e = summaries.apply(i)
        if e.id() != "driver":
            out[e.id()] = int(e.resourceProfileId())
    return out


def test_each_role_gets_executors_of_its_profile(sc, no_leaks):
    """The launch stages bring executors of the ps's and of the workers' profiles; each node runs on one of its
    own profile, as Spark's status store records it."""
    cluster = TFCluster.run(sc, show_grant, {}, 3, num_ps=1, env={**NODE_ENV, "PATH": "/usr/bin:/bin"},
                            resources={"ps": {"cpus": 1, "memory": "512m"},
                                       "worker": {"cpus": 1, "gpus": 1, "memory": "512m"}})
    views = {n.label: n for n in cluster.nodes}
    profiles = executor_profiles(sc)
    cluster.shutdown(timeout=60)
    seen = grants(cluster)
    ps, w0, w1 = views["ps:0"], views["worker:0"], views["worker:1"]
    assert 0 not in (ps.grant.profile_id, w0.grant.profile_id)  # 0: Spark's default profile
    assert ps.grant.profile_id != w0.grant.profile_id == w1.grant.profile_id, views
    assert profiles[ps.executor_id] == ps.grant.profile_id, profiles
    assert profiles[w0.executor_id] == profiles[w1.executor_id] == w0.grant.profile_id, profiles
    assert seen["ps:0"]["visible"] == "" and seen["worker:0"]["resources"]["gpu"] != seen["worker:1"]["resources"]["gpu"]


def test_a_group_spark_cannot_place_is_named_and_the_others_are_stopped(sc, no_leaks):
    """The ps asks executors bigger than any worker of this cluster (1024 MB): its stage never starts a task. The
    reservation times out naming that stage, its request and profile, and what the executors offer; the workers'
    stage and nodes are torn down with it (no_leaks)."""
    with pytest.raises(TimeoutError) as info:
        TFCluster.run(sc, show_grant, {}, 3, num_ps=1, env=NODE_ENV, reservation_timeout=30,
                      resources={"ps": {"cpus": 1, "memory": "4g"}, "worker": {"cpus": 1, "memory": "512m"}})
    message = str(info.value)
    assert message.startswith("reservation timed out after 30 s: waiting for ps:0 (pending)"), message
    assert "the stage of ps:0 (asking cpus=1 memory=4g, profile " in message, message
    assert "has not started all its tasks; the executors offer 1 core(s) each" in message, message
    assert "(dynamic allocation on)" in message, message
