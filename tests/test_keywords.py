"""``TFCluster.run``'s and ``run_job``'s keywords (``runtime/driver/keywords.py``), fast tier: every keyword either
took before is still taken, typed, and lands in its group; an unknown one is a TypeError naming it; a bad value is
said in the caller's words (the Python API's keyword, a magic's flag)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tfos_nb import TFCluster
from tfos_nb.runtime.driver import keywords
from tfos_nb.runtime.driver.cluster import InputMode
from tfos_nb.runtime.driver.launch import start
from tfos_nb.runtime.driver.options import ClusterShape, JobOptions, RetryPolicy, StartOptions, Training
from tfos_nb.runtime.option_error import OptionError

#: every keyword ``run_job`` took through its ``**kwargs`` before issue 65 (the groups' fields and a hand-kept
#: ``_START`` set), with the group it lands in and the field it sets there
RUN_JOB_BEFORE: dict[str, tuple[str, str]] = {
    **{name: ("options", name) for name in (
        "name", "env", "num_gpus", "keras", "heartbeat_timeout", "notebook_timeout", "node_output", "stall_after",
        "seed", "deterministic", "preflight", "resources", "mlflow", "log_callback", "on_state", "on_start")},
    "num_ps": ("shape", "ps"), "master_node": ("shape", "chief"), "eval_node": ("shape", "evaluator"),
    **{name: ("launch", name) for name in (
        "tensorboard", "input_mode", "log_dir", "driver_ps_nodes", "reservation_timeout", "release_port")},
    **{name: ("training", name) for name in (
        "data", "num_epochs", "feed_timeout", "batch_rows", "validation", "grace_secs", "shutdown_timeout")},
    **{name: ("policy", name) for name in ("retries", "backup_dir", "min_workers", "shrink_after")},
}

#: ``TFCluster.run``'s named parameters before issue 65, in order, with their defaults (TensorFlowOnSpark's, then
#: ``options``); its ``**kwargs`` took ``JobOptions``' fields
RUN_BEFORE = [("sc", None), ("map_fun", None), ("tf_args", None), ("num_executors", None), ("num_ps", 0),
              ("tensorboard", False), ("input_mode", 0), ("log_dir", None), ("driver_ps_nodes", False),
              ("master_node", None), ("reservation_timeout", 600), ("queues", None), ("eval_node", False),
              ("release_port", True), ("options", None)]

#: a value for each keyword, other than its default
SAMPLES: dict[str, object] = {
    "name": "job", "env": {"A": "1"}, "num_gpus": 2, "keras": "keras3", "heartbeat_timeout": 20.0,
    "notebook_timeout": 30.0, "node_output": True, "stall_after": 5.0, "seed": 7, "deterministic": True,
    "preflight": True, "resources": "worker: cpus=1", "mlflow": False, "log_callback": print, "on_state": print,
    "on_start": print, "num_ps": 1, "master_node": "chief", "eval_node": True, "tensorboard": True,
    "input_mode": InputMode.SPARK, "log_dir": "/tmp/logs", "driver_ps_nodes": True, "reservation_timeout": 60,
    "release_port": False, "data": "rows", "num_epochs": 3, "feed_timeout": 60.0, "batch_rows": 64,
    "validation": "val", "grace_secs": 5.0, "shutdown_timeout": 60.0, "retries": 2, "backup_dir": "/tmp/backups",
    "min_workers": 1, "shrink_after": 5.0,
}

GROUPS = {"options": JobOptions, "launch": StartOptions, "training": Training, "policy": RetryPolicy}
SHAPE = {"num_ps": "num_ps", "master_node": "master_node", "eval_node": "eval_node"}


def _expected(name: str) -> object:
    """What keyword ``name`` with its sample sets in its group, as the group alone makes of it (``env``'s values
    as strings, ``resources`` parsed)."""
    group, field = RUN_JOB_BEFORE[name]
    if group == "shape":
        return getattr(ClusterShape.of_tfos(4, **{SHAPE[name]: SAMPLES[name]}), field)
    return getattr(GROUPS[group](**{field: SAMPLES[name]}), field)


def _keys(typed: type) -> set[str]:
    return set(typed.__optional_keys__)  # type: ignore[attr-defined]


def test_run_keeps_its_parameters_and_types_its_keyword_options():
    parameters = list(inspect.signature(TFCluster.run).parameters.values())
    named = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in parameters[:-1]]
    assert named == RUN_BEFORE
    given = parameters[-1]
    assert (given.kind, given.annotation) == (inspect.Parameter.VAR_KEYWORD, "Unpack[OptionKeywords]")
    assert _keys(keywords.OptionKeywords) == {k for k, (group, _) in RUN_JOB_BEFORE.items() if group == "options"}
    assert _keys(keywords.ClusterKeywords) == {name for name, _ in RUN_BEFORE[4:-1]} - {"queues"} | _keys(
        keywords.OptionKeywords)


def test_run_job_takes_every_keyword_it_took_typed():
    parameters = list(inspect.signature(TFCluster.run_job).parameters.values())
    assert [p.name for p in parameters[:-1]] == ["sc", "map_fun", "tf_args", "num_executors", "on_retry", "options"]
    given = parameters[-1]
    assert (given.kind, given.annotation) == (inspect.Parameter.VAR_KEYWORD, "Unpack[JobKeywords]")
    assert _keys(keywords.JobKeywords) == set(RUN_JOB_BEFORE)


@pytest.mark.parametrize("name", sorted(RUN_JOB_BEFORE))
def test_each_run_job_keyword_lands_in_its_group_alone(name):
    plain = keywords.job_groups(4, None, {})
    groups = keywords.job_groups(4, None, {name: SAMPLES[name]})
    group, field = RUN_JOB_BEFORE[name]
    assert getattr(getattr(groups, group), field) == _expected(name)
    moved = {f.name for f in dataclasses.fields(groups) if getattr(groups, f.name) != getattr(plain, f.name)}
    assert moved == ({group, "launch"} if name == "data" else {group})  # data: the driver feeds (input_mode below)


@pytest.mark.parametrize("name", sorted(keywords.ClusterKeywords.__optional_keys__))
def test_each_run_keyword_lands_in_its_group_alone(monkeypatch, name):
    started = []
    monkeypatch.setattr(start, "start_cluster", lambda sc, fn, args, shape, options, launch: started.append(
        {"shape": shape, "options": options, "launch": launch}))
    TFCluster.run(None, print, {}, 4)
    TFCluster.run(None, print, {}, 4, queues=["input", "output"], **{name: SAMPLES[name]})
    (plain, groups) = started
    group, field = RUN_JOB_BEFORE[name]
    assert getattr(groups[group], field) == _expected(name)
    assert {g for g in groups if groups[g] != plain[g]} == {group}


def test_data_feeds_the_nodes_unless_input_mode_says_otherwise():
    assert keywords.job_groups(2, None, {"data": "rows"}).launch.input_mode == InputMode.SPARK
    given = {"data": "rows", "input_mode": InputMode.TENSORFLOW}
    assert keywords.job_groups(2, None, given).launch.input_mode == InputMode.TENSORFLOW
    assert keywords.job_groups(2, JobOptions(seed=3), {"name": "a"}).options == JobOptions(name="a", seed=3)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: TFCluster.run_job(None, print, {}, 2, retrise=1), "unknown option 'retrise'; did you mean 'retries'?"),
    (lambda: TFCluster.run_job(None, print, {}, 2, num_executor=3),
     "unknown option 'num_executor'; the options: backup_dir, batch_rows, data, deterministic, driver_ps_nodes, "),
    (lambda: TFCluster.run(None, print, {}, 2, retries=1), "unknown option 'retries'"),  # run_job's, not run's
    (lambda: TFCluster.run(None, print, {}, 2, data="rows"), "unknown option 'data'"),
    (lambda: TFCluster.run(None, print, {}, 2, tensorbord=True),
     "unknown option 'tensorbord'; did you mean 'tensorboard'?"),
])
def test_an_unknown_keyword_is_a_type_error_naming_it(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(("typed", "group"), [
    (keywords.OptionKeywords, JobOptions), (keywords.StartKeywords, StartOptions), (keywords.TrainingKeywords, Training),
    (keywords.PolicyKeywords, RetryPolicy),
])
def test_the_keywords_mirror_their_groups_fields(typed, group):
    """Each keyword is typed as its field is (``env`` also takes None, as TensorFlowOnSpark's callers give it)."""
    declared = {name: ref.__forward_arg__ for name, ref in typed.__annotations__.items()}  # unevaluated: strings
    fields = {f.name: f.type for f in dataclasses.fields(group)}
    assert list(declared) == list(fields)
    widened = {"env": "Mapping[str, str] | None"}
    assert {n: widened.get(n, t) for n, t in fields.items()} == declared


def test_a_bad_value_is_said_in_the_callers_words():
    flags = {"retries": "--retries", "min_workers": "--min-workers", "deterministic": "--deterministic",
             "trainers": "--workers"}
    with pytest.raises(OptionError) as info:
        RetryPolicy(-2)
    assert str(info.value) == "retries must be a non-negative integer, got -2"
    assert info.value.said(flags) == "--retries must be a non-negative integer, got -2"
    with pytest.raises(OptionError) as info:
        RetryPolicy(1, min_workers=1).check(JobOptions(deterministic=True))
    assert str(info.value).startswith("min_workers=1 cannot go with deterministic=True: ")
    assert info.value.said(flags).startswith("--min-workers 1 cannot go with --deterministic: ")
    with pytest.raises(OptionError) as info:
        ClusterShape(0)
    assert (str(info.value), info.value.said(flags)) == ("chief/worker nodes must be an integer of at least 1, got 0",
                                                         "--workers must be an integer of at least 1, got 0")
    with pytest.raises(OptionError) as info:
        JobOptions(seed=-1)
    assert info.value.said({"seed": "--seed"}) == "--seed must be an integer from 0 to 2**32 - 1, got -1"
