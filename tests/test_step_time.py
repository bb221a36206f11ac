"""Where a node's time goes (runtime.step_time): the node's clock, the shares, and what the panel, the text line,
the status and a Spark Connect notebook's mirror show of them.  Pure: no Spark, no TensorFlow; the real cluster's
figures are in tests/test_step_time_spark.py."""

from __future__ import annotations

import math
import threading
import time

import pytest

from tests.test_connect_snapshot import beat, coordinator_state, travel
from tfos_nb.magics import _render
from tfos_nb.runtime import step_time
from tfos_nb.runtime.driver.connect import snapshot
from tfos_nb.runtime.driver.control import state as cluster_state
from tfos_nb.runtime.protocol.bodies import BeatReport
from tfos_nb.widgets import _view


def totals(wall: float, step: float, waited: float, cpu: float) -> dict[str, float]:
    return {"wall": wall, "step": step, "input": waited, "cpu": cpu}


def test_the_clock_counts_steps_and_the_feeds_waits_inside_them_only():
    clock = step_time.StepClock()
    assert clock.totals() is None and not clock.started
    since = time.perf_counter()
    clock.waited(since)  # before training: nothing
    clock.begin()
    wait_from = time.perf_counter()
    deadline = wait_from + 0.05
    while time.perf_counter() < deadline:  # the feed's reader blocked 50 ms inside the step
        pass
    clock.waited(wait_from)
    clock.end()
    between = time.perf_counter()
    deadline = between + 0.03
    while time.perf_counter() < deadline:  # a callback's 30 ms, outside the step
        pass
    clock.waited(between)  # a prefetching reader waiting between steps holds no step up
    got = clock.totals()
    assert got is not None and clock.started
    assert 0.05 <= got["input"] <= got["step"] < got["wall"], got
    assert got["wall"] - got["step"] >= 0.03, got
    assert got["cpu"] > 0, got  # the busy loops ran on this process's CPU (as much as a busy machine gave it)


def test_the_clock_stops_when_training_ends_and_goes_on_without_the_gap_at_the_next_fit():
    clock = step_time.StepClock()
    clock.begin()
    clock.end()
    clock.pause()  # Keras' on_train_end: an export after fit is not training time
    frozen = clock.totals()
    deadline = time.perf_counter() + 0.05
    while time.perf_counter() < deadline:  # the function exports, on this process's CPU
        pass
    assert clock.totals() == frozen
    clock.begin()  # a second fit
    clock.end()
    again = clock.totals()
    assert again is not None and frozen is not None
    assert again["wall"] - frozen["wall"] < 0.04 and again["cpu"] - frozen["cpu"] < 0.04, (frozen, again)


