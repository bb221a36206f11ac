"""The panel through the magic: its wiring in a real IPython shell (a stand-in handle), one real run on
Spark local-cluster, a real kernel whose saved notebook keeps the widget state, the GPUs of the executors."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ipython_with_tfos_nb
from tests.panel_fakes import FakeClock, cluster, node
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.widgets import choose_renderer


# -- the magic's wiring, in a real IPython shell (no Spark: a stand-in handle) ----------------------
@pytest.fixture(scope="module")
def ip():
    return ipython_with_tfos_nb()


class FakeHandle:
    """What ``_cell_panel.follow`` reads of a ClusterHandle: a run that goes reserving → running → finished."""

    name = "digits"
    lines = None
    sc = None
    tensorboard_url = None

    def __init__(self, views, clock: FakeClock) -> None:
        self.views = list(views)
        self.clock = clock
        self.i = -1
        self.done = False

    def join(self, timeout=None) -> bool:
        if self.i >= 0:
            self.clock.t += 0.02  # a new state every 20 ms of the renderer's clock, however busy the machine
        self.i += 1
        self.done = self.i >= len(self.views) - 1
        return self.done

    def status(self):
        return self.views[min(self.i, len(self.views) - 1)]

    final_status = status


def _run_follow(ip, renderer, views, monkeypatch):
    from IPython.core.displaypub import CapturingDisplayPublisher

    import tfos_nb.widgets
    from tfos_nb.magics import _cell_panel

    pub = CapturingDisplayPublisher()
    monkeypatch.setattr(ip, "display_pub", pub)
    clock = FakeClock()
    real_make_renderer = tfos_nb.widgets.make_renderer  # what the magic imports when it needs one
    monkeypatch.setattr(tfos_nb.widgets, "make_renderer", lambda kind, **kw: real_make_renderer(kind, clock=clock, **kw))
    ip.run_line_magic("config", f'TFOSMagics.renderer = "{renderer}"')
    try:
        _cell_panel.follow(ip.magics_manager.registry["TFOSMagics"], FakeHandle(views, clock))
    finally:
        ip.run_line_magic("config", 'TFOSMagics.renderer = "auto"')
    return pub.outputs


RUN = [
    cluster(node("pending"), state="reserving"),
    *[cluster(node(step=i)) for i in range(1, 40)],
    cluster(node("finished", step=40), state="finished"),
]


def test_magic_html_renderer_displays_a_table_updated_in_place(ip, monkeypatch):
    outputs = _run_follow(ip, "html", RUN, monkeypatch)
    assert outputs, "no display"
    first, last = outputs[0], outputs[-1]
    assert not first["update"] and "display_id" in first["transient"]
    assert first["data"]["text/plain"] == "digits: starting"  # shown at once, from the cell's thread
    assert all(o["update"] and o["transient"] == first["transient"] for o in outputs[1:-1])
    assert ">reserving</span>" in outputs[1]["data"]["text/html"]
    # the run took 0.8 s of the renderer's clock: throttled to ≤ 2/s; then the live table emptied and the final one a new output
    assert 4 <= len(outputs) <= 6
    assert outputs[-2]["data"] == {"text/plain": ""} and outputs[-2]["update"]
    assert not last["update"] and not last["transient"]
    assert ">finished</span>" in last["data"]["text/html"] and "40" in last["data"]["text/html"]
    assert last["data"]["text/plain"] == "digits: finished 12.3 s | chief:0 finished step 40"


def test_magic_text_renderer_prints_state_changes(ip, monkeypatch, capsys):
    outputs = _run_follow(ip, "text", RUN, monkeypatch)
    assert outputs == []
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "digits: reserving 12.3 s | chief:0 pending"
    assert lines[-1] == "digits: finished 12.3 s | chief:0 finished step 40"
    assert len(lines) <= 4


def test_magic_auto_in_terminal_ipython_is_text_and_none_is_silent(ip, monkeypatch, capsys):
    assert choose_renderer("auto", ip) == "text"
    assert _run_follow(ip, "none", RUN, monkeypatch) == []
    assert capsys.readouterr().out == ""


def test_magic_widget_renderer_shows_panel_then_one_final_table(ip, monkeypatch, test_comm):
    import ipywidgets

    outputs = _run_follow(ip, "widget", RUN, monkeypatch)
    widget_view = "application/vnd.jupyter.widget-view+json"
    assert widget_view in outputs[0]["data"]
    panel = ipywidgets.widgets.widget._instances[outputs[0]["data"][widget_view]["model_id"]]
    assert ">finished</span>" in panel.children[1].value and panel.children[0].disabled
    # one live output (the widget, updated by comm messages only), emptied at the end; the final table below it
    assert len(outputs) == 3, outputs
    assert outputs[1]["update"] and outputs[1]["data"] == {"text/plain": ""}
    assert outputs[1]["transient"] == outputs[0]["transient"]
    final = outputs[2]
    assert not final["update"] and widget_view not in final["data"] and ">finished</span>" in final["data"]["text/html"]


def test_renderer_trait_values(ip):
    from traitlets import TraitError

    magics = ip.magics_manager.registry["TFOSMagics"]
    for value in ("auto", "widget", "html", "text", "none"):
        magics.renderer = value
    magics.renderer = "auto"
    with pytest.raises(TraitError):
        magics.renderer = "fancy"


def test_background_cell_panel_follows_the_state_and_its_stop_button_stops(ip, monkeypatch, test_comm):
    import ipywidgets
    from IPython.core.displaypub import CapturingDisplayPublisher

    from tfos_nb.magics import ClusterHandle
    from tfos_nb.runtime.driver.control.controller import Controller
    from tfos_nb.runtime.driver.control.state import ClusterState
    from tfos_nb.runtime.driver.options import ClusterShape

    pub = CapturingDisplayPublisher()
    monkeypatch.setattr(ip, "display_pub", pub)
    magics = ip.magics_manager.registry["TFOSMagics"]
    ip.run_line_magic("config", 'TFOSMagics.renderer = "widget"')
    try:
        handle = ClusterHandle("bgpanel", sc=None, fn=None, args=None, shape=ClusterShape(1, chief="chief"),
                               background=True)
        magics._panel_in_background(handle)
        # the panel's output exists before the run starts, made by the cell's own thread; later pushes only update it
        assert len(pub.outputs) == 1 and not pub.outputs[0]["update"]
    finally:
        ip.run_line_magic("config", 'TFOSMagics.renderer = "auto"')
    st = ClusterState("c9", "bgpanel", [("chief", 0)])
    ctl = Controller(st, JobOptions(num_gpus=0, heartbeat_timeout=10), input_mode_spark=False, tensorboard=False, log_dir=None)
    st.add_listener(handle._on_state)  # as runtime.start.run(on_state=...) does
    handle._on_start(ctl)  # as run(on_start=...) does: what the handle cancels a start through (.state, .cancel)
    ctl.set_running()
    widget_view = "application/vnd.jupyter.widget-view+json"
    panel = ipywidgets.widgets.widget._instances[pub.outputs[0]["data"][widget_view]["model_id"]]
    assert ">running</span>" in panel.children[1].value
    assert len(pub.outputs) == 1  # the state change updated the widget, it displayed nothing new
    button = panel.children[0]
    assert not button.disabled  # the cell has returned: clicks reach the kernel
    button.click()
    assert st.state == "stopped" and st.error == "stopped (stopped from the panel)"
    handle._done.set()  # what the handle's thread does at the end of its run
    handle._tell_observers(final=True)
    # the cell is long over: the panel's own output becomes the final table (a new output would land elsewhere)
    assert len(pub.outputs) == 2 and pub.outputs[-1]["update"]
    assert pub.outputs[-1]["transient"] == pub.outputs[0]["transient"]
    assert ">stopped</span>" in pub.outputs[-1]["data"]["text/html"] and widget_view not in pub.outputs[-1]["data"]


# -- one real run: Spark local-cluster, the magic, renderer html --------------------------------
def _run_cell_with_html_panel(ip, monkeypatch, spark, line: str, cell: str):
    """Run ``%%tfos_cluster line`` on ``spark`` (stopped after) with the HTML panel; the captured display outputs."""
    from IPython.core.displaypub import CapturingDisplayPublisher

    ip.user_ns["spark"] = spark
    pub = CapturingDisplayPublisher()
    monkeypatch.setattr(ip, "display_pub", pub)
    ip.run_line_magic("config", 'TFOSMagics.renderer = "html"')
    try:
        ip.run_cell_magic("tfos_cluster", line, cell)
    finally:
        ip.run_line_magic("config", 'TFOSMagics.renderer = "auto"')
        ip.magics_manager.registry["TFOSMagics"].shutdown_all()
        ip.user_ns.pop("spark", None)
        spark.stop()
    return pub


@pytest.mark.slow
def test_real_cluster_run_renders_html_panel_and_snapshot(ip, monkeypatch):

    from tests.conftest import spark_session

    cell = "import time\nfor i in range(1, 31):\n    ctx.report(step=i, total_steps=30, loss=1.0 / i)\n    time.sleep(0.1)\n"
    pub = _run_cell_with_html_panel(ip, monkeypatch, spark_session(1), "--workers 1 --name panel_run", cell)
    html = [o for o in pub.outputs if "text/html" in o["data"]]
    assert html and not html[0]["update"] and all(o["update"] for o in html[1:-1])
    assert not html[-1]["update"]  # the final table: a new output at the end of the cell
    final = html[-1]["data"]
    assert ">finished</span>" in final["text/html"] and "30/30" in final["text/html"]
    assert "chief:0" in final["text/html"]
    done, total = map(int, re.search(r"(\d+)/(\d+) tasks", final["text/html"]).groups())  # Spark job progress
    assert done == total >= 1
    assert final["text/plain"].startswith("panel_run: finished")


# -- a real kernel (nbclient): auto picks the widget; the saved notebook keeps the snapshot --------------
PANEL_CELL = """
from tfos_nb.runtime.driver.control.state import ClusterView, NodeView
from tfos_nb.widgets import choose_renderer, make_renderer
kind = choose_renderer("auto", get_ipython())
print("renderer", kind)
r = make_renderer(kind, interval=0.0, new_final_output=True)
def v(state, step):
    n = NodeView(index=0, job_name="chief", task_index=0, state=state, host="h", step=step, total_steps=3)
    return ClusterView(cluster_id="c", name="nbrun", state=state, started_at=0.0, elapsed=1.0, nodes=(n,))
