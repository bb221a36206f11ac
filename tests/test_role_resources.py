"""Resources per role (``resources=``): each group of nodes in a stage of its own Spark ResourceProfile.

Real Spark (``local-cluster``) with GPUs faked the way Spark's own tests do: a discovery script that hands each
worker the next two addresses, so every executor holds GPUs no other one has.
"""

from __future__ import annotations

import json
import os
import sys

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, spark_session
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DISCOVER = """#!/bin/sh
# each caller gets the next pair of addresses: 0,1 then 2,3 ...
exec 9>>"{dir}/lock"
flock 9
n=$(cat "{dir}/count" 2>/dev/null || echo 0)
echo $((n+1)) > "{dir}/count"
echo "{{\\"name\\":\\"gpu\\",\\"addresses\\":[\\"$((2*n))\\",\\"$((2*n+1))\\"]}}"
"""


def gpu_conf(tmp_dir) -> dict[str, str]:
    script = tmp_dir / "discover.sh"
    script.write_text(DISCOVER.format(dir=tmp_dir))
    script.chmod(0o755)
    return {
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": str(script),
        "spark.executor.resource.gpu.amount": "1",
        "spark.executor.resource.gpu.discoveryScript": str(script),
    }


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    spark = spark_session(3, conf=gpu_conf(tmp_path_factory.mktemp("gpu")))
    yield spark.sparkContext
    spark.stop()


def show_grant(args, ctx):
    print("GRANT " + json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "resources": ctx.resources,
                                 "gpus": [g["index"] for g in ctx.gpus]}))


def grants(cluster) -> dict[str, dict]:
    out = {}
    for label, lines in cluster.logs(tail=None).items():
        (line,) = [x for x in lines if x.startswith("GRANT ")]
        out[label] = json.loads(line[len("GRANT "):])
    return out


def test_ps_on_cpu_and_workers_on_gpus_with_task_profiles(sc, no_leaks):
    """1 ps + 2 workers: the ps task holds no GPU (CUDA_VISIBLE_DEVICES empty), each worker one of its own, and
    the panel's node views show what each task got, with the stage's profile."""
    cluster = TFCluster.run(sc, show_grant, {}, 3, num_ps=1, env={**NODE_ENV, "PATH": "/usr/bin:/bin"},
                            resources={"ps": {"cpus": 1}, "worker": {"cpus": 1, "gpus": 1}})
    views = {n.label: n for n in cluster.nodes}
    cluster.shutdown(timeout=60)
    seen = grants(cluster)
    assert seen["ps:0"] == {"visible": "", "resources": {}, "gpus": []}, seen
    workers = [seen["worker:0"], seen["worker:1"]]
    addresses = [w["resources"]["gpu"] for w in workers]
    assert all(len(a) == 1 for a in addresses) and addresses[0] != addresses[1], seen
    for w in workers:
        assert w["visible"] == w["resources"]["gpu"][0] == w["gpus"][0], w
    ps_grant, w_grant = views["ps:0"].grant, views["worker:0"].grant
    assert ps_grant.cpus == 1 and ps_grant.resources == () and ps_grant.profile_id is not None
    assert w_grant.resources == (("gpu", tuple(seen["worker:0"]["resources"]["gpu"])),)
    assert w_grant.profile_id is not None and w_grant.profile_id != ps_grant.profile_id
    assert views["worker:1"].grant.profile_id == w_grant.profile_id
    assert f"gpu {seen['worker:0']['resources']['gpu'][0]}" in w_grant.text()


def executor_profiles(sc) -> dict[str, int]:
    """Spark's own record: each live executor's ResourceProfile id (the status store the Spark UI reads)."""
    summaries = sc._jsc.sc().statusStore().executorList(True)
    out = {}
    for i in range(summaries.size()):
        e = summaries.apply(i)
        if e.id() != "driver":
            out[e.id()] = int(e.resourceProfileId())
    return out


