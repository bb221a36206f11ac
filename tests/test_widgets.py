"""The panel: pure state → view functions, the throttled renderer and its back-ends, the magic's wiring.
TensorBoard's link and tab in the panel are ``test_notebook_tensorboard.py``."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from tests.panel_fakes import FakeClock, FakeDisplay, cluster, node
from tfos_nb.widgets import JobProgress, Renderer, choose_renderer, make_renderer, panel_html, panel_model, text_line
from tfos_nb.widgets._renderer import HtmlBackend, TextBackend, WidgetBackend
from tfos_nb.widgets._view import HEARTBEAT_MISSING_S, state_key

NODE_STATES = ["pending", "registered", "starting", "running", "finished", "failed", "stopped"]


# -- pure functions -----------------------------------------------------------------------------
@pytest.mark.parametrize("state", NODE_STATES)
def test_every_node_state_maps_to_a_row(state):
    n = node(
        state,
        step=40 if state != "pending" else None,
        total_steps=300,
        steps_per_sec=12.345,
        metrics={"loss": 0.123456, "accuracy": 0.9, "epoch": 2},
        error="ValueError: boom\nmore",
        tail=("line 1", "Traceback", "ValueError: boom"),
    )
    model = panel_model(cluster(n))
    row = model["rows"][0]
    assert row["node"] == "chief:0" and row["state"] == state
    assert row["host"] == "10.0.0.5" and row["executor"] == "1" and row["device"] == "CPU"
    assert row["step"] == ("" if state == "pending" else "40/300")
    assert row["steps/s"] == "12.3"
    assert row["metrics"] == "epoch 2 loss 0.1235 accuracy 0.9"
    live = state in ("registered", "starting", "running")
    assert row["heartbeat"] == ("0.4 s ago" if live else "")
    assert row["missing_heartbeat"] is False
    if state == "failed":
        assert row["error"] == "ValueError: boom" and row["tail"][-1] == "ValueError: boom"
    else:
        assert row["error"] == "" and row["tail"] == []
    json.dumps(model)  # the model is plain JSON (one trait's worth)


def test_missing_heartbeat_is_flagged_only_for_live_nodes_of_a_live_cluster():
    late = HEARTBEAT_MISSING_S + 2.5
    model = panel_model(cluster(node("running", last_heartbeat_age=late), node("finished", job_name="worker", last_heartbeat_age=late)))
    running, finished = model["rows"]
    assert running["missing_heartbeat"] and running["heartbeat"] == "7.5 s ago (missing heartbeat)"
    assert not finished["missing_heartbeat"] and finished["heartbeat"] == ""
    assert "(missing heartbeat)" in text_line(model)
    assert 'color:#dc322f">7.5 s ago (missing heartbeat)' in panel_html(model)
    ended = panel_model(cluster(node("running", last_heartbeat_age=late), state="stopped"))
    assert not ended["rows"][0]["missing_heartbeat"]


def test_header_gpu_progress_and_tensorboard():
    n = node(device="NVIDIA A100 (1234/81920 MiB)", step=5)
    view = cluster(n, cluster_id="0123abcd", tensorboard="http://10.0.0.5:6006", rows_fed=640)
    model = panel_model(view, JobProgress(done=3, total=4, failed=1))
    assert model["tasks"] == "3/4 tasks, 1 failed"
    # the proxy route, relative to the Jupyter base URL: never the node's own address
    assert model["tensorboard"] == "tfos_nb/tensorboard/0123abcd/" and model["tensorboard_url"] == "http://10.0.0.5:6006"
    html = panel_html(model)
    assert "NVIDIA A100 (1234/81920 MiB)" in html and "10.0.0.5:6006" not in html
    link = re.search(r'<a id="tfos-tbl-0123abcd"[^>]*data-tfos-path="tfos_nb/tensorboard/0123abcd/"[^>]*>TensorBoard ↗</a><script>', html)
    assert link and "href=" not in link.group(0)  # resolved in the browser from the page's base URL
    assert "TensorBoard" not in panel_html(model, tensorboard=False)  # the widget shows its own link and tab
    assert "640 rows fed" in html and "3/4 tasks" in html
    assert text_line(model) == "digits: running 12.3 s, 3/4 tasks, 1 failed | chief:0 running step 5"
    assert panel_model(view)["tasks"] is None


def test_the_resources_column_shows_each_nodes_grant_only_when_a_role_has_a_profile():
    from tfos_nb.runtime.driver.control.state import Grant

    ps = node(job_name="ps", grant=Grant(1, (), 2))
    worker = node(job_name="worker", grant=Grant(1, (("gpu", ("3",)),), 3))
    html = panel_html(panel_model(cluster(ps, worker)))
    assert ">resources</th>" in html
    assert ">1 cpu · profile 2</td>" in html and ">1 cpu · gpu 3 · profile 3</td>" in html
    plain = panel_html(panel_model(cluster(node(), node(job_name="worker", grant=Grant(1, (), None)))))
    assert ">resources</th>" not in plain  # the default profile everywhere: no column


def test_failed_cluster_text_and_html():
    bad = node("failed", job_name="worker", error="worker:0 failed on host h: ValueError: <boom>", tail=("x", "ValueError: <boom>"))
    model = panel_model(cluster(node("stopped"), bad, state="failed", error="worker:0 failed on host h"))
    assert model["final"]
    assert text_line(model) == ("digits: failed 12.3 s | chief:0 stopped | worker:0 failed: worker:0 failed on host h: ValueError: <boom>")
    html = panel_html(model)
    assert "ValueError: &lt;boom&gt;" in html and "<boom>" not in html
    assert "<details><summary>log tail</summary>" in html


def test_html_escapes_everything_user_controlled():
    evil = '<script>alert("x")</script>'
    n = node(host=evil, executor_id=evil, device=evil, metrics={evil: evil}, job_name="w<b>")
    html = panel_html(panel_model(cluster(n, name=evil, tensorboard='" onclick="x')))
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "w&lt;b&gt;:0" in html
    assert "onclick" not in html  # the node's TensorBoard URL is never put in the page
    html = panel_html(panel_model(cluster(n, name=evil, cluster_id="0123abcd", tensorboard='" onclick="x')))
    assert "onclick" not in html and html.count("<script>") == 1  # only the link's own resolver


def test_state_key_ignores_steps_and_time():
    a = panel_model(cluster(node(step=1)))
    b = panel_model(cluster(node(step=99), elapsed=50.0))
    c = panel_model(cluster(node("finished", step=99), state="finished"))
    assert state_key(a) == state_key(b) != state_key(c)


# -- the renderer ----------------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.shown: list[dict] = []
        self.final: list[dict] = []

    def show(self, model):
        self.shown.append(model)

    def finish(self, model):
        self.final.append(model)


def test_renderer_throttles_coalesces_and_always_flushes_the_final_state():
    clock, rec = FakeClock(), Recorder()
    r = Renderer(rec, interval=0.5, clock=clock)
    for i in range(1000):  # one simulated second at 1,000 steps/s
        clock.t = i / 1000
        r.update(cluster(node(step=i)))
    assert len(rec.shown) == 2  # t=0 and t=0.5
    assert rec.shown[-1]["rows"][0]["step"] == "500"  # step 999 waits (coalesced), not pushed before its time
    clock.t = 1.2
    r.update(cluster(node(step=999)))  # the next snapshot after the interval goes out at once
    assert len(rec.shown) == 3 and rec.shown[-1]["rows"][0]["step"] == "999"
    r.update(cluster(node(step=1000)))
    r.finish(cluster(node("finished", step=1000), state="finished"))
    r.finish(cluster(node("failed"), state="failed"))  # idempotent
    r.update(cluster(node(step=5)))  # ignored after the end
    assert len(rec.final) == 1 and rec.final[0]["state"] == "finished"
    assert r.pushes == len(rec.shown) + 1


def test_text_backend_one_line_per_state_change():
    lines: list[str] = []
    clock = FakeClock()
    r = Renderer(TextBackend(lines.append), clock=clock)
    for state, step in [("pending", None), ("running", 1), ("running", 2), ("running", 3), ("finished", 3)]:
        clock.t += 1
        r.update(cluster(node(state, step=step), state="reserving" if state == "pending" else "running"))
    r.finish(cluster(node("finished", step=3), state="finished"))
    assert lines == [
        "digits: reserving 12.3 s | chief:0 pending",
        "digits: running 12.3 s | chief:0 running step 1",
        "digits: running 12.3 s | chief:0 finished step 3",
        "digits: finished 12.3 s | chief:0 finished step 3",
    ]


def test_html_backend_updates_one_display_in_place():
    disp, clock = FakeDisplay(), FakeClock()
    r = Renderer(HtmlBackend(disp), clock=clock)
    r.update(cluster(node(step=1)))
    clock.t = 1
    r.update(cluster(node(step=2)))
    r.finish(cluster(node("finished", step=2), state="finished"))
    assert [c[0] for c in disp.calls] == ["display", "update", "update"]
    assert disp.calls[0][2] == {"raw": True, "display_id": True}
    final = disp.calls[-1][1]
    assert set(final) == {"text/html", "text/plain"} and ">finished</span>" in final["text/html"]


def test_html_backend_final_table_is_a_new_output_for_a_blocking_cell():
    disp, clock = FakeDisplay(), FakeClock()
    r = Renderer(HtmlBackend(disp, new_final_output=True), clock=clock)
    r.start("digits")
    r.update(cluster(node(step=1)))
    r.finish(cluster(node("finished", step=2), state="finished"))
    assert [c[0] for c in disp.calls] == ["display", "update", "update", "display"]
    assert disp.calls[2][1] == {"text/plain": ""}  # the live table emptied ...
    final = disp.calls[3]  # ... and the final one below it: front-ends that drop updates show it too
    assert "display_id" not in final[2] and ">finished</span>" in final[1]["text/html"]
    assert final[1]["text/plain"] == "digits: finished 12.3 s | chief:0 finished step 2"


def test_progress_bar_percentage_and_loss_sparkline():
    n = node(step=30, total_steps=120, curve=(2.0, 1.5, 1.0, 0.8), curve_metric="loss", metrics={"loss": 0.8})
    model = panel_model(cluster(n, node("finished", job_name="worker", step=120, total_steps=120)))
    chief, worker = model["rows"]
    assert chief["progress"] == 0.25 and worker["progress"] == 1.0
    assert chief["curve"] == [2.0, 1.5, 1.0, 0.8] and chief["curve_metric"] == "loss"
    assert text_line(model) == ("digits: running 12.3 s | chief:0 running step 30/120 (25%) loss 0.8 "
                                "| worker:0 finished step 120/120 (100%)")
    html = panel_html(model)
    assert 'title="25%"' in html and "width:25%" in html and "width:100%" in html  # the bars
    svg = re.search(r"<svg [^>]*>.*?</svg>", html).group(0)
    assert "<title>loss 2 → 0.8 (4 points)</title>" in svg
    points = [tuple(map(float, p.split(","))) for p in re.search(r'points="([^"]+)"', svg).group(1).split()]
    assert len(points) == 4 and points[0][1] < points[-1][1]  # falling loss: the line goes down (SVG y grows down)
    assert "<th" in html and ">loss</th>" in html  # the curve column is headed by its metric
    # steps per epoch unknown (a fed dataset), epochs known (Keras' callback): progress by completed epochs
    by_epoch = panel_model(cluster(node(step=88, total_epochs=5, metrics={"epoch": 2, "loss": 0.5})))["rows"][0]
    assert by_epoch["progress"] == 0.4 and by_epoch["step"] == "88" and by_epoch["metrics"] == "epoch 2/5 loss 0.5"
    # no step total: no bar, no percentage; no reported curve: no curve column
    plain = panel_model(cluster(node(step=7)))
    assert plain["rows"][0]["progress"] is None and "%)" not in text_line(plain)
    assert "<svg" not in panel_html(plain) and ">curve</th>" not in panel_html(plain) and 'title="' not in panel_html(plain)


@pytest.mark.parametrize(
    ("setting", "kernel", "expected"),
    [
        ("auto", None, "text"),
        ("auto", "comm", "widget"),
        ("auto", "plain", "html"),
        ("html", None, "html"),
        ("widget", None, "widget"),
        ("text", "comm", "text"),
        ("none", "comm", "none"),
    ],
)
def test_renderer_selection(setting, kernel, expected):
    kernels = {None: None, "comm": type("K", (), {"comm_manager": object()})(), "plain": object()}
    shell = type("Shell", (), {})()
    if kernels[kernel] is not None:
        shell.kernel = kernels[kernel]
    assert choose_renderer(setting, shell) == expected
    with pytest.raises(ValueError, match="renderer must be one of"):
        choose_renderer("fancy", shell)


def test_auto_is_html_without_ipywidgets(monkeypatch):
    from tfos_nb.widgets import _renderer

    monkeypatch.setattr(_renderer, "widgets_available", lambda: False)
    shell = type("Shell", (), {"kernel": type("K", (), {"comm_manager": object()})()})()
    assert choose_renderer("auto", shell) == "html"


def test_widgets_package_never_imports_pyspark_or_ipywidgets_eagerly():
    code = "import sys, tfos_nb.widgets; print(sorted(m for m in ('pyspark', 'ipywidgets', 'IPython') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


# -- the widget through a real ipywidgets comm ---------------------------------------------------------


def test_widget_throttling_bound_at_1000_steps_per_second(test_comm):
    clock, disp = FakeClock(), FakeDisplay()
    test_comm.clock = clock
    r = make_renderer("widget", display=disp, clock=clock, new_final_output=True)
    seconds, rate = 5, 1000
    for i in range(seconds * rate):  # a node reporting 1,000 steps/s, one update per step
        clock.t = i / rate
        r.update(
            cluster(node(step=i, total_steps=seconds * rate, steps_per_sec=float(rate), metrics={"loss": 1 / (i + 1)})),
            JobProgress(i // 1000, 10),
        )
    live = list(test_comm.sent)
    per_second = [sum(1 for t, _ in live if int(t) == s) for s in range(seconds)]
    assert all(n <= 2 for n in per_second), per_second
    assert len(live) == 2 * seconds
    clock.t = seconds
    r.finish(cluster(node("finished", step=seconds * rate, total_steps=seconds * rate), state="finished"))
    final = test_comm.sent[len(live) :]
    assert len(final) == 1  # the table: one message (a blocking cell's Stop button was disabled from the start)
    panel = r.backend.panel
    assert f"{seconds * rate}/{seconds * rate}" in panel.table.value and ">finished</span>" in panel.table.value
    assert panel.stop_button.disabled
    # the panel's output: the widget view plus a line for front-ends without widgets (not "ClusterPanel(…)")
    live = disp.calls[0]
    assert live[2] == {"raw": True, "display_id": True}
    assert live[1]["application/vnd.jupyter.widget-view+json"]["model_id"] == panel.model_id
    assert live[1]["text/plain"].startswith("digits: running (the live panel needs Jupyter widgets")
    # at the end: the panel's output emptied, the final table a new output (HTML + text): one table on screen
    assert [c[0] for c in disp.calls] == ["display", "update", "display"]
    assert disp.calls[1][1] == {"text/plain": ""}
    final = disp.calls[2]
    assert set(final[1]) == {"text/html", "text/plain"} and final[2] == {"raw": True}
    assert ">finished</span>" in final[1]["text/html"] and "finished" in final[1]["text/plain"]


def test_widget_stop_button_calls_the_magics_callback(test_comm):
    stops: list[int] = []
    r = make_renderer("widget", on_stop=lambda: stops.append(1), display=FakeDisplay())
    r.update(cluster(node()))
    button = r.backend.panel.stop_button
    assert not button.disabled
    button.click()
    button.click()  # a second click is ignored
    assert stops == [1] and button.disabled and button.description == "Stopping…"
    blocking = make_renderer("widget", display=FakeDisplay()).backend.panel.stop_button
    assert blocking.disabled and "■" in blocking.tooltip


def test_make_renderer_kinds(test_comm):
    assert make_renderer("none") is None
    assert isinstance(make_renderer("text").backend, TextBackend)
    assert isinstance(make_renderer("html").backend, HtmlBackend)
    with pytest.raises(ValueError):
        make_renderer("auto")
    widget = make_renderer("widget", display=FakeDisplay())  # WidgetBackend: imported lazily by make_renderer
    assert isinstance(widget.backend, WidgetBackend)
    widget.start("digits")
    widget.update(cluster(node(step=7, total_steps=30)))
    table = widget.backend.panel.table.value  # the panel's table shows the view given
    assert "chief:0" in table and ">running</span>" in table and "7/30" in table


def test_dataclass_views_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        node().state = "x"


def test_job_progress_counts_the_job_groups_tasks_and_skips_skipped_stages():
    from types import SimpleNamespace as NS

    from tfos_nb.magics._spark import job_groups, job_progress

    assert job_groups("tfos-c1", 2) == ["tfos-c1-launch", "tfos-c1-feed-1", "tfos-c1-feed-2"]
    assert job_groups("", 3) == []
    jobs = {1: NS(status="SUCCEEDED", stageIds=[10, 11]), 2: NS(status="RUNNING", stageIds=[20, 21])}
    stages = {
        10: NS(numTasks=4, numCompletedTasks=0, numActiveTasks=0, numFailedTasks=0),  # skipped: cached
        11: NS(numTasks=4, numCompletedTasks=4, numActiveTasks=0, numFailedTasks=0),
        20: NS(numTasks=2, numCompletedTasks=1, numActiveTasks=1, numFailedTasks=1),
        21: NS(numTasks=2, numCompletedTasks=0, numActiveTasks=0, numFailedTasks=0),  # pending: counts
    }
    groups = {"g-launch": [1], "g-feed-1": [2]}
    tracker = NS(getJobIdsForGroup=lambda g: groups.get(g, []), getJobInfo=jobs.get, getStageInfo=stages.get)
    sc = NS(statusTracker=lambda: tracker)
    assert job_progress(sc, job_groups("g", 1)) == (5, 8, 1)
    assert job_progress(None, ["g-launch"]) is None
    assert job_progress(NS(statusTracker=lambda: 1 / 0), ["g-launch"]) is None  # a stopping Spark: no numbers


def test_each_validation_value_is_shown_beside_its_metric():
    """Keras' val_* values (fit's validation_data) sit beside loss and accuracy, not cut behind other metrics."""
    n = node("running", step=40, total_steps=300, metrics={"auc": 0.7, "val_auc": 0.6, "accuracy": 0.9, "loss": 0.3,
                                                           "val_accuracy": 0.85, "val_loss": 0.35, "epoch": 2})
    assert panel_model(cluster(n))["rows"][0]["metrics"] == "epoch 2 loss 0.3 val_loss 0.35 accuracy 0.9 val_accuracy 0.85"
