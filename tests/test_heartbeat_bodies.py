"""The heartbeat's typed bodies (report, reports, feed, phase, stacks): their wire form, strict decoding, and the
controller reading them."""

from __future__ import annotations

import json
import time

import pytest

from tfos_nb.runtime.driver.control.controller import new_cluster
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.executor.process import phases
from tfos_nb.runtime.protocol import messages
from tfos_nb.runtime.protocol.bodies import BeatFeed, BeatPhase, BeatReport, BeatStacks

SECRET = b"s" * 32
TOTALS = {"wall": 10.0, "step": 8.0, "input": 1.0, "cpu": 6.0}

REPORT = BeatReport(step=7, total_steps=100, total_epochs=2, metrics={"loss": 0.5, "epoch": 1}, time=1.5,
                    times=TOTALS, gpus=[{"index": "0", "memory_used": 10}])
FEED = BeatFeed(closed=True, sample=3, dropped=[[2, 9, 120]], past=[3, 40], sets_read=["val"])
PHASE = BeatPhase(phase=phases.TRAINING, still_s=4.0, seen=[phases.STRATEGY], where="fit (cell.py:3)", times=TOTALS)
STACKS = BeatStacks(id=2, text='File "train.py", line 7 in main')


def codec(sender: str = "t") -> messages.Codec:
    return messages.Codec(SECRET, "cid", sender)


def decoded(msg: messages.Message) -> messages.Message:
    return codec("server").decode(codec().encode(msg)[messages.HEADER.size:])


def signed_heartbeat(**body: object) -> bytes:
    env = {"v": messages.PROTOCOL_VERSION, "cid": "cid", "from": "x", "seq": 1, "ts": time.time(),
           "type": "heartbeat", "body": {"node": 0, "state": "running", **body}}
    data = json.dumps(env).encode()
    return messages.sign(SECRET, data) + data


@pytest.mark.parametrize("body", [REPORT, FEED, PHASE, STACKS, BeatReport(), BeatFeed(), BeatPhase(), BeatStacks()])
def test_each_body_round_trips_through_its_dict(body):
    assert type(body).from_dict(json.loads(json.dumps(body.to_dict()))) == body


def test_a_heartbeat_carries_its_bodies_typed_through_the_codec():
    msg = messages.Heartbeat(node=0, state="running", report=REPORT, reports=[REPORT, BeatReport(step=8, time=2.0)],
                             feed=FEED, phase=PHASE, stacks=STACKS)
    got = decoded(msg)
    assert got == msg
    assert isinstance(got, messages.Heartbeat)
    assert isinstance(got.report, BeatReport) and isinstance(got.reports[1], BeatReport)
    assert (type(got.feed), type(got.phase), type(got.stacks)) == (BeatFeed, BeatPhase, BeatStacks)


def test_the_wire_keeps_the_json_keys_and_leaves_out_what_a_beat_does_not_say():
    body = messages.Heartbeat(node=0, state="running", reports=[BeatReport(step=1, time=1.0, metrics={"a": 1})],
                              feed=BeatFeed(closed=True), phase=PHASE, stacks=BeatStacks()).to_dict()
    assert body["feed"] == {"closed": True} and body["stacks"] == {} and body["report"] == {}
    assert body["reports"] == [{"step": 1, "metrics": {"a": 1}, "time": 1.0}]
    assert list(body["phase"]) == ["phase", "still_s", "seen", "where", "times"]
    assert list(REPORT.to_dict()) == ["step", "total_steps", "total_epochs", "metrics", "time", "times", "gpus"]
    assert list(FEED.to_dict()) == ["closed", "sample", "dropped", "past", "sets_read"]
    assert list(STACKS.to_dict()) == ["id", "text"]


def test_a_dict_given_for_a_body_is_read_as_the_wire_would_have_it():
    msg = messages.Heartbeat(node=0, state="running", report={"step": 3, "metrics": {"loss": 0.5}},
                             reports=[{"step": 3, "time": 1}], phase={"phase": phases.TRAINING, "still_s": 2})
    assert msg.report == BeatReport(step=3, metrics={"loss": 0.5})
    assert msg.reports == [BeatReport(step=3, time=1)]
    assert msg.phase == BeatPhase(phase=phases.TRAINING, still_s=2)