def test_with_dynamic_allocation_each_role_gets_executors_of_its_profile(tmp_path_factory, no_leaks):
    """Dynamic allocation on (shuffle tracking, no executor at the start): the launch stages bring executors of
    the ps's and of the workers' profiles; each node runs on one of its own profile (no barrier stage: Spark
    cannot combine one with dynamic allocation; the reservation joins the nodes)."""
    conf = {**gpu_conf(tmp_path_factory.mktemp("gpu-dyn")),
            "spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.initialExecutors": "0", "spark.dynamicAllocation.minExecutors": "0"}
    spark = spark_session(3, conf=conf)
    try:
        sc = spark.sparkContext
        cluster = TFCluster.run(sc, show_grant, {}, 3, num_ps=1, env={**NODE_ENV, "PATH": "/usr/bin:/bin"},
                                resources={"ps": {"cpus": 1, "memory": "512m"},
                                           "worker": {"cpus": 1, "gpus": 1, "memory": "512m"}})
        views = {n.label: n for n in cluster.nodes}
        profiles = executor_profiles(sc)
        cluster.shutdown(timeout=60)
        seen = grants(cluster)
    finally:
        spark.stop()
    ps, w0, w1 = views["ps:0"], views["worker:0"], views["worker:1"]
    assert ps.grant.profile_id != w0.grant.profile_id == w1.grant.profile_id, views
    assert {profiles[v.executor_id] for v in (ps, w0, w1)} == {ps.grant.profile_id, w0.grant.profile_id}, profiles
    assert profiles[ps.executor_id] == ps.grant.profile_id and profiles[w0.executor_id] == w0.grant.profile_id
    assert seen["ps:0"]["visible"] == "" and seen["worker:0"]["resources"]["gpu"] != seen["worker:1"]["resources"]["gpu"]


@pytest.mark.parametrize(("resources", "message"), [
    ({"worker": {"fpga": 1}},
     "worker asks fpga=1, but the executors have no fpga (spark.executor.resource.fpga.amount is not set): start "
     "Spark with it and a discovery script (spark.executor.resource.fpga.discoveryScript), or drop fpga= from worker"),
    ({"worker": {"gpus": 2}},
     "worker asks gpus=2 per task, but each executor has 1 (spark.executor.resource.gpu.amount): ask at most that"),
    ({"ps": {"cpus": 2}},
     "ps asks 2 cpus per task, but each executor has 1 core(s) (spark.executor.cores): ask at most that, or start "
     "executors with more cores"),
    ({"ps": {"memory": "2g"}},
     "ps asks executor memory (memory=2g), which only new executors can have: turn on dynamic allocation "
     "(spark.dynamicAllocation.enabled=true with spark.dynamicAllocation.shuffleTracking.enabled=true), or drop "
     "memory=/memory_overhead="),
    ({"evaluator": {"cpus": 1}},
     "resources name evaluator, but this cluster has no evaluator node: drop evaluator from resources="),
])
def test_what_the_cluster_cannot_give_is_one_sentence_before_any_spark_job(sc, resources, message):
    jobs = spark_jobs(sc)
    with pytest.raises(ValueError) as info:
        TFCluster.run(sc, show_grant, {}, 3, num_ps=1, resources=resources)
    assert str(info.value) == message
    assert spark_jobs(sc) == jobs


def spark_jobs(sc) -> int:
    """How many jobs the application ran, whatever their group (Spark's status store)."""
    return int(sc._jsc.sc().statusStore().jobsList(None).size())



def test_the_doctor_names_what_the_cluster_cannot_give(sc):
    from tfos_nb import doctor

    report = doctor(sc, nodes=3, resources="ps: cpus=1; worker: gpus=1 fpga=1")
    (fail,) = [c for c in report.checks if c.area == "resources"]
    assert fail.status == "FAIL" and fail.detail == (
        "worker asks fpga=1, but the executors have no fpga (spark.executor.resource.fpga.amount is not set)")
    assert fail.fix.startswith("start Spark with it and a discovery script (spark.executor.resource.fpga.")
    good = doctor(sc, nodes=3, resources="ps: cpus=1; worker: gpus=1")
    assert [(c.status, c.detail) for c in good.checks if c.area == "resources"] == [
        ("OK", "resources per role (ps: cpus=1; worker: gpus=1): the configuration can give them")]
