"""The launch meta a Spark task gets: parsed once into ``LaunchMeta`` on the executor side, one default per field.

Every receiver (a node's supervisor, a parallel run's owner, a feeder, the Connect coordinator) reads the
dict the driver put in the task's closure through ``LaunchMeta.parse``: a field the dict lacks takes the
one default declared on ``LaunchMeta``, a required one it lacks is a ``ProtocolError`` naming it, and keys
this version does not know are left out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tfos_nb.runtime.executor.process.run_task import RunOwner
from tfos_nb.runtime.executor.process.supervisor import Supervisor
from tfos_nb.runtime.protocol import messages

REQUIRED = ("cluster_id", "secret", "control", "hb_interval", "driver_timeout", "env", "keras", "default_fs",
            "driver_pid")


def _meta(**changes: Any) -> messages.LaunchMeta:
    meta = messages.LaunchMeta(cluster_id="c1", secret="ab" * 16, control=["127.0.0.1", 9], hb_interval=0.5,
                        driver_timeout=12.0, env={}, keras="tf_keras", default_fs="file:///", driver_pid=1,
                        roles=[["worker", 0]])
    return dataclasses.replace(meta, **changes)


def test_a_missing_optional_field_takes_its_one_default_and_unknown_keys_are_left_out():
    wire = {k: v for k, v in _meta().to_dict().items() if k in REQUIRED}
    wire["a_newer_drivers_key"] = 1
    parsed = messages.LaunchMeta.parse(wire)
    assert parsed == messages.LaunchMeta(**{k: wire[k] for k in REQUIRED})
    assert (parsed.node, parsed.attempt, parsed.executor_id, parsed.working_dir, parsed.task_cpus, parsed.watch_jvm,
            parsed.reservation_timeout, parsed.release_port, parsed.num_gpus) == (None, 0, "", "", None, True,
                                                                                   600.0, True, 1)
    # the closure's dict may hold tuples (roles built on the driver): read as the JSON wire has them
    assert messages.LaunchMeta.parse(dict(wire, roles=[("run", 0), ("run", 1)])).roles == [["run", 0], ["run", 1]]
    assert messages.LaunchMeta.parse(parsed) is parsed


@pytest.mark.parametrize("field", ["driver_timeout", "hb_interval", "secret"])
def test_every_receiver_refuses_a_meta_without_a_required_field(field):
    """Before, each receiver read ``meta.get(...)`` with its own default (driver_timeout: 15 s in the
    supervisor, 10 s in a run's owner and the feeders): a driver that left a field out went unnoticed."""
    wire = _meta(node=0, watch_jvm=False).to_dict()
    del wire[field]
    with pytest.raises(messages.ProtocolError, match=field):
        messages.LaunchMeta.parse(wire)
    with pytest.raises(messages.ProtocolError, match=field):
        RunOwner(wire, 0, 0, [], [])
    with pytest.raises(messages.ProtocolError, match=field):
        Supervisor(wire, b"")


def test_the_supervisor_and_a_runs_owner_read_the_same_fields():
    wire = _meta(node=0, watch_jvm=False, executor_id="7").to_dict()
    run = RunOwner(wire, 0, 0, [], [])
    sup = Supervisor(wire, b"")
    try:
        assert (run.driver_timeout, run.hb_interval) == (sup.driver_timeout, sup.hb_interval) == (12.0, 0.5)
        assert sup.executor_id == "7" and sup.label == "worker:0" and sup.jvm_pid is None
        with pytest.raises(messages.ProtocolError, match="wrong|expected"):
            messages.LaunchMeta.parse(dict(wire, driver_timeout="soon"))
    finally:
        run.client.close()
        sup.client.close()
        if sup.port_socket is not None:
            sup.port_socket.close()


def test_the_coordinator_reads_its_section_strictly():
    """Spark Connect: the ``coordinator`` section the notebook builds sets the coordinator's controller up;
    a setting of the wrong type is refused, naming it (it was coerced, or a KeyError, before)."""
    from tfos_nb.runtime.driver.connect.coordinator import Coordinator

    section = messages.CoordinatorMeta(name="runs", input_mode_spark=False, tensorboard=False, log_dir=None, num_gpus=0,
                                heartbeat_timeout=10.0, kernel_timeout=90.0, kind="parallel")
    coord = Coordinator(_meta(coordinator=section.to_dict()).to_dict())  # its server is not started
    assert coord.runs and coord.kernel_timeout == 90.0 and coord.state.name == "runs"
    assert (coord.controller.num_gpus, coord.controller.heartbeat_timeout) == (0, 10.0)
    with pytest.raises(messages.ProtocolError, match=r"CoordinatorMeta.num_gpus: expected int"):
        Coordinator(_meta(coordinator=dict(section.to_dict(), num_gpus="0")).to_dict())
    with pytest.raises(messages.ProtocolError, match="missing field 'kernel_timeout'"):
        Coordinator(_meta(coordinator={k: v for k, v in section.to_dict().items() if k != "kernel_timeout"}))


def test_a_launch_row_is_parsed_strictly_with_its_coordinator_and_refused_naming_the_field(tmp_path, monkeypatch):
    from tfos_nb.runtime.executor.process.launch import coordinator_status

    row = messages.LaunchStatus(node=1, ok=True, pid=42, host="10.0.0.5", port=7000,
                         coordinator=messages.CoordinatorStarted(ok=True, control=["10.0.0.5", 7100], pid=43))
    assert messages.LaunchStatus.from_dict(row.to_dict()) == row  # the row's JSON on the wire, read back typed
    assert messages.LaunchStatus.from_dict({"node": 0, "ok": False, "error": "boom", "later_key": 1}).error == "boom"
    for bad, named in (({"ok": True}, "missing field 'node'"), ({"node": "1", "ok": True}, "node"),
                       ({"node": 0, "coordinator": {"ok": "yes"}}, "LaunchStatus.coordinator: CoordinatorStarted"),
                       ({"node": 0, "coordinator": []}, "LaunchStatus.coordinator")):
        with pytest.raises(messages.ProtocolError, match=named):
            messages.LaunchStatus.from_dict(bad)
    with pytest.raises(messages.ProtocolError, match=r"expected \[host, port\]"):
        _ = messages.CoordinatorStarted(ok=True, control=["10.0.0.5"]).address
    # a coordinator that cannot start (its meta lacks the coordinator section) is a status, never an exception
    monkeypatch.chdir(tmp_path)
    started = coordinator_status(_meta(cluster_id="c0ffee"))
    assert not started.ok and "the coordinator did not start" in (started.error or "") and started.control == []