@pytest.mark.parametrize(("body", "why"), [
    ({"report": {"step": "3"}}, r"Heartbeat\.report: BeatReport\.step: expected int \| None, got str"),
    ({"report": []}, r"Heartbeat\.report: expected BeatReport, got list"),
    ({"reports": [{"step": 1}, {"time": "now"}]}, r"Heartbeat\.reports\[1\]: BeatReport\.time: expected float \| None"),
    ({"reports": {"step": 1}}, r"Heartbeat\.reports: expected list\[BeatReport\], got dict"),
    ({"report": {"metrics": [1]}}, r"BeatReport\.metrics: expected dict"),
    ({"feed": {"closed": "yes"}}, r"Heartbeat\.feed: BeatFeed\.closed: expected bool, got str"),
    ({"feed": {"sample": True}}, r"BeatFeed\.sample: expected int, got bool"),
    ({"feed": {"past": [3, "40"]}}, r"BeatFeed\.past: expected list\[int\], got list"),
    ({"feed": {"sets_read": ["val", 2]}}, r"BeatFeed\.sets_read: expected list\[str\], got list"),
    ({"phase": {"phase": 3}}, r"Heartbeat\.phase: BeatPhase\.phase: expected str, got int"),
    ({"phase": {"phase": "training", "still_s": True}}, r"BeatPhase\.still_s: expected float \| None, got bool"),
    ({"phase": {"seen": "training"}}, r"BeatPhase\.seen: expected list\[str\], got str"),
    ({"stacks": {"id": "2", "text": ""}}, r"Heartbeat\.stacks: BeatStacks\.id: expected int, got str"),
    ({"stacks": {"id": 2, "text": None}}, r"BeatStacks\.text: expected str, got NoneType"),
])
def test_a_wrongly_typed_field_is_refused_with_one_error_naming_it(body, why):
    with pytest.raises(messages.ProtocolError, match=why):
        codec("server").decode(signed_heartbeat(**body))


def test_the_body_is_read_only_after_the_signature_is_checked():
    data = bytearray(signed_heartbeat(phase={"phase": 3}))
    data[0] ^= 1
    with pytest.raises(messages.ProtocolError, match="bad signature"):
        codec("server").decode(bytes(data))


def test_unknown_keys_of_a_newer_peer_are_ignored_and_malformed_cut_partitions_skipped():
    got = codec("server").decode(signed_heartbeat(
        report={"step": 1, "new": "x"}, feed={"closed": True, "dropped": [[2, 9, 120], "junk", [2, "x", 1], [1, 2]],
                                               "later": 1}))
    assert isinstance(got, messages.Heartbeat)
    assert got.report == BeatReport(step=1)
    assert got.feed == BeatFeed(closed=True, dropped=[[2, 9, 120]])  # one bad item does not lose the others' news


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_controller_reads_the_typed_bodies_into_the_node_the_panel_shows():
    ctl = new_cluster([("chief", 0), ("worker", 0)], {}, JobOptions(name="b", num_gpus=0, heartbeat_timeout=60),
                      input_mode_spark=False, tensorboard=False, log_dir=None)
    ctl.state.clock = ctl.clock = Clock()
    for i in range(2):
        assert ctl.handle(messages.Register(node=i, host="127.0.0.1", port=4000 + i, executor_id=str(i), pid=1)).ok
    for i in range(2):
        assert ctl.handle(messages.AwaitSpec(node=i)).ok
    reply = ctl.handle(messages.Heartbeat(node=0, state="running", report=REPORT, reports=[REPORT], feed=FEED,
                                          phase=PHASE, stacks=STACKS))
    assert reply.ok, reply.error
    node = ctl.state.nodes[0]
    assert (node.step, node.total_steps, node.total_epochs) == (7, 100, 2)
    assert node.metrics == {"loss": 0.5, "epoch": 1} and node.gpus == REPORT.gpus
    assert node.last_report_time == 1.5 and node.history[-1][:3] == (1.5, 7, {"loss": 0.5, "epoch": 1})
    assert node.feed_closed and node.sample_seen == 3
    assert (node.phase, node.where, list(node.phase_log)[-2:]) == (phases.TRAINING, "fit (cell.py:3)",
                                                           [phases.STRATEGY, phases.TRAINING])
    assert node.moved_at == 96.0 and node.stacks == (2, STACKS.text)
    view = ctl.state.snapshot().nodes[0]
    assert view.step == 7 and view.where == "fit (cell.py:3)"
