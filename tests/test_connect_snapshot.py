"""The coordinator's snapshot (``protocol.remote.ClusterSnapshot``) as it travels, applied to the notebook's mirror
(Spark Connect; no Spark here)."""

from __future__ import annotations

import dataclasses
import json

from tfos_nb.runtime.driver.connect import snapshot
from tfos_nb.runtime.driver.control import state as cluster_state
from tfos_nb.runtime.driver.control.controller import Controller
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.protocol import messages, remote

ROLES = [("chief", 0), ("worker", 0)]


def coordinator_state():
    state = cluster_state.ClusterState("c1", "demo", ROLES)
    ctl = Controller(state, JobOptions(num_gpus=0, heartbeat_timeout=10), input_mode_spark=True, tensorboard=False, log_dir=None)
    book = snapshot.LogBook(len(ROLES))
    labels = {n.label: n.index for n in state.nodes}
    state.add_log_listener(lambda label, lines: book.add(labels[label], lines))
    for i in range(len(ROLES)):
        ctl.handle(messages.Register(node=i, host="h", port=1000 + i, executor_id=str(i), pid=10 + i))
    return state, ctl, book


def travel(snap):
    """A snapshot as the notebook gets it: the coordinator's reply body, through JSON, parsed."""
    return remote.ClusterSnapshot.from_dict(json.loads(json.dumps(snap.to_dict())))


def beat(ctl, node, **kw):
    kw.setdefault("state", "running")
    assert ctl.handle(messages.Heartbeat(node=node, **kw)).ok


def coordinator():
    """A coordinator for the demo roles whose server is not started: ``handle()`` is called directly."""
    from tfos_nb.runtime.driver.connect.coordinator import Coordinator

    meta = {"cluster_id": "c1", "secret": "ab" * 16, "roles": [list(r) for r in ROLES],
            "control": ["127.0.0.1", 0], "hb_interval": 0.5, "driver_timeout": 10.0, "env": {}, "keras": "tf_keras",
            "default_fs": "file:///", "driver_pid": 1,
            "coordinator": {"name": "demo", "input_mode_spark": True, "tensorboard": False, "log_dir": None,
                            "num_gpus": 0, "heartbeat_timeout": 10.0, "kernel_timeout": 120.0}}
    return meta, Coordinator(meta)


def test_snapshot_json_round_trip_mirrors_nodes_logs_and_history():
    state, ctl, book = coordinator_state()
    beat(ctl, 0, logs=["a", "b"], report={"step": 3, "metrics": {"loss": 0.5}},
         reports=[{"step": 3, "time": 1.0, "metrics": {"loss": 0.5}}])
    beat(ctl, 1, state="failed", error="ValueError: x", tail=["Traceback", "ValueError: x"], exit_code=1)
    ctl.open_epoch()
    state.nodes[0].grant = cluster_state.Grant(1, (("gpu", ("3",)),), 2)  # what Spark gave its task (resources=)
    mirror_state = cluster_state.ClusterState("c1", "demo", ROLES)
    mirror = snapshot.Mirror(mirror_state)
    got_logs = []
    mirror_state.add_log_listener(lambda label, lines: got_logs.append((label, lines)))

    mirror.apply(travel(snapshot.take(state, book, mirror.logs_seen, mirror.history_seen, ["e"], 1)))
    view, orig = mirror_state.snapshot(), state.snapshot()
    assert view.state == orig.state == cluster_state.C_FAILED and view.error == orig.error
    assert view.feed_epoch == 1 and mirror.feed_errors == ["e"] and mirror.lost_feeds == 1
    for a, b in zip(view.nodes, orig.nodes):
        assert (a.state, a.host, a.port, a.step, a.metrics, a.error, a.tail, a.exit_code, a.grant) == \
               (b.state, b.host, b.port, b.step, b.metrics, b.error, b.tail, b.exit_code, b.grant)
    assert view.nodes[0].grant.text() == "1 cpu · gpu 3 · profile 2"
    assert mirror_state.logs(0) == ["a", "b"] and got_logs == [("chief:0", ["a", "b"])]
    assert mirror_state.history() == state.history()

    # The next snapshot carries only what is new: no line or report twice.
    beat(ctl, 0, logs=["c"], reports=[{"step": 4, "time": 2.0, "metrics": {"loss": 0.4}}])
    mirror.apply(travel(snapshot.take(state, book, mirror.logs_seen, mirror.history_seen, [], 0)))
    assert mirror_state.logs(0) == ["a", "b", "c"]
    assert [h[4] for h in mirror_state.history()] == [3, 4]
    assert mirror.logs_seen == [3, 0] and mirror.history_seen == [2, 0]


