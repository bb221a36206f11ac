"""The driver of a large cluster (issue 47).  The panel: beyond GROUP_ABOVE nodes a row per role and state, the
chief and the nodes worth a look listed below, most severe first -- so what the front-end gets stays small and
readable at 512 nodes; the group's numbers are the nodes' own (counts, the lowest/median/highest step, medians).
The work that grew with the cluster: listeners and waiters woken at every heartbeat, the pending partitions
recomputed at every hand-out of an epoch's thousands."""

from __future__ import annotations

import json
import random
import statistics

from tests.panel_fakes import cluster, node
from tfos_nb.widgets import panel_html, panel_model, text_line
from tfos_nb.widgets._groups import GROUP_ABOVE, OUTLIERS_SHOWN, SLOW_RATE
from tfos_nb.widgets._view import HEARTBEAT_MISSING_S, state_key


def nodes_of(n: int, seed: int = 0, special=None):
    """A chief and ``n - 1`` workers, running, steps and rates spread as a real run's; ``special``: index -> fields."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        fields = dict(index=i, job_name="chief" if i == 0 else "worker", task_index=0 if i == 0 else i - 1,
                      step=rng.randint(450, 520), steps_per_sec=rng.uniform(7.5, 8.5),
                      metrics={"loss": rng.uniform(0.2, 0.4), "accuracy": rng.uniform(0.85, 0.95)},
                      time_shares={"input": 0.1, "compute": 0.8, "peers": 0.05, "other": 0.05},
                      time_sentence="compute 80%")
        fields.update((special or {}).get(i, {}))
        out.append(node(fields.pop("state", "running"), **fields))
    return tuple(out)


def test_512_nodes_are_grouped_by_role_and_state_and_the_nodes_worth_a_look_listed_most_severe_first():
    special = {
        5: {"steps_per_sec": 8.0 * SLOW_RATE * 0.5},  # slow
        7: {"state": "failed", "error": "RuntimeError: boom", "tail": ("Traceback", "RuntimeError: boom")},
        9: {"stall": "worker:8: no step for 25 s, training"},
        11: {"last_heartbeat_age": HEARTBEAT_MISSING_S + 3},
    }
    views = nodes_of(512, special=special)
    model = panel_model(cluster(*views))
    json.dumps(model)

    groups = {(g["role"], g["state"]): g for g in model["groups"]}
    assert sum(g["nodes"] for g in model["groups"]) == 512
    assert set(groups) == {("chief", "running"), ("worker", "running"), ("worker", "failed")}
    workers = [v for v in views[1:] if v.state == "running"]
    g = groups[("worker", "running")]
    steps = [v.step for v in workers]
    assert g["nodes"] == 510
    assert g["step"] == f"{min(steps)}–{max(steps)} (median {statistics.median(steps):g})"
    assert g["steps/s"] == f"{statistics.median(v.steps_per_sec for v in workers):.1f}"
    assert g["metrics"] == f"loss {statistics.median(v.metrics['loss'] for v in workers):.4g} " \
                           f"accuracy {statistics.median(v.metrics['accuracy'] for v in workers):.4g}"
    assert g["missing"] == 1 and g["time"] == "compute 80% (mean)"

    listed = [(r["node"], r["why"]) for r in model["rows"]]
    assert listed[0] == ("chief:0", "chief")
    assert [who for who, _ in listed[1:]] == ["worker:6", "worker:8", "worker:10", "worker:4"]  # failed, stalled, silent, slow
    assert listed[4][1].startswith("slow: 2.0 steps/s, worker median 8.0")
    assert model["outliers_hidden"] == 0

    html = panel_html(model)
    # a push's worth: at two a second, under 50 kB/s to the front-end (a row a node made 0.5 MB)
    assert len(html.encode()) < 25_000, len(html.encode())
    assert "512 nodes, grouped by role and state. Below: chief:0, and 4 nodes worth a look (failed, stalled" in html
    assert "RuntimeError: boom" in html and "no step for 25 s" in html
    text = text_line(model)
    assert "worker running ×510 step" in text and "worker:4 running" in text and "[slow: 2.0 steps/s" in text


def test_beyond_the_listed_nodes_the_rest_are_counted():
    failed = {i: {"state": "failed", "error": f"E{i}"} for i in range(1, 41)}
    model = panel_model(cluster(*nodes_of(100, special=failed)))
    assert len(model["rows"]) == OUTLIERS_SHOWN and model["rows"][0]["node"] == "chief:0"
    assert model["outliers_hidden"] == 40 - (OUTLIERS_SHOWN - 1)
    assert f"and {model['outliers_hidden']} more nodes worth a look" in panel_html(model)
    assert f"and {model['outliers_hidden']} more nodes worth a look" in text_line(model)


def test_up_to_group_above_nodes_each_has_its_row_and_one_more_groups_them():
    assert [r["node"] for r in panel_model(cluster(*nodes_of(GROUP_ABOVE)))["rows"]][-1] == f"worker:{GROUP_ABOVE - 2}"
    model = panel_model(cluster(*nodes_of(GROUP_ABOVE + 1)))
    assert [r["node"] for r in model["rows"]] == ["chief:0"] and "groups" in model
    assert "Below: chief:0; no node is failed, stalled, silent or slow." in panel_html(model)


def test_the_text_renderer_prints_a_line_when_a_group_changes_not_at_every_step():
    before = panel_model(cluster(*nodes_of(64)))
    moved = panel_model(cluster(*nodes_of(64, seed=1)))  # every node's step and rate changed
    failed = panel_model(cluster(*nodes_of(64, special={3: {"state": "failed", "error": "E"}})))
    assert state_key(before) == state_key(moved)
    assert state_key(before) != state_key(failed)


def test_listeners_hear_a_burst_of_heartbeats_a_few_times_a_change_of_the_clusters_state_at_once_and_the_rest_at_the_tick():
    """512 nodes heartbeating are 1,000 changes a second; each listener call is a snapshot of every node (the
    panels', the handle's).  Before, every change was told."""
    from tfos_nb.runtime.driver.control import state as cluster_state

    st = cluster_state.ClusterState("c1", "digits", [("chief", 0)] + [("worker", i) for i in range(3)])
    heard: list[str] = []
    st.add_listener(lambda s: heard.append(s.state))
    st.notify()
    for _ in range(1000):  # a burst, well inside one LISTEN_INTERVAL_S
        st.notify()
    assert heard == ["reserving"]  # the first change told, the burst held back
    st.state = cluster_state.C_RUNNING
    st.notify()  # the cluster's own state changed: told at once
    assert heard == ["reserving", "running"]
    st.notify()
    st.tell_held()  # the control server's tick: what was held back is told
    assert heard == ["reserving", "running", "running"]
    st.tell_held()  # nothing held: nothing told
    assert len(heard) == 3


def test_a_polling_panel_makes_a_snapshot_only_when_the_renderer_would_look_at_it():
    from tests.panel_fakes import FakeClock
    from tfos_nb.widgets import make_renderer

    clock = FakeClock()
    renderer = make_renderer("text", write=lambda line: None, clock=clock)
    assert renderer.due()
    renderer.update(cluster(*nodes_of(4)))
    assert not renderer.due()  # the blocking cell's loop polls every 0.1 s: no snapshot until the interval passed
    clock.t += renderer.interval
    assert renderer.due()
    renderer.update(cluster(*nodes_of(4)))  # the same model: not pushed, but looked at
    assert not renderer.due()
    renderer.finish(cluster(*nodes_of(4), state="finished"))
    assert not renderer.due()


def test_a_waiter_that_reads_every_node_looks_at_most_every_look_every_s_however_often_the_nodes_change():
    """shutdown(), a reservation and a feed's end wait on the state; before, each heartbeat (1,000 a second from
    512 nodes) woke them to read or copy every node."""
    import threading
    import time

    from tfos_nb.runtime.driver.control import state as cluster_state

    st = cluster_state.ClusterState("c1", "digits", [("chief", 0)] + [("worker", i) for i in range(511)])
    done = threading.Event()

    def heartbeats() -> None:  # the load: a change every half millisecond, as a control server's thread makes them
        pace = threading.Event()  # never set: its timeout paces the load, it synchronises nothing
        for _ in range(1_000):
            pace.wait(0.0005)
            st.notify()
        done.set()

    looks, looked = 0, 0.0
    beating = threading.Thread(target=heartbeats)
    t0 = time.monotonic()
    beating.start()
    while not done.is_set():
        looks += 1  # the waiter reads every node here
        looked = st.wait_a_change(0.2, looked)
    elapsed = time.monotonic() - t0
    beating.join()
    assert looks <= elapsed / cluster_state.LOOK_EVERY_S + 2, (looks, elapsed)


def test_handing_out_an_epochs_partitions_does_not_recount_the_pending_ones_each_time():
    """The stall lines' pending partitions were recomputed from every partition of the epoch at each hand-out:
    O(partitions²) an epoch (8,000 partitions: 450 µs an assignment, 2,000: 206).  They are counted when a
    snapshot asks."""
    from tfos_nb.runtime.driver.control.controller import new_cluster
    from tfos_nb.runtime.driver.feeding.shares import EpochShares
    from tfos_nb.runtime.driver.options import JobOptions
    from tfos_nb.runtime.protocol import messages

    n, partitions = 4, 400
    ctl = new_cluster([("chief", 0)] + [("worker", i) for i in range(n - 1)], {},
                      JobOptions(name="x", num_gpus=0, heartbeat_timeout=600), input_mode_spark=True,
                      tensorboard=False, log_dir=None)
    for i in range(n):
        assert ctl.handle(messages.Register(node=i, host="127.0.0.1", port=4000 + i, executor_id=str(i), pid=1)).ok
    for i in range(n):
        assert ctl.handle(messages.AwaitSpec(node=i)).ok
        assert ctl.handle(messages.Heartbeat(node=i, state="running", data_port=5000 + i)).ok
    epoch = ctl.open_epoch(remaining=0)
    ctl.set_feed_tasks(epoch, partitions)
    counted = []
    real = EpochShares.pending

    def pending(shares, after):
        counted.append(after)
        return real(shares, after)

    import unittest.mock

    with unittest.mock.patch.object(EpochShares, "pending", pending):
        for p in range(partitions):
            reply = ctl.handle(messages.FeedAssign(partition=p, gen=epoch, host="127.0.0.1", executor_id=str(p % n),
                                                   mode="train"))
            assert reply.ok, reply.error
            if p == partitions // 2:
                assert ctl.state.feed_pending == tuple(range(p + 1, partitions))  # as a snapshot reads it
        assert len(counted) == 1  # that one read, not one a hand-out
    assert ctl.state.feed_pending == ()