def test_a_step_under_way_counts_up_to_now_and_threads_may_wait_at_once():
    clock = step_time.StepClock()
    clock.begin()
    since = time.perf_counter()
    threads = [threading.Thread(target=clock.waited, args=(since,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = clock.totals()
    assert got is not None and got["step"] > 0 and got["input"] >= 0


@pytest.mark.parametrize(("after", "expected"), [
    # 10 s: 9 in steps, 6 of them waiting for Spark's rows, 2 s of CPU: an input-bound node
    (totals(10, 9, 6, 2), {"input": 0.6, "compute": 0.2, "peers": 0.1, "other": 0.1}),
    # compute-bound: CPU all the step's time (more CPU than time, on several threads: capped)
    (totals(10, 9, 0, 30), {"input": 0.0, "compute": 0.9, "peers": 0.0, "other": 0.1}),
    # a fast node waiting in the collective for a slow one: little CPU, no input wait
    (totals(10, 9.5, 0.1, 1.4), {"input": 0.01, "compute": 0.14, "peers": 0.8, "other": 0.05}),
    # a slow callback: most of the time outside steps
    (totals(10, 2, 0, 2), {"input": 0.0, "compute": 0.2, "peers": 0.0, "other": 0.8}),
])
def test_shares_split_the_wall_time_into_four_that_sum_to_one(after, expected):
    got = step_time.shares(totals(0, 0, 0, 0), after)
    assert got is not None and set(got) == set(step_time.CATEGORIES)
    assert all(math.isclose(got[c], expected[c], abs_tol=1e-9) for c in expected), got
    assert math.isclose(sum(got.values()), 1.0)


def test_shares_need_time_between_and_sentences_name_the_largest():
    assert step_time.shares(totals(5, 1, 0, 1), totals(5, 1, 0, 1)) is None
    assert step_time.sentence({"input": 0.62, "compute": 0.3, "peers": 0.05, "other": 0.03}) == "waits for input 62%"
    assert step_time.sentence({"input": 0.1, "compute": 0.1, "peers": 0.7, "other": 0.1}) == "waits on peers 70%"
    assert step_time.sentence({"input": 0.0, "compute": 0.0, "peers": 0.0, "other": 1.0}) == "outside steps 100%"
    assert step_time.dominant({"input": 0.5, "compute": 0.5}) == ("input", 0.5)  # a tie: the first category


def test_totals_from_the_wire_are_checked():
    assert step_time.valid(totals(1, 1, 0, 1)) == totals(1, 1, 0, 1)
    for bad in (None, [], {"wall": 1}, {**totals(1, 1, 0, 1), "cpu": "x"}, {**totals(1, 1, 0, 1), "step": -1},
                {**totals(1, 1, 0, 1), "input": float("nan")}, {**totals(1, 1, 0, 1), "wall": True}):
        assert step_time.valid(bad) is None, bad


def test_the_window_covers_the_last_seconds_and_starts_again_with_a_new_attempt():
    window = step_time.Window(seconds=5)
    assert window.add(totals(0, 0, 0, 0)) is None
    # 10 s input-bound, then 10 s compute-bound: the window sees only the last 5 s
    window.add(totals(10, 10, 10, 0))
    for t in range(11, 21):
        got = window.add(totals(t, t, 10, t - 10))
    assert got is not None and got["compute"] == pytest.approx(1.0) and got["input"] == 0
    assert window.add(totals(1, 1, 1, 0)) is None  # a retried attempt's clock starts again


def test_the_state_keeps_the_shares_and_the_view_and_panel_show_them():
    st = cluster_state.ClusterState("c1", "demo", [("chief", 0), ("worker", 0)])
    with st.lock:
        st.nodes[0].state = cluster_state.RUNNING
        beats = [{"step": 1, "time": 1.0, "metrics": {"loss": 1.0}, "times": totals(0, 0, 0, 0)},
                 {"step": 9, "time": 11.0, "metrics": {"loss": 0.5}, "times": totals(10, 9, 6, 2)},
                 {"step": 10, "time": 12.0, "metrics": {"loss": 0.4}, "times": {"wall": "x"}}]
        st.record_reports(st.nodes[0], [BeatReport.from_dict(r) for r in beats])
        st.update_progress(st.nodes[0], BeatReport(step=10, metrics={"loss": 0.4}))  # the latest, as the controller does
    node = st.snapshot().nodes[0]
    assert node.time_shares == pytest.approx({"input": 0.6, "compute": 0.2, "peers": 0.1, "other": 0.1})
    assert node.time_sentence == "waits for input 60%"
    assert [h[-1] for h in st.history_with_times()] == [totals(0, 0, 0, 0), totals(10, 9, 6, 2), None]
    assert [h[4] for h in st.history()] == [1, 9, 10]  # history() as before: six fields a row

    model = _view.panel_model(st.snapshot())
    chief, worker = model["rows"]
    assert chief["time"] == "waits for input 60%" and worker["time"] == ""
    html = _view.panel_html(model)
    assert ">time</th>" in html and 'title="input 60%, compute 20%, peers 10%, other 10%"' in html
    assert "waits for input 60%" in html
    assert "chief:0 running step 10 loss 0.4, waits for input 60%" in _view.text_line(model)
    assert _render.node_line(chief_view := st.snapshot().nodes[0]).endswith("loss 0.4, waits for input 60%")  # %tfos_status
    assert "waits" not in _render.node_line(st.snapshot().nodes[1]) and chief_view.time_sentence


def test_the_panel_has_no_time_column_before_any_node_trains():
    st = cluster_state.ClusterState("c1", "demo", [("chief", 0)])
    html = _view.panel_html(_view.panel_model(st.snapshot()))
    assert ">time</th>" not in html
    assert _view.time_bar({}) == ""


def test_a_connect_notebooks_mirror_shows_the_same_shares():
    state, ctl, book = coordinator_state()
    beat(ctl, 0, report={"step": 3, "metrics": {"loss": 0.5}},
         reports=[{"step": 1, "time": 1.0, "metrics": {"loss": 0.9}, "times": totals(0, 0, 0, 0)},
                  {"step": 3, "time": 3.0, "metrics": {"loss": 0.5}, "times": totals(2, 1.8, 0.1, 0.2)}])
    mirror_state = cluster_state.ClusterState("c1", "demo", [("chief", 0), ("worker", 0)])
    snapshot.Mirror(mirror_state).apply(travel(snapshot.take(state, book, [0, 0], [0, 0], [], 0)))
    assert mirror_state.history_with_times() == state.history_with_times()
    mine, theirs = mirror_state.snapshot().nodes[0], state.snapshot().nodes[0]
    assert mine.time_shares == theirs.time_shares and mine.time_sentence == theirs.time_sentence == "waits on peers 75%"


def test_a_step_stuck_on_its_input_shows_from_the_clock_ticks_without_a_report():
    """A node waiting inside a step reports no step; its phase frames (each second) carry its clocks: kept as rows of
    their own once no report is as fresh, so the panel and the history say where that time goes, and a Connect
    notebook's mirror says the same."""
    state, ctl, book = coordinator_state()
    beat(ctl, 0, reports=[{"step": 1, "time": 100.0, "metrics": {"loss": 0.9}, "times": totals(0, 0, 0, 0)},
                          {"step": 50, "time": 105.0, "metrics": {"loss": 0.5}, "times": totals(5, 4, 0, 3.5)}],
         phase={"phase": "training", "still_s": 0, "times": totals(5.05, 4, 0, 3.5)})  # as fresh: no row
    assert state.snapshot().nodes[0].time_sentence == "computes 70%"
    for k in range(1, 6):  # then 5 s inside one step, waiting for rows: no report, a tick a second
        beat(ctl, 0, phase={"phase": "waiting for data", "still_s": k, "times": totals(5 + k, 4 + k, k, 3.5)})
    beat(ctl, 0, phase={"phase": "waiting for data", "still_s": 5, "times": totals(9.5, 8.5, 4.5, 3.5)})  # older
    node = state.snapshot().nodes[0]
    assert node.time_sentence == "waits for input 100%", node.time_shares
    rows = state.history_with_times()
    assert [(r[3], r[4], r[5]) for r in rows[2:]] == [(100.0 + 5 + k, None, {}) for k in range(1, 6)]  # the node's clock
    assert [r[4] for r in state.history()] == [1, 50]  # the reports alone, as before
    mirror_state = cluster_state.ClusterState("c1", "demo", [("chief", 0), ("worker", 0)])
    snapshot.Mirror(mirror_state).apply(travel(snapshot.take(state, book, [0, 0], [0, 0], [], 0)))
    assert mirror_state.snapshot().nodes[0].time_shares == node.time_shares


def test_a_late_report_leaves_the_window_and_a_relaunched_process_starts_it_again():
    window = step_time.Window(seconds=5)
    window.add(totals(0, 0, 0, 0))
    newest = window.add(totals(10, 10, 10, 0))
    assert window.add(totals(9, 9, 9, 0)) is None  # held back behind a newer tick: nothing new
    assert window.add(totals(11, 11, 10, 1)) == step_time.shares(totals(0, 0, 0, 0), totals(11, 11, 10, 1))
    assert newest is not None
    assert window.add(totals(2, 2, 0, 2)) is None  # far older: a new process's clock, the window begins again
    assert window.add(totals(3, 3, 0, 3))["compute"] == pytest.approx(1.0)


def test_each_nodes_shares_over_the_whole_attempt_for_mlflow():
    rows = [("chief", 0, 0, 1.0, 1, {}, None), ("chief", 0, 0, 2.0, 2, {}, totals(0, 0, 0, 0)),
            ("worker", 0, 1, 2.0, 2, {}, totals(0, 0, 0, 0)), ("chief", 0, 0, 3.0, 3, {}, totals(4, 4, 0, 1)),
            ("chief", 0, 0, 4.0, 4, {}, totals(10, 9, 6, 2))]
    got = step_time.per_node(rows)
    assert list(got) == [("chief", 0)]  # the worker has one report: no time between
    assert got[("chief", 0)] == pytest.approx({"input": 0.6, "compute": 0.2, "peers": 0.1, "other": 0.1})


def test_the_latest_report_every_heartbeat_carries_is_kept_once_with_clock_rows_between():
    """A supervisor's heartbeat carries its latest report beside the new ones: a beat with no new report (the
    node in its validation pass, a tick a second) kept that latest report again once a clock row stood last in
    the history -- one step with two identical rows (seen in the quickstart's history: 11 epoch ends for 10)."""
    state, ctl, book = coordinator_state()
    latest = {"step": 7, "time": 100.0, "metrics": {"loss": 0.5}, "times": totals(5, 4, 0, 3.5)}
    beat(ctl, 0, report=latest, reports=[{"step": 6, "time": 99.0, "metrics": {"loss": 0.6}, "times": totals(4, 3, 0, 3)},
                                         latest], phase={"phase": "training", "still_s": 0, "times": totals(5, 4, 0, 3.5)})
    for k in range(1, 4):  # validating: no new report, the same latest one, a clock row each second
        beat(ctl, 0, report=latest, phase={"phase": "training", "still_s": k, "times": totals(5 + k, 4, 0, 3.5 + k)})
    assert [r[4] for r in state.history()] == [6, 7]
    assert [r[4] for r in state.history_with_times()] == [6, 7, None, None, None]
    # a peer that sends only its latest report (a parallel run's task) still has each new one kept, once
    later = {"step": 8, "time": 104.0, "metrics": {"loss": 0.4}}
    beat(ctl, 1, report=later)
    beat(ctl, 1, report=later)
    beat(ctl, 1, report={**later, "step": 9, "time": 105.0})
    assert [(r[2], r[4]) for r in state.history() if r[2] == 1] == [(1, 8), (1, 9)]