def test_snapshot_is_a_protocol_type_parsed_strictly():
    """Both ends use ``remote.ClusterSnapshot``: it survives the wire unchanged, and a snapshot missing a field or
    with one of the wrong type (a node's, a report's, a stream's too) is refused naming that field."""
    import pytest

    state, ctl, book = coordinator_state()
    beat(ctl, 0, logs=["a"], reports=[{"step": 3, "time": 1.0, "metrics": {"loss": 0.5}}])
    snap = snapshot.take(state, book, [0, 0], [0, 0], ["e"], 1, {"1": remote.StreamCounts(rows=3, batches=1)})
    assert travel(snap) == snap and isinstance(snap.nodes[0].reports[0], remote.Report)
    assert snap.nodes[0].logs == ["a"] and snap.nodes[0].reports[0].step == 3
    assert snap.to_dict() == dataclasses.asdict(snap)  # the wire's shallow dict: asdict's, nested bodies and all

    data = json.loads(json.dumps(snap.to_dict()))
    del data["feed_epoch"]
    with pytest.raises(messages.ProtocolError, match="ClusterSnapshot: missing field 'feed_epoch'"):
        remote.ClusterSnapshot.from_dict(data)
    data = json.loads(json.dumps(snap.to_dict()))
    del data["nodes"][1]["port"]
    with pytest.raises(messages.ProtocolError, match=r"ClusterSnapshot.nodes\[1\]: NodeSnapshot: missing field 'port'"):
        remote.ClusterSnapshot.from_dict(data)
    data = json.loads(json.dumps(snap.to_dict()))
    data["nodes"][0]["reports"][0]["step"] = "3"
    with pytest.raises(messages.ProtocolError, match=r"nodes\[0\]: NodeSnapshot.reports\[0\]: Report.step: expected int"):
        remote.ClusterSnapshot.from_dict(data)
    data = json.loads(json.dumps(snap.to_dict()))
    data["streams"]["1"]["rows"] = None
    with pytest.raises(messages.ProtocolError, match=r"ClusterSnapshot.streams\['1'\]: StreamCounts.rows: expected int"):
        remote.ClusterSnapshot.from_dict(data)
    with pytest.raises(messages.ProtocolError, match="ClusterSnapshot: body is not an object"):
        remote.ClusterSnapshot.from_dict(None)


def test_logbook_skips_lines_dropped_meanwhile_and_caps_each_answer():
    book = snapshot.LogBook(1, kept=5)
    book.add(0, [str(i) for i in range(8)])
    assert book.since(0, 0) == (["3", "4", "5", "6", "7"], 8)
    assert book.since(0, 6) == (["6", "7"], 8)
    big = snapshot.LogBook(1)
    big.add(0, ["x"] * (snapshot.MAX_LINES + 5))
    lines, seen = big.since(0, 0)
    assert len(lines) == snapshot.MAX_LINES and big.since(0, seen) == (["x"] * 5, snapshot.MAX_LINES + 5)


def test_remote_messages_are_signed_codec_messages():
    codec = messages.Codec(b"s" * 32, "c1", "notebook")
    server = messages.Codec(b"s" * 32, "c1", "coordinator")
    msg = server.decode(codec.encode(remote.Command(op="open_epoch"))[messages.HEADER.size:])
    assert msg == remote.Command(op="open_epoch")
    snap = server.decode(codec.encode(remote.Snapshot(logs=[1, 2], history=[0, 0]))[messages.HEADER.size:])
    assert isinstance(snap, remote.Snapshot) and snap.logs == [1, 2]


