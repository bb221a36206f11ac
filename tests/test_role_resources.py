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
from pyspark.sql import SparkSession

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
    # as tests/test_recovery.py's: backups every half second at least, and a lost executor's tasks tried again
    spark = spark_session(3, conf={**gpu_conf(tmp_path_factory.mktemp("gpu")), "spark.task.maxFailures": "4",
                                   "spark.executorEnv.TFOS_NB_BACKUP_MIN_S": "0.5"})
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


def test_a_lost_executor_is_replaced_and_its_node_resumes_with_the_same_profile(sc, tmp_path, no_leaks):
    """``run_job(retries=1)`` with the chief and worker on GPUs: the worker's executor JVM killed inside epoch 2
    (after a backup); Spark starts another executor, attempt 2 launches the same profile there, the node gets a GPU
    again, and every row is trained once per epoch."""
    from tests.test_recovery import BATCH, CI_EPOCHS, PAUSE_S, ROWS, Killer, audit, audit_frame, audit_fun

    out, root = tmp_path / "out", tmp_path / "backups"
    out.mkdir()
    df = audit_frame(SparkSession(sc), skew=False)
    ids = [r.id for r in df.select("id").collect()]
    killer = Killer(sc, str(root), str(out), 1, "worker0", 3)
    seen = []
    args = {"dir": str(out), "rows": ROWS, "batch": BATCH, "epochs": CI_EPOCHS, "pause": PAUSE_S}
    outcome = TFCluster.run_job(sc, audit_fun, args, 2, master_node="chief", data=df, num_epochs=CI_EPOCHS,
                                env=NODE_ENV, retries=1, backup_dir=str(root), resources="worker: cpus=1 gpus=1",
                                on_state=lambda state: seen.append(state))
    killer.join()
    assert killer.error is None, killer.error
    assert outcome.status.state == "finished" and outcome.attempts == 2, outcome
    trial = audit(out, ids, killer, CI_EPOCHS)
    assert (trial["duplicates"], trial["missing"]) == (0, 0), trial
    first, second = (json.loads((out / f"a{a}-worker0.json").read_text())["executor"] for a in (1, 2))
    assert second != first  # the killed executor is gone: attempt 2's worker runs on its replacement
    last = seen[-1].snapshot()
    worker = next(n for n in last.nodes if n.label == "worker:0")
    chief = next(n for n in last.nodes if n.label == "chief:0")
    assert worker.executor_id == second and worker.grant.profile_id == chief.grant.profile_id is not None
    assert len(dict(worker.grant.resources)["gpu"]) == 1


def test_a_setting_reads_the_same_from_a_context_and_from_its_session(sc):
    """The one settings reader takes a SparkContext or a classic SparkSession (a retried job's backups ask the master
    of whatever the user passed: a session read as "" made them think the nodes were on other hosts)."""
    from tfos_nb.runtime.driver.launch.slots import conf_value, session_master

    session = SparkSession(sc)
    assert conf_value(session, "spark.master") == conf_value(sc, "spark.master") == sc.master
    assert session_master(session) == session_master(sc) == sc.master
    assert conf_value(session, "spark.executor.resource.gpu.amount") == "1"
