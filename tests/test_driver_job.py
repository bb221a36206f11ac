"""The driver's control logic with an injected clock: no Spark, no sockets, milliseconds.

Feed-assignment policy, node and cluster state transitions, heartbeat loss,
cancelling a start from another thread, and a teardown that runs once.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from tfos_nb.runtime.driver.control import state
from tfos_nb.runtime.driver.control.controller import Controller
from tfos_nb.runtime.driver.control.roles import trainers_finished
from tfos_nb.runtime.driver.errors import TFClusterError
from tfos_nb.runtime.driver.job import DriverJob, JobCancelled
from tfos_nb.runtime.driver.launch.awaiting import await_running
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.protocol import messages


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(roles=(("chief", 0), ("worker", 0), ("worker", 1)), *, spark=True, clock=None):
    clock = clock or Clock()
    st = state.ClusterState("cid", "t", list(roles), clock=clock)
    ctl = Controller(st, JobOptions(num_gpus=0, heartbeat_timeout=10.0), input_mode_spark=spark, tensorboard=False, log_dir=None)
    return st, ctl, clock


def register_all(ctl, st, executors=None):
    for i, _ in enumerate(st.nodes):
        reply = ctl.handle(messages.Register(node=i, host="h", port=5000 + i, executor_id=(executors or {}).get(i, str(i)),
                                      pid=100 + i))
        assert reply.ok, reply.error


def run_all(ctl, st):
    for i, _ in enumerate(st.nodes):
        assert ctl.handle(messages.Heartbeat(node=i, state="running", data_port=6000 + i)).ok


PARTITIONS = itertools.count()


def assign(ctl, executor_id="", mode="train"):
    """A new partition's feeding task asks (the same partition asking again is Spark's retry: refused)."""
    return ctl.handle(messages.FeedAssign(partition=next(PARTITIONS), gen=1, host="h", executor_id=executor_id, mode=mode))


def test_states_go_pending_registered_starting_running_then_finish():
    st, ctl, _ = make()
    assert [n.state for n in st.nodes] == [state.PENDING] * 3 and st.state == state.C_RESERVING
    assert ctl.handle(messages.Register(node=0, host="h", port=1, executor_id="0", pid=1)).ok
    assert st.nodes[0].state == state.REGISTERED
    assert not ctl.handle(messages.Register(node=0, host="h", port=1, executor_id="0", pid=1)).ok  # twice: refused
    assert not ctl.handle(messages.AwaitSpec(node=0)).ok  # the cluster is not complete yet: retry
    ctl.handle(messages.Register(node=1, host="h", port=2, executor_id="1", pid=2))
    ctl.handle(messages.Register(node=2, host="h", port=3, executor_id="2", pid=3))
    assert [n.state for n in st.nodes] == [state.STARTING] * 3  # every node registered: the cluster formed
    spec = messages.NodeSpec.from_dict(ctl.handle(messages.AwaitSpec(node=1)).body)
    assert spec.tf_config["task"] == {"type": "worker", "index": 0} and spec.feed
    assert spec.cluster_spec["worker"] == ["h:2", "h:3"]
    run_all(ctl, st)
    assert st.state == state.C_RUNNING and all(n.state == state.RUNNING for n in st.nodes)
    ctl.request_stop()
    cmd = messages.BeatCommand.from_dict(ctl.handle(messages.Heartbeat(node=0, state="running")).body)
    assert cmd.stop and not cmd.kill
    for i in range(3):
        ctl.handle(messages.Heartbeat(node=i, state="finished", exit_code=0))
    assert ctl.finish(trainers_finished) == state.C_FINISHED
    assert st.snapshot().state == state.C_FINISHED
    ctl.cancel("late")  # an ended job stays as it ended
    assert st.state == state.C_FINISHED and st.error is None


def test_a_stopped_cluster_with_a_live_node_ends_stopped():
    st, ctl, _ = make(roles=(("chief", 0), ("ps", 0)))
    register_all(ctl, st)
    run_all(ctl, st)
    ctl.handle(messages.Heartbeat(node=0, state="finished", exit_code=0))
    ctl.request_kill()
    assert messages.BeatCommand.from_dict(ctl.handle(messages.Heartbeat(node=1, state="running")).body).kill
    assert ctl.finish(lambda nodes: all(n.state == state.FINISHED for n in nodes)) == state.C_STOPPED
    assert st.nodes[1].state == state.STOPPED  # the ps never finishes: it is stopped
    st2, ctl2, _ = make(roles=(("chief", 0), ("ps", 0)))
    register_all(ctl2, st2)
    run_all(ctl2, st2)
    ctl2.handle(messages.Heartbeat(node=0, state="finished", exit_code=0))
    assert ctl2.finish(trainers_finished) == state.C_FINISHED  # ps nodes are not awaited


def test_feed_assignment_balances_prefers_the_local_node_and_skips_when_nobody_reads():
    st, ctl, _ = make()
    register_all(ctl, st, {0: "e0", 1: "e1", 2: "e2"})
    assert messages.Retry.from_dict(assign(ctl).body) == messages.Retry(0.1)  # registered, not running: ask again
    run_all(ctl, st)
    # all idle and equally used: the node on the feeding task's own executor wins the tie
    first = messages.FeedAssignment.from_dict(assign(ctl, "e1").body)
    assert (first.node, first.label, first.port) == (1, "worker:0", 6001)
    # busy nodes lose: the next two go to the two idle ones, whatever executor asks
    got = {messages.FeedAssignment.from_dict(assign(ctl, "e1").body).node for _ in range(2)}
    assert got == {0, 2}
    # node 2 releases: it is the least busy now
    ctl.handle(messages.FeedRelease(partition=0, gen=1, node=2, rows=10))
    assert messages.FeedAssignment.from_dict(assign(ctl, "e0").body).node == 2
    assert st.nodes[2].rows_fed == 10
    # a node that stopped reading gets nothing more; nobody reading: train skips, inference fails
    for i in range(3):
        ctl.handle(messages.Heartbeat(node=i, state="running", feed={"closed": True}))
    assert messages.FeedAssignment.from_dict(assign(ctl).body).skip
    reply = assign(ctl, mode="infer")
    assert not reply.ok and "no node is reading" in (reply.error or "")


def test_a_lost_connection_is_an_explicit_error_kind():
    st, ctl, _ = make()
    register_all(ctl, st)
    run_all(ctl, st)
    assign(ctl)
    ctl.handle(messages.FeedRelease(partition=0, gen=1, node=0, rows=0, error="OSError: whatever",
                             error_kind=messages.error_kind(BrokenPipeError())))
    assert ctl.lost_feeds == 1
    ctl.handle(messages.FeedRelease(partition=1, gen=1, node=0, rows=0, error="ConnectionResetError: looks lost",
                             error_kind=messages.error_kind(ValueError())))  # the kind decides, not the text
    assert ctl.lost_feeds == 1 and len(ctl.feed_errors) == 2
    assert messages.error_kind(ConnectionResetError()) == messages.ERROR_LOST_CONNECTION
    assert messages.error_kind(TimeoutError()) == messages.ERROR_OTHER


def test_heartbeat_loss_fails_the_node_and_the_cluster_on_the_clock():
    st, ctl, clock = make()
    register_all(ctl, st)
    run_all(ctl, st)
    clock.t += 9.0
    for i in (0, 2):
        ctl.handle(messages.Heartbeat(node=i, state="running"))
    ctl.tick()
    assert st.state == state.C_RUNNING  # 9 s without a beat: still within the 10 s timeout
    assert st.snapshot().nodes[1].last_heartbeat_age == pytest.approx(9.0)
    clock.t += 1.5
    ctl.tick()
    view = st.snapshot()
    assert view.nodes[1].state == state.FAILED and view.nodes[1].error.startswith("no heartbeat for 10 s")
    assert view.nodes[0].state == state.RUNNING and view.state == state.C_FAILED and view.error == "worker:0 lost"
    # everyone else is told to stop at once
    assert messages.BeatCommand.from_dict(ctl.handle(messages.Heartbeat(node=0, state="running")).body).kill


def test_epochs_open_and_end_through_the_controller():
    st, ctl, _ = make()
    assert (ctl.open_epoch(), ctl.open_epoch()) == (1, 2)
    ctl.end_epoch(2)
    ctl.end_epoch(1)  # never goes back
    assert st.snapshot().feed_epoch == 2 and st.epoch_done == 2
    register_all(ctl, st)
    assert messages.BeatCommand.from_dict(ctl.handle(messages.Heartbeat(node=0, state="running")).body).epoch_done == 2


def test_nodes_learn_the_epochs_of_the_running_train_call():
    """train(num_epochs=n) opens each epoch saying how many more it opens: the heartbeats' replies carry the call's
    first and last epoch (a node's read past them while the last is open is out of step); a stream's epoch, none."""
    st, ctl, _ = make()
    register_all(ctl, st)

    def plan():
        return messages.BeatCommand.from_dict(ctl.handle(messages.Heartbeat(node=0, state="running")).body).feed_plan

    assert plan() == []
    assert [ctl.open_epoch(remaining=r) for r in (2, 1, 0)] == [1, 2, 3] and plan() == [1, 3]
    assert ctl.open_epoch(remaining=1) == 4 and plan() == [4, 5]  # a second train() of 2 epochs
    assert ctl.open_epoch(remaining=0) == 5 and plan() == [4, 5]
    assert ctl.open_epoch() == 6 and plan() == []  # a stream's epoch


def test_the_first_feeding_tasks_sample_reaches_each_node_until_it_confirms_it():
    st, ctl, _ = make()
    register_all(ctl, st)
    run_all(ctl, st)

    def beat(node, **feed):
        return messages.BeatCommand.from_dict(ctl.handle(messages.Heartbeat(node=node, state="running", feed=feed)).body)

    ctl.open_epoch(remaining=1)
    assert beat(0).feed_sample == {}  # no feeding task has asked yet
    first = {"schema": "aa", "shapes": [[8], []]}
    ctl.handle(messages.FeedAssign(partition=0, gen=1, host="h", executor_id="1", mode="train", sample=first))
    ctl.handle(messages.FeedAssign(partition=1, gen=1, host="h", executor_id="1", mode="train",
                            sample={"schema": "bb", "shapes": [[9], []]}))
    sample = beat(0).feed_sample
    assert sample["schema"] == "aa" and sample["shapes"] == [[8], []]  # the first one heard of
    assert beat(0, sample=sample["id"]).feed_sample == {}  # confirmed: no longer sent to node 0
    assert beat(1).feed_sample == sample  # node 1 has not confirmed it
    ctl.open_epoch(remaining=0)  # the same train() call: the same sample
    assert beat(0, sample=sample["id"]).feed_sample == {}
    ctl.open_epoch(remaining=0)  # a new call: its data's shape is learnt again
    assert beat(0, sample=sample["id"]).feed_sample == {}


class _PendingSparkJob:
    """A launch job that has not returned (the nodes are still starting)."""

    done = False
    error = None


def test_cancel_from_another_thread_ends_a_start_in_progress():
    st, ctl, _ = make()
    job = DriverJob(None, st, ctl, nodes_outlive_jobs=True, linger_s=0.0, join_s=0.0)
    try:
        errors: list[BaseException] = []

        def starting() -> None:
            try:
                await_running(job, {}, _PendingSparkJob(), timeout=30)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=starting)
        t.start()
        job.cancel("stopped from the panel")
        job.cancel("twice")  # idempotent: the first reason stays
        t.join(5)
        assert not t.is_alive()
        assert isinstance(errors[0], TFClusterError) and str(errors[0]).endswith(" was stopped (stopped from the panel)")
        # the owner's stop is a stop, not a failure: the panel, the handle and MLflow show "stopped"
        assert st.state == state.C_STOPPED and st.error == "stopped (stopped from the panel)" and st.kill_requested
        with pytest.raises(JobCancelled, match="stopped from the panel"):
            job.mark_up()  # a start that gets this far still does not come up
    finally:
        job.close()
    assert job.closed and st.state == state.C_STOPPED  # the teardown keeps it


def test_close_runs_the_teardown_once_whoever_calls_it():
    st, ctl, _ = make()
    calls: list[str] = []
    job = DriverJob(None, st, ctl, nodes_outlive_jobs=True, linger_s=0.0, join_s=0.0,
                    on_teardown=lambda: calls.append(threading.current_thread().name))
    register_all(ctl, st)
    run_all(ctl, st)
    job.mark_up()
    ctl.set_running()
    assert st.state == state.C_RUNNING
    threads = [threading.Thread(target=job.close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    job.close()
    job.cancel("after the end")  # up and closed: nothing more happens
    assert len(calls) == 1 and job.closed
    assert st.state == state.C_STOPPED and all(n.state == state.STOPPED for n in st.nodes) and st.kill_requested


def test_a_newer_protocol_version_is_a_clear_error():
    secret = messages.new_secret()
    a, b = messages.Codec(secret, "cid", "a"), messages.Codec(secret, "cid", "b")
    assert isinstance(b.decode(a.encode(messages.AwaitSpec(node=0))[4:]), messages.AwaitSpec)
    body = a.encode(messages.AwaitSpec(node=0))[4 + messages.MAC_SIZE:].replace(
        f'"v":{messages.PROTOCOL_VERSION}'.encode(), f'"v":{messages.PROTOCOL_VERSION + 1}'.encode())
    with pytest.raises(messages.ProtocolError, match="protocol version mismatch"):
        b.decode(messages.sign(secret, body) + body)
    with pytest.raises(messages.ProtocolError, match="BeatCommand.kill: expected bool"):
        messages.BeatCommand.from_dict({"kill": "yes"})
    meta = messages.LaunchMeta(cluster_id="c", secret="00", control=["h", 1], hb_interval=0.5, driver_timeout=10.0,
                        env={}, keras="tf_keras", default_fs="file:///", driver_pid=1, roles=[["chief", 0]])
    assert messages.LaunchMeta.from_dict(meta.to_dict()) == meta


def test_a_driver_host_this_machine_cannot_bind_is_a_clear_error_never_every_interface():
    """spark.driver.host naming no address of this machine: say so, rather than listen on 0.0.0.0."""
    from pyspark import SparkConf

    from tests.conftest import listening_ports

    class _Context:  # what open_control reads of a SparkContext: its configuration (a real SparkConf)
        def getConf(self) -> SparkConf:
            return SparkConf(loadDefaults=False).set("spark.driver.host", "192.0.2.1")  # TEST-NET-1

    st, ctl, _ = make()
    job = DriverJob(_Context(), st, ctl, nodes_outlive_jobs=True, linger_s=0.0, join_s=0.0)
    before = listening_ports()
    try:
        with pytest.raises(OSError, match=r"cannot listen on 192\.0\.2\.1.*spark\.driver\.host must name an address"):
            job.open_control()
        assert listening_ports() == before  # nothing opened, on no interface
    finally:
        job.close()


def test_a_coordinator_address_its_executor_cannot_bind_is_a_clear_error_never_every_interface(tmp_path):
    """Spark Connect: the coordinator process (real, started as the launch task starts it) fails and says why."""
    from tfos_nb.runtime.executor.process.launch import start_coordinator

    meta = {"cluster_id": "c0ffee", "secret": "00" * 32, "roles": [["chief", 0]], "driver_pid": 0,
            "control": ["127.0.0.1", 0], "hb_interval": 0.5, "driver_timeout": 10.0, "env": {}, "keras": "tf_keras",
            "default_fs": "file:///",
            "coordinator": {"name": "t", "input_mode_spark": False, "tensorboard": False, "log_dir": None, "num_gpus": 0,
                            "heartbeat_timeout": 10.0, "kernel_timeout": 10.0, "bind": "192.0.2.1"}}  # TEST-NET-1
    status, proc = start_coordinator(messages.LaunchMeta.parse(meta), str(tmp_path / "coordinator.log"))
    try:
        assert proc.poll() is not None  # it exited: nothing listens anywhere
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert status["ok"] is False
    assert "cannot listen on 192.0.2.1" in status["error"] and "must be an address of that machine" in status["error"]


def test_a_training_partition_fed_again_by_sparks_retry_stops_the_cluster_naming_it():
    """Spark retried a feeding task whose attempt died mid-partition (its Python worker killed): the retry would
    feed from the partition's first row, training what the node already took twice (25,000 rows trained of 20,000
    in a real run, with 20,000 reported).  It is refused after REFED_GRACE_S (a lost executor's node failure, the
    truer error, comes first), and the cluster fails saying why; a partition asked for once is served."""
    from tfos_nb.runtime.driver.control.feed_desk import REFED_GRACE_S

    st, ctl, clock = make()
    register_all(ctl, st)
    run_all(ctl, st)
    ctl.open_epoch(remaining=0)
    ask = messages.FeedAssign(partition=7, gen=1, host="h", executor_id="", mode="train")
    first = messages.FeedAssignment.from_dict(ctl.handle(ask).body)
    assert ctl.handle(messages.FeedAssign(partition=8, gen=1, host="h", executor_id="", mode="train")).ok
    again = ctl.handle(ask)  # the retry, at once: wait (the node failure of a lost executor would come first)
    assert messages.Retry.from_dict(again.body) == messages.Retry(0.2) and st.state == state.C_RUNNING
    clock.t += REFED_GRACE_S
    refused = ctl.handle(ask)
    assert not refused.ok and st.state == state.C_FAILED
    assert refused.error == st.error
    assert st.error.startswith(f"Spark started the feeding task of partition 7 again after an attempt that was "
                               f"feeding it to {first.label} died")
    assert "would be trained twice" in st.error
    # an inference partition asked again is served as before (its results are Spark's, retried whole)
    st2, ctl2, _ = make()
    register_all(ctl2, st2)
    run_all(ctl2, st2)
    infer = messages.FeedAssign(partition=7, gen=1, host="h", executor_id="", mode="infer")
    assert ctl2.handle(infer).ok and ctl2.handle(infer).ok


def test_a_training_partition_cut_short_stops_the_cluster_after_the_grace_a_streams_does_not():
    """A node saw a training partition's connection break before its end (its feeder died): the cluster fails
    REFED_GRACE_S after the driver hears of it (time for a lost executor's node failure to come first), naming the
    partition, the node and the rows that reached it.  A stream's micro-batch (no train() plan) is left to Spark's
    at-least-once foreachBatch, as before."""
    from tfos_nb.runtime.driver.control.feed_desk import REFED_GRACE_S

    st, ctl, clock = make()
    register_all(ctl, st)
    run_all(ctl, st)

    def beat(node, **feed):
        return ctl.handle(messages.Heartbeat(node=node, state="running", feed=feed))

    stream = ctl.open_epoch()  # a stream's epoch: no plan
    beat(1, dropped=[[stream, 3, 50]])
    clock.t += REFED_GRACE_S
    beat(0)
    assert st.state == state.C_RUNNING
    gen = ctl.open_epoch(remaining=0)
    beat(1, dropped=[[gen, 9, 120], "junk", [gen, "x", 1]])  # malformed items are ignored
    beat(0)
    assert st.state == state.C_RUNNING  # within the grace
    clock.t += REFED_GRACE_S
    beat(0)
    assert st.state == state.C_FAILED
    assert st.error.startswith("the feeding task of partition 9 died after 120 of its rows reached worker:0 (its "
                               "Python worker or task was killed)"), st.error
    # a cluster being stopped (an interrupt, shutdown()) ignores the cuts its own stop makes
    st2, ctl2, clock2 = make()
    register_all(ctl2, st2)
    run_all(ctl2, st2)
    gen2 = ctl2.open_epoch(remaining=0)
    ctl2.request_stop()
    ctl2.handle(messages.Heartbeat(node=1, state="running", feed={"dropped": [[gen2, 0, 5]]}))
    clock2.t += REFED_GRACE_S
    ctl2.handle(messages.Heartbeat(node=1, state="running"))
    assert st2.state != state.C_FAILED