def test_is_connect_tells_connect_sessions_from_classic_ones():
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from tfos_nb.runtime.sessions import is_connect

    assert is_connect(object.__new__(ConnectSession))
    assert not is_connect(object.__new__(SparkSession)) and not is_connect(None)


def test_stream_batch_reports_reach_the_mirror():
    """A training stream's foreachBatch (on the Connect server) reports each micro-batch; the notebook reads it."""
    import pytest

    meta, coord = coordinator()
    stream = messages.Codec(bytes.fromhex(meta["secret"]), "c1", "stream")
    server = messages.Codec(bytes.fromhex(meta["secret"]), "c1", "coordinator")
    sent = [remote.StreamBatch(epoch=1, batch=0, rows=10, partitions=1),
            remote.StreamBatch(epoch=1, batch=1, rows=5, skipped=2, partitions=2),
            remote.StreamBatch(epoch=1, batch=2, error="RuntimeError: feeding partition 0 failed: x")]
    for msg in sent:
        assert coord.handle(server.decode(stream.encode(msg)[messages.HEADER.size:])).ok
    mirror = snapshot.Mirror(cluster_state.ClusterState("c1", "demo", ROLES))
    mirror.apply(remote.ClusterSnapshot.from_dict(json.loads(json.dumps(coord.handle(remote.Snapshot()).body))))
    assert mirror.streams == {"1": remote.StreamCounts(rows=15, skipped=2, partitions=3, batches=2,
                                                       error="RuntimeError: feeding partition 0 failed: x",
                                                       failed_batch=2)}
    bad = stream.encode(remote.StreamBatch(epoch=1, batch=3, rows="many"))[messages.HEADER.size:]  # type: ignore[arg-type]
    with pytest.raises(messages.ProtocolError, match="StreamBatch.rows"):
        server.decode(bad)


def test_stacks_say_why_they_are_not_there_on_spark_connect():
    """The control planes state what they can do (``stacks_available``); on Connect a request for stacks is
    one clear RuntimeError, never a lookup of a method that is not there."""
    import pytest

    from tfos_nb.runtime.driver.connect.job import RemoteController
    from tfos_nb.runtime.driver.control import stacks

    state, ctl, _ = coordinator_state()
    beat(ctl, 0, child_pid=123)
    remote_ctl = RemoteController(state, ctl)
    assert ctl.stacks_available and not remote_ctl.stacks_available
    with pytest.raises(RuntimeError, match="not available on Spark Connect"):
        stacks.collect(state, remote_ctl)
    with pytest.raises(RuntimeError, match="not available on Spark Connect"):
        remote_ctl.request_stacks([0])


def test_each_backend_states_what_it_lacks():
    """What differs on Spark Connect is stated by the backend objects, not asked of the session where it matters:
    no pipelined epochs (an epoch's end is a Spark job), no status tracker (a feeding stage's task count is never
    known), no RDDs, and a training stream's foreachBatch that runs on the server and reports to the coordinator."""
    from tfos_nb.runtime.driver.connect.job import ConnectDriverJob, RemoteController
    from tfos_nb.runtime.driver.connect.spark_jobs import ConnectSparkJob
    from tfos_nb.runtime.driver.job import DriverJob

    state, ctl, _ = coordinator_state()
    assert ctl.pipelines_epochs and not RemoteController(state, ctl).pipelines_epochs
    assert DriverJob.rdds_available and not DriverJob.streams_on_server
    assert not ConnectDriverJob.rdds_available and ConnectDriverJob.streams_on_server
    assert ConnectSparkJob(None, "g", "d", lambda: None).feeding_tasks() is None  # never asks a status tracker


