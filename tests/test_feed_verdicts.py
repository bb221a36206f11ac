"""The driver's answers to feeding tasks about nodes that stopped reading, finished or failed."""

from __future__ import annotations

import itertools

from tfos_nb.runtime.driver.control import state
from tfos_nb.runtime.driver.control.controller import Controller
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.protocol import messages


def cluster():
    st = state.ClusterState("c1", "c1", [("chief", 0), ("worker", 0)])
    for i, n in enumerate(st.nodes):
        n.state, n.data_port, n.host = state.RUNNING, 4000 + i, "h"
    ctl = Controller(st, JobOptions(num_gpus=0, heartbeat_timeout=10), input_mode_spark=True, tensorboard=False, log_dir=None)
    return st, ctl


PARTITIONS = itertools.count()


def assign(ctl, mode="train"):
    """A new partition's feeding task asks (the same partition asking again is Spark's retry: refused)."""
    return ctl.handle(messages.FeedAssign(partition=next(PARTITIONS), gen=1, host="h", executor_id="", mode=mode))


def check(ctl, node):
    return messages.FeedVerdict.from_dict(ctl.handle(messages.FeedCheck(partition=0, node=node)).body)


def test_a_node_that_terminated_gets_no_more_partitions_and_is_done_for_lost_feeders():
    st, ctl = cluster()
    assert check(ctl, 0) == messages.FeedVerdict("reading")
    ctl.handle(messages.Heartbeat(node=0, state="running", feed={"closed": True}))  # chief:0 called terminate()
    assert check(ctl, 0) == messages.FeedVerdict("done")
    for _ in range(3):
        assert assign(ctl).body["label"] == "worker:0"
    ctl.handle(messages.Heartbeat(node=1, state="finished", exit_code=0))  # worker:0 returned
    assert check(ctl, 1) == messages.FeedVerdict("done")
    # nobody reads: the partition is skipped
    assert messages.FeedAssignment.from_dict(assign(ctl).body) == messages.FeedAssignment(skip=True)
    reply = assign(ctl, "infer")
    assert not reply.ok and "no node is reading" in reply.error  # inference needs answers: an error at once


def test_a_failed_node_is_failed_for_lost_feeders():
    st, ctl = cluster()
    ctl.handle(messages.Heartbeat(node=1, state="failed", error="ValueError: boom", exit_code=1))
    body = check(ctl, 1)
    assert body.verdict == "failed" and "worker:0 failed" in body.error
    assert check(ctl, 0).verdict == "failed"  # the whole cluster is failing
