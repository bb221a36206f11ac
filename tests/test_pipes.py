"""The pipe protocol between an executor's processes (launch task, supervisor, node/run process)."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

from tfos_nb.runtime.protocol import pipes

EXAMPLES = [
    pipes.Ready(data_port=4321),
    pipes.Ready(),
    pipes.Report(report={"step": 5, "total_steps": 10, "metrics": {"loss": 0.5}, "time": 1.5},
                 batch=[{"step": 4, "time": 1.0, "metrics": {"loss": 0.6}}]),
    pipes.Failed(error="ValueError: bad input"),
    pipes.Finished(value={"acc": [1, 2]}),
    pipes.Finished(),
    pipes.FeedClosed(),
    pipes.FeedDropped(gen=2, partition=5, rows=1200),
    pipes.FeedPast(epoch=4, rows=960),
    pipes.FeedOpened(name="validation"),
    pipes.Phase(phase="building the strategy", moved_at=1700000000.5, stacks=True),
    pipes.EpochDone(epoch=3),
    pipes.EpochAssigned(epoch=3, partitions=2),
    pipes.FeedPlan(first=4, last=6),
    pipes.FeedPlan(first=1, last=3, sample={"id": 2, "schema": "ff00", "shapes": [[8], []]}),
    pipes.FeedSets(feeds={"validation": {"version": 3, "parts": None, "passes": 1, "sample": {}}}),
    pipes.FeedSets(feeds={"validation": {"version": 3, "parts": [0, 2], "passes": 1, "sample": {"schema": "ff00"}}}),
    pipes.Stop(),
    pipes.Launch(meta={"cluster_id": "c1", "node": 2, "roles": [["chief", 0]]}),
    pipes.Launched(ok=True, pid=12, host="10.0.0.1", port=2222),
    pipes.Launched(ok=False, error="RuntimeError: refused"),
    pipes.Start(info={"index": 0, "gpus": []}),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: type(msg).__name__)
def test_every_message_round_trips_as_one_versioned_json_line(msg):
    frame = pipes.encode(msg)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    wire = json.loads(frame)
    assert wire["v"] == pipes.VERSION and wire["t"] == msg.kind
    assert pipes.decode(frame) == msg


def test_every_kind_has_an_example():
    assert {type(msg) for msg in EXAMPLES} == set(pipes.KINDS.values())


def test_a_report_stands_flat_on_the_wire():
    frame = pipes.encode(pipes.Report(report={"step": 1, "metrics": {}}, batch=[{"step": 1}]))
    assert json.loads(frame) == {"v": pipes.VERSION, "t": "report", "step": 1, "metrics": {}, "batch": [{"step": 1}]}


def test_numpy_values_are_written_as_plain_json():
    frame = pipes.encode(pipes.Finished(value={"acc": np.float32(0.5), "cm": np.eye(2, dtype=np.int64)}))
    assert pipes.decode(frame) == pipes.Finished(value={"acc": 0.5, "cm": [[1, 0], [0, 1]]})


def test_another_version_is_refused_saying_both_versions():
    frame = json.dumps({"v": pipes.VERSION + 1, "t": "ready"})
    with pytest.raises(pipes.PipeProtocolError, match=rf"version {pipes.VERSION + 1}; this side speaks {pipes.VERSION}"):
        pipes.decode(frame)
    with pytest.raises(pipes.PipeProtocolError, match="version None"):
        pipes.decode(json.dumps({"t": "ready"}))


def test_an_unknown_kind_is_a_clear_error():
    with pytest.raises(pipes.PipeProtocolError, match=r"unknown pipe message kind 'rocket' \(known: .*ready"):
        pipes.decode(json.dumps({"v": pipes.VERSION, "t": "rocket"}))


@pytest.mark.parametrize(("line", "match"), [
    (b"not json", "not a JSON frame"),
    (b"[1, 2]", "JSON object, not list"),
    (json.dumps({"v": pipes.VERSION, "t": "epoch_done", "gen": 1}).encode(), "bad fields for 'epoch_done'"),
])
def test_malformed_frames_are_refused(line, match):
    with pytest.raises(pipes.PipeProtocolError, match=match):
        pipes.decode(line)


def test_blob_then_start_then_commands_share_one_stream():
    blob = bytes(range(256)) * 1000 + b"\n\n"  # binary, newlines included
    stream = io.BytesIO()
    pipes.write_blob(stream, blob)
    pipes.write(stream, pipes.Start(info={"index": 1}))
    pipes.write(stream, pipes.Stop())
    stream.seek(0)
    assert pipes.read_blob(stream) == blob
    assert pipes.read(stream, pipes.Start) == pipes.Start(info={"index": 1})
    with pytest.raises(pipes.PipeProtocolError, match="expected 'start', got 'stop'"):
        pipes.read(stream, pipes.Start)
    with pytest.raises(EOFError):
        pipes.read(stream)


def test_a_truncated_blob_or_a_frame_for_a_blob_is_refused():
    stream = io.BytesIO()
    pipes.write_blob(stream, b"x" * 100)
    with pytest.raises(EOFError, match="truncated blob"):
        pipes.read_blob(io.BytesIO(stream.getvalue()[:-1]))
    with pytest.raises(pipes.PipeProtocolError, match="expected a blob frame"):
        pipes.read_blob(io.BytesIO(pipes.encode(pipes.Stop())))


def test_messages_from_a_pipe_skip_bad_frames_and_say_why():
    r, w = os.pipe()
    with os.fdopen(w, "wb") as out:
        out.write(pipes.encode(pipes.Ready(data_port=1)))
        out.write(b'{"v": 1, "t": "rocket"}\n\n')
        out.write(pipes.encode(pipes.Finished(value=2)))
        out.write(pipes.encode(pipes.Finished(value=3))[:-1])  # cut short (its writer was killed): dropped
    bad: list[pipes.PipeProtocolError] = []
    try:
        got = list(pipes.messages(r, bad.append))
    finally:
        os.close(r)
    assert got == [pipes.Ready(data_port=1), pipes.Finished(value=2)]
    assert len(bad) == 1 and "unknown pipe message kind 'rocket'" in str(bad[0])