def test_command_replies_are_typed_bodies_parsed_strictly():
    """A Command's reply body is a protocol type the coordinator builds (``EpochOpened``, ``Closed``, ``Done``):
    each survives the wire unchanged, and one missing a field or with one of the wrong type is refused naming
    the field (the notebook read ``int(body["epoch"])`` before: an epoch sent as "3" passed as 3)."""
    import pytest

    _, coord = coordinator()

    def reply(msg, kind):
        out = coord.handle(msg)
        assert out.ok, out.error
        got = kind.from_dict(json.loads(json.dumps(out.body)))
        assert isinstance(got, kind) and kind.from_dict(json.loads(json.dumps(got.to_dict()))) == got
        return got

    assert reply(remote.Command(op="open_epoch"), remote.EpochOpened) == remote.EpochOpened(epoch=1)
    assert reply(remote.Command(op="end_epoch", epoch=1), remote.Done) == remote.Done()
    assert reply(remote.Command(op="open_epoch"), remote.EpochOpened).epoch == 2
    assert reply(remote.Command(op="close"), remote.Closed) == remote.Closed(final=cluster_state.C_STOPPED)
    refused = coord.handle(remote.Command(op="explode"))
    assert not refused.ok and refused.error == "unknown command 'explode'"

    with pytest.raises(messages.ProtocolError, match="EpochOpened: missing field 'epoch'"):
        remote.EpochOpened.from_dict({})
    with pytest.raises(messages.ProtocolError, match="EpochOpened.epoch: expected int, got str"):
        remote.EpochOpened.from_dict({"epoch": "3"})
    with pytest.raises(messages.ProtocolError, match="EpochOpened.epoch: expected int, got bool"):
        remote.EpochOpened.from_dict({"epoch": True})
    with pytest.raises(messages.ProtocolError, match="Closed.final: expected str, got NoneType"):
        remote.Closed.from_dict({"final": None})
    with pytest.raises(messages.ProtocolError, match="Done: body is not an object"):
        remote.Done.from_dict(None)


def test_ask_answers_are_typed_and_refused_naming_the_field():
    """What an asking task returns (``remote.Answer``) is parsed strictly with the request's reply body: through a
    real coordinator server (the task's function run here, without Spark) each request comes back as its type, a
    refusal and an unreachable coordinator as a ``CoordinatorError`` saying which; an answer with a missing or
    ill-typed field is refused naming it (the notebook read ``out.get("ok")`` before: ``"ok": "yes"`` passed)."""
    import re

    import pytest

    from tfos_nb.runtime.driver.connect.spark_jobs import CoordinatorError, _asker, read_answer

    meta, coord = coordinator()
    meta["control"] = list(coord.server.start())
    try:
        def ask(msg, kind):
            return read_answer(_asker(meta, msg, 5.0)(), kind)

        snap = ask(remote.Snapshot(logs=[0, 0], history=[0, 0]), remote.ClusterSnapshot)
        assert isinstance(snap, remote.ClusterSnapshot) and [n.state for n in snap.nodes] == [cluster_state.PENDING] * 2
        assert ask(remote.Command(op="open_epoch"), remote.EpochOpened) == remote.EpochOpened(epoch=1)
        assert ask(remote.Command(op="end_epoch", epoch=1), remote.Done) == remote.Done()
        with pytest.raises(CoordinatorError, match="unknown command 'explode'") as refused:
            ask(remote.Command(op="explode"), remote.Done)
        assert not refused.value.unreachable
        with pytest.raises(messages.ProtocolError, match="Closed: missing field 'final'"):  # the wrong type asked for
            ask(remote.Command(op="request_stop"), remote.Closed)
        assert ask(remote.Command(op="close"), remote.Closed) == remote.Closed(final=cluster_state.C_STOPPED)
    finally:
        coord.server.stop()
    with pytest.raises(CoordinatorError, match="ConnectionRefusedError") as lost:
        ask(remote.Command(op="request_kill"), remote.Done)
    assert lost.value.unreachable

    answer = remote.Answer(ok=True, body={"epoch": 2})
    assert remote.Answer.from_dict(json.loads(json.dumps(answer.to_dict()))) == answer
    assert read_answer(json.dumps(answer.to_dict()), remote.EpochOpened) == remote.EpochOpened(epoch=2)
    for bad, field in [({"body": {}}, "Answer: missing field 'ok'"),
                       ({"ok": "yes", "body": {}}, "Answer.ok: expected bool, got str"),
                       ({"ok": True, "body": None}, "Answer.body: expected dict"),
                       ({"ok": False, "error": 3}, "Answer.error: expected str | None, got int"),
                       ({"ok": False, "error": "x", "unreachable": "no"}, "Answer.unreachable: expected bool"),
                       ({"ok": True, "body": {"epoch": "2"}}, "EpochOpened.epoch: expected int, got str"),
                       ([], "Answer: body is not an object")]:
        with pytest.raises(messages.ProtocolError, match=re.escape(field)):
            read_answer(json.dumps(bad), remote.EpochOpened)