for s in (1, 2):
    r.update(v("running", s))
r.finish(v("finished", 3))
"""


@pytest.mark.slow
def test_executed_notebook_keeps_widget_state_and_one_final_table(tmp_path):
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    from tests.conftest import KERNEL, end_notebook_kernel, kernel_spec_manager

    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_spec_manager(tmp_path / "kernels"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PANEL_CELL)])
    client = NotebookClient(nb, km=km, timeout=120, store_widget_state=True)
    try:
        client.execute()
    finally:
        end_notebook_kernel(client, km)  # km is ours, not the client's: it does not stop the kernel
    path = tmp_path / "run.ipynb"
    nbformat.write(nb, path)
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    assert outputs[0].text.strip() == "renderer widget"
    kinds = [o.output_type for o in outputs]
    assert kinds == ["stream", "display_data", "display_data"], kinds
    assert outputs[1].data == {"text/plain": ""}  # the live panel's output, emptied at the end
    snapshot = outputs[2].data  # the final table, a new output
    assert ">finished</span>" in snapshot["text/html"] and "3/3" in snapshot["text/html"]
    assert snapshot["text/plain"] == "nbrun: finished 1.0 s | chief:0 finished step 3/3 (100%)"
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    assert any("finished" in str(m["state"].get("value", "")) for m in state.values())


@pytest.mark.slow
def test_real_cluster_panel_shows_gpus_from_nvidia_smi(ip, monkeypatch, tmp_path):
    """Executors whose PATH has an ``nvidia-smi`` (a fake printing known GPUs): the panel shows model and memory."""

    from tests import fake_nvidia_smi
    from tests.conftest import spark_session

    path = fake_nvidia_smi.path_with(fake_nvidia_smi.install(tmp_path / "bin"))
    pub = _run_cell_with_html_panel(ip, monkeypatch, spark_session(1, conf={"spark.executorEnv.PATH": path}),
                                    "--workers 1 --name gpu_run", "ctx.report(step=1, total_steps=1)\n")
    final = [o for o in pub.outputs if "text/html" in o["data"]][-1]["data"]["text/html"]
    # the node's GPU (one per node by default): fake_nvidia_smi.GPUS[0], model and MiB used / total
    assert "<td style=\"padding:1px 6px\">NVIDIA A100-SXM4-80GB (1234/81920 MiB)</td>" in final, final
    assert ">finished</span>" in final and ">CPU<" not in final
    assert ip.user_ns["gpu_run"].nodes  # the handle saw the same node
