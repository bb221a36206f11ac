"""A job's options, shape and retry policy, each declared once (``runtime/driver/options.py``), fast tier: what
each refuses, how keyword options reach them, and that the configuration page lists every option with its default."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tfos_nb import TFCluster, TFParallel
from tfos_nb.runtime.driver.options import ClusterShape, JobOptions, RetryPolicy

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_an_unknown_option_names_the_closest_one_before_anything_starts():
    # sc=None: the error comes before any Spark call
    with pytest.raises(TypeError, match="unknown option 'heartbeat_timout'; did you mean 'heartbeat_timeout'"):
        TFCluster.run(None, lambda args, ctx: None, {}, 2, heartbeat_timout=5)
    with pytest.raises(TypeError, match="unknown option 'sed'; did you mean 'seed'"):
        TFCluster.run_job(None, lambda args, ctx: None, {}, 2, sed=1)
    with pytest.raises(TypeError, match="unknown option 'bogus'; the options: deterministic, env"):
        TFParallel.run(None, lambda args, ctx: None, {}, 2, bogus=1)


@pytest.mark.parametrize(("given", "message"), [
    ({"keras": "keras2"}, "keras must be 'tf_keras' or 'keras3', got 'keras2'"),
    ({"heartbeat_timeout": 0}, "heartbeat_timeout must be a positive number of seconds, got 0"),
    ({"heartbeat_timeout": True}, "heartbeat_timeout must be a positive number of seconds, got True"),
    ({"notebook_timeout": -1}, "notebook_timeout must be a positive number of seconds, got -1"),
    ({"stall_after": -1}, "stall_after must be a number of seconds"),
    ({"num_gpus": 1.5}, "num_gpus must be a non-negative integer, got 1.5"),
    ({"seed": -1}, "seed"),
    ({"env": ["A=1"]}, "env must be a mapping"),
])
def test_options_refuse_bad_values_with_the_fix(given, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        JobOptions(**given)
    with pytest.raises(ValueError, match=re.escape(message)):
        TFCluster.run(None, lambda args, ctx: None, {}, 2, **given)


def test_options_given_whole_and_as_keywords_merge_keywords_last():
    base = JobOptions(name="a", env={"X": 1}, seed=3)
    merged = JobOptions.of(base, name="b")
    assert (merged.name, merged.env, merged.seed) == ("b", {"X": "1"}, 3)
    assert JobOptions.of(base) is base
    assert JobOptions(env=None).env == {}  # TFEstimator's env Param unset
    assert merged.with_env({"Y": "2"}).env == {"X": "1", "Y": "2"}
    assert JobOptions(stall_after=0).stall_after is None  # 0: never flag
    assert JobOptions(seed=7, deterministic=True).node_env() == {"TFOS_SEED": "7", "TFOS_DETERMINISTIC": "1"}
    with pytest.raises(TypeError, match="options must be a JobOptions, got dict"):
        JobOptions.of({"name": "x"})  # type: ignore[arg-type]


def test_parallel_runs_refuse_the_options_that_do_not_apply():
    with pytest.raises(ValueError, match="stall_after= does not apply to parallel runs"):
        TFParallel.run(None, lambda args, ctx: None, {}, 2, stall_after=5)
    JobOptions(stall_after=20.0).refuse("parallel runs", "stall_after")  # the default is no request


def test_the_cluster_shape_orders_roles_as_tensorflowonspark():
    shape = ClusterShape.of_tfos(5, num_ps=1, master_node="chief", eval_node=True)
    assert shape == ClusterShape(3, 1, True, "chief") and shape.num_nodes == 5
    assert shape.roles() == [("ps", 0), ("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0)]
    assert ClusterShape.of_tfos(2).roles() == [("worker", 0), ("worker", 1)]
    assert shape.with_trainers(2).roles() == [("ps", 0), ("chief", 0), ("worker", 0), ("evaluator", 0)]
    with pytest.raises(ValueError, match=r"num_executors=2 leaves no chief/worker node \(num_ps=1, eval_node=True\)"):
        ClusterShape.of_tfos(2, 1, eval_node=True)
    with pytest.raises(ValueError, match="num_ps must be a non-negative integer, got -1"):
        ClusterShape.of_tfos(2, -1)
    with pytest.raises(ValueError, match="master_node must be None, 'chief' or 'master', got 'boss'"):
        ClusterShape(1, chief="boss")


def test_the_retry_policy_refuses_what_it_cannot_keep():
    with pytest.raises(ValueError, match="retries must be a non-negative integer, got -1"):
        RetryPolicy(-1)
    with pytest.raises(ValueError, match="min_workers must be a positive integer"):
        RetryPolicy(1, min_workers=0)
    with pytest.raises(ValueError, match="min_workers=1 cannot go with deterministic=True"):
        RetryPolicy(1, min_workers=1).check(JobOptions(deterministic=True))
    with pytest.raises(ValueError, match="min_workers=1 cannot go with deterministic=True"):
        TFCluster.run_job(None, lambda args, ctx: None, {}, 2, retries=1, min_workers=1, deterministic=True)


def _documented_options() -> dict[str, str]:
    text = (DOCS / "reference" / "configuration.md").read_text()
    section = text.split("## Job options", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| `([^`]*)` \|", section, re.M)}


def test_the_configuration_page_lists_every_job_option_with_its_default():
    documented = _documented_options()
    fields = {f.name: f for f in dataclasses.fields(JobOptions)}
    assert list(documented) == list(fields)
    for name, shown in documented.items():
        f = fields[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert shown == repr(default), name


# -- resources per role: checked once, as a mapping or as the magic's string ---------------------------------------
@pytest.mark.parametrize(("given", "message"), [
    ({"wrker": {"cpus": 1}}, "resources: unknown role 'wrker' (did you mean 'worker'?); the roles are chief, worker, "
                             "ps, evaluator, *"),
    ({"worker": {"cpus": 0}}, "resources['worker']['cpus'] must be a positive number, got 0"),
    ({"worker": {"gpus": -1}}, "resources['worker']['gpus'] must be a positive number, got -1"),
    ({"worker": {"gpus": 1.5}}, "resources['worker']['gpus'] must be whole, or a fraction of one up to 0.5 (tasks "
                                "sharing a unit), got 1.5: Spark gives a task no other share"),
    ({"worker": {"cpus": 1.5}}, "resources['worker']['cpus'] must be a whole number, got 1.5"),
    ({"worker": {"memory": "lots"}}, "resources['worker']['memory'] must be a size in Spark's spelling (e.g. 4g, "
                                     "512m), got 'lots'"),
    ({"worker": {"9gpu": 1}}, "resources['worker']['9gpu']: not a resource name (cpus, gpus, memory, "
                              "memory_overhead, or a Spark resource's name)"),
    ({"worker": 1}, "resources['worker'] must map names to amounts, e.g. {'cpus': 1, 'gpus': 1}, got 1"),
    ("worker cpus=1", "resources: 'worker cpus=1' is not 'ROLE: NAME=AMOUNT ...' (e.g. 'worker: cpus=1 gpus=1')"),
    ("worker: gpus", "resources: 'gpus' (for worker) is not NAME=AMOUNT (e.g. gpus=1)"),
])
def test_resources_refuse_bad_input_in_one_sentence(given, message):
    with pytest.raises(ValueError) as info:
        JobOptions(resources=given)
    assert str(info.value) == message


def test_resources_group_the_nodes_by_what_their_role_asks():
    from tfos_nb.runtime.driver.launch.resources import Request

    options = JobOptions(resources="*: cpus=1; ps: memory=2g; worker: gpus=1 fpga=0.25")
    assert options.resources.text() == "*: cpus=1; ps: memory=2g; worker: fpga=0.25 gpus=1"
    assert JobOptions(resources=options.resources.text()).resources == options.resources  # the text parses back
    roles = ClusterShape(3, ps=1, chief="chief").roles()  # ps:0, chief:0, worker:0, worker:1
    worker = Request(cpus=1, amounts=(("fpga", 0.25), ("gpu", 1.0)))
    # the chief asks nothing of its own, so it asks what a worker does; "*" gives every role its cpus
    assert options.resources.groups(roles) == [(Request(cpus=1, memory="2g"), [0]), (worker, [1, 2, 3])]
    assert options.resources.groups(roles, first_node=1) == [(worker, [1, 2, 3])]  # ps nodes on the driver
    assert JobOptions(resources={}).resources is None and JobOptions(resources={"ps": {}}).resources is None


def test_resources_need_a_cluster_manager_and_apply_to_clusters_only():
    from tfos_nb.runtime.driver.launch.resources import Resources, problems

    found = problems(Resources.of({"worker": {"cpus": 1}}), [("worker", 0)], lambda key: None, "local[4]")
    assert found == [("resources= needs a cluster manager, and Spark's local mode (local[4]) has no stage-level "
                      "scheduling", "use local-cluster[N,C,MB], standalone, YARN or Kubernetes, or drop resources=")]
    with pytest.raises(ValueError, match="resources= does not apply to parallel runs"):
        TFParallel.run(None, lambda args, ctx: None, {}, 2, resources={"worker": {"gpus": 1}})


def test_a_jobs_mlflow_params_take_its_options_resources_as_the_magic_spells_them():
    from tfos_nb.runtime.driver.tracking import option_facts

    options = JobOptions(name="digits", seed=3, resources={"worker": {"gpus": 1, "cpus": 2}, "ps": {"cpus": 1}})
    assert option_facts(options) == {"name": "digits", "seed": 3, "deterministic": False,
                                     "resources": "ps: cpus=1; worker: cpus=2 gpus=1"}
    assert option_facts(JobOptions())["resources"] is None