def test_the_mirror_follows_a_full_history_whose_oldest_rows_are_dropped(monkeypatch):
    """A node's history keeps its last rows (state.history_kept); once it is full, the mirror still gets each new
    report once -- before, its count ran past the kept rows and it got none again."""
    monkeypatch.setattr(cluster_state, "HISTORY_KEPT", 5)
    monkeypatch.setattr(cluster_state, "HISTORY_TOTAL", 8)
    monkeypatch.setattr(cluster_state, "HISTORY_MIN", 3)
    state, ctl, book = coordinator_state()
    mirror_state = cluster_state.ClusterState("c1", "demo", ROLES)
    mirror = snapshot.Mirror(mirror_state)
    steps = 0
    for burst in (4, 3, 6, 1):  # the chief's history (5 rows) fills, then drops its oldest, between snapshots
        beat(ctl, 0, reports=[{"step": steps + k, "time": float(steps + k), "metrics": {"loss": 1.0}}
                              for k in range(1, burst + 1)])
        steps += burst
        mirror.apply(travel(snapshot.take(state, book, mirror.logs_seen, mirror.history_seen, [], 0)))
        assert [h[4] for h in mirror_state.history() if h[2] == 0] == list(range(max(1, steps - 4), steps + 1))
    assert mirror.history_seen[0] == steps  # every report the chief sent, counted once
    assert state.nodes[0].history_dropped == steps - 5


def test_a_large_cluster_keeps_the_chiefs_whole_history_and_shares_the_rest():
    roles = [("ps", 0), ("chief", 0)] + [("worker", i) for i in range(510)]
    kept = cluster_state.history_kept(roles)
    assert kept[1] == cluster_state.HISTORY_KEPT  # the chief, wherever it is in the roles
    others = (cluster_state.HISTORY_TOTAL - cluster_state.HISTORY_KEPT) // 511
    assert kept[0] == kept[2] == kept[-1] == others
    assert sum(kept) <= cluster_state.HISTORY_TOTAL
    assert cluster_state.history_kept([("chief", 0), ("worker", 0)]) == [cluster_state.HISTORY_KEPT] * 2  # as before
    assert cluster_state.history_kept([("ps", 0), ("worker", 0)])[1] == cluster_state.HISTORY_KEPT  # TFoS, no chief


def test_the_docs_state_the_history_kept():
    from pathlib import Path

    from tfos_nb.magics._cluster_handle import ClusterHandle

    root = Path(__file__).resolve().parent.parent
    at_512 = cluster_state.history_kept([("chief", 0)] + [("worker", i) for i in range(511)])[1]
    for text in (" ".join(ClusterHandle.history.__doc__.split()), " ".join((root / "docs" / "notebooks.md").read_text().split())):
        assert f"last {cluster_state.HISTORY_KEPT:,} reports" in text
        assert f"share of {cluster_state.HISTORY_TOTAL - cluster_state.HISTORY_KEPT:,} (512 nodes: {at_512} each)" in text
        assert "more than 4 nodes" in text and (cluster_state.HISTORY_TOTAL - cluster_state.HISTORY_KEPT) // 3 == \
            cluster_state.HISTORY_KEPT  # up to 4 nodes every node keeps HISTORY_KEPT
