"""TensorBoard as a notebook shows it: the frame on each front-end (Jupyter, a proxy of the user's, Colab,
Databricks, terminal IPython) and why it is empty when it is, the frame's script in a real Chromium, the
panel's link and tab (widget and HTML back-ends), and the cluster's proxy route while its TensorBoard runs.
The proxy itself is ``tests/tbproxy/``; TensorBoard on the chief, ``test_chief_tensorboard.py``.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ipython_with_tfos_nb
from tests.panel_fakes import FakeDisplay, cluster, node
from tfos_nb import tensorboard
from tfos_nb.widgets import make_renderer


# -- TensorBoard's frame on every front-end --------------------------------------------------------------
def test_tensorboard_proxy_url_like_tensorboards_own_magic():
    env = {"TENSORBOARD_PROXY_URL": "/proxy/%PORT%/"}
    assert tensorboard.proxy_url_from_env("http://10.0.0.5:6006", env) == "/proxy/6006/"
    env = {"TENSORBOARD_PROXY_URL": "https://hub.example/user/me/proxy/%HOST%:%PORT%/"}
    assert tensorboard.proxy_url_from_env("http://10.0.0.5:6123", env) == "https://hub.example/user/me/proxy/10.0.0.5:6123/"
    assert tensorboard.proxy_url_from_env("http://10.0.0.5:6006", {}) is None


def test_tensorboard_frontend_detection(monkeypatch):
    import sys
    import types

    kernel_shell = types.SimpleNamespace(kernel=object())
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    assert tensorboard.frontend(None) == "terminal" and tensorboard.frontend(types.SimpleNamespace()) == "terminal"
    assert tensorboard.frontend(kernel_shell) == "jupyter"
    monkeypatch.setenv("TENSORBOARD_PROXY_URL", "/proxy/%PORT%/")
    assert tensorboard.frontend(kernel_shell) == "proxy"
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert tensorboard.frontend(kernel_shell) == "colab"
    frame, text = tensorboard.frontend_output("colab", "tfos_nb/tensorboard/0123abcd/", "http://127.0.0.1:6006")
    assert frame is None and "Colab has no Jupyter server" in text and "`%tensorboard --logdir DIR`" in text
    frame, text = tensorboard.frontend_output("proxy", "tfos_nb/tensorboard/0123abcd/", "http://127.0.0.1:6006")
    assert text == "TensorBoard: /proxy/6006/" and 'var direct = "/proxy/6006/"' in frame


def test_tensorboard_on_databricks_is_a_message_not_a_frame(monkeypatch):
    """A Databricks notebook's page has no Jupyter server behind it: never a frame that cannot load."""
    import types

    kernel_shell = types.SimpleNamespace(kernel=object())
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    assert tensorboard.frontend(kernel_shell) == "jupyter" and tensorboard.hosted_message() is None
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "client.1.13")
    assert tensorboard.frontend(kernel_shell) == "databricks"
    frame, text = tensorboard.frontend_output("databricks", "tfos_nb/tensorboard/0123abcd/", "http://10.0.0.5:6006")
    assert frame is None and text == tensorboard.hosted_message("http://10.0.0.5:6006")
    assert text.startswith("TensorBoard listens at http://10.0.0.5:6006, but a Databricks notebook has no Jupyter server")
    assert "`%tensorboard --logdir DIR`" in text and "/Volumes/" in text
    monkeypatch.setenv("TENSORBOARD_PROXY_URL", "/driver-proxy/o/0/c/%PORT%/")  # a proxy of the user's: frame it
    assert tensorboard.frontend(kernel_shell) == "proxy" and tensorboard.hosted_message() is None


def test_tensorboard_frame_says_why_it_is_empty(monkeypatch):
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    html = tensorboard.embed_html("tfos_nb/tensorboard/0123abcd/", "http://10.0.0.5:6006", height=300)
    note, rest = html.split("</div>", 1)
    # without a script (a front-end that runs none) the note is the URL to open
    assert note.endswith("TensorBoard: &lt;Jupyter base URL&gt;/tfos_nb/tensorboard/0123abcd/ (this front-end ran no "
                         "script: open that URL in the browser)")
    script = rest.split("<script>", 1)[1]
    assert "</" not in script[:-len("</script>")]  # nothing in the values can close the script
    failed = json.loads(script.split("failed = ", 1)[1].split(", deadline", 1)[0])
    assert set(failed) == {"waiting", "starting", "extension", "server", "direct"}
    assert "jupyter server extension enable tfos_nb.tbproxy" in failed["extension"]
    assert "TENSORBOARD_PROXY_URL" in failed["server"] and "http://10.0.0.5:6006" in failed["server"]
    assert "1000 * 20.0" in script  # the deadline
    monkeypatch.setenv("TENSORBOARD_PROXY_URL", "/proxy/%PORT%/")
    proxied = tensorboard.embed_html("tfos_nb/tensorboard/0123abcd/", "http://10.0.0.5:6006")
    assert 'var direct = "/proxy/6006/"' in proxied and "TensorBoard: /proxy/6006/ (this front-end" in proxied
    assert "<div" not in tensorboard.iframe_html("tfos_nb/tensorboard/0123abcd/")  # no deadline asked: no note


def test_tensorboard_in_terminal_ipython_prints_urls(tmp_path, monkeypatch, capsys):
    """Terminal IPython has no page to embed in: %tfos_tensorboard prints the URLs (no HTML display)."""
    import types

    from IPython.core.displaypub import CapturingDisplayPublisher

    ip = ipython_with_tfos_nb()
    capsys.readouterr()  # "already loaded", where an earlier module loaded the extension: not the magic's output
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    pub = CapturingDisplayPublisher()
    monkeypatch.setattr(ip, "display_pub", pub)
    magics = ip.magics_manager.registry["TFOSMagics"]
    observers = []
    running = types.SimpleNamespace(  # what the magic reads of a running --tensorboard cluster's handle
        done=False, tensorboard_url="http://10.0.0.5:6006", status=lambda: types.SimpleNamespace(cluster_id="0123abcd"),
        add_observer=observers.append)
    monkeypatch.setitem(magics.handles, "tbterm", running)
    try:
        ip.run_line_magic("tfos_tensorboard", "tbterm")
    finally:
        tensorboard.withdraw("0123abcd")
    out = capsys.readouterr().out
    assert out == ("TensorBoard: http://10.0.0.5:6006 (through a Jupyter server with the tfos_nb extension: "
                   "<Jupyter base URL>/tfos_nb/tensorboard/0123abcd/)\n")
    assert pub.outputs == [] and len(observers) == 1  # nothing displayed; the route is withdrawn with the cluster


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.slow
@pytest.mark.parametrize("served", ["nothing", "extension", "tensorboard"])
def test_tensorboard_frame_in_a_real_browser(served, tmp_path):
    """The frame's script in headless Chromium: why the frame is empty, or the frame once the route answers."""
    import functools
    import os
    import re
    import subprocess
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (scripts/setup_env.sh does it as root)")
    path = "tfos_nb/tensorboard/0123abcd/"
    (tmp_path / "page.html").write_text(
        "<html><body>" + tensorboard.iframe_html(path, height=200, deadline=2, node_url="http://10.9.9.9:6006") + "</body></html>")
    if served != "nothing":  # the extension's status route answers
        (tmp_path / "tfos_nb" / "tensorboard").mkdir(parents=True)
        (tmp_path / "tfos_nb" / "tensorboard" / "index.html").write_text("{}")
    if served == "tensorboard":
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "index.html").write_text("<p>TensorBoard</p>")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=10000", "--dump-dom", base + "page.html"],
            capture_output=True, text=True, timeout=120,
        ).stdout
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    note = re.search(r'<div id="tfos-tb-[0-9a-f]+-note" style="([^"]*)">(.*?)</div>', dom, re.S)
    frame = re.search(r'<iframe id="tfos-tb-[0-9a-f]+"[^>]*>', dom).group(0)
    assert note, dom[:2000]
    if served == "tensorboard":
        assert f'src="{base}{path}"' in frame and "display: none" in note.group(1)
        return
    assert "src=" not in frame  # still no frame: the note says why
    text = note.group(2).replace("&amp;", "&")
    if served == "nothing":
        assert text.startswith(f"TensorBoard's route {base}{path} does not exist on this Jupyter server: its tfos_nb "
                               "extension is not enabled. Run `jupyter server extension enable tfos_nb.tbproxy`"), text
    else:
        assert text.startswith(f"TensorBoard does not answer yet at {base}{path}: the Jupyter server's tfos_nb "
                               "extension is there"), text
    assert "http://10.9.9.9:6006" in text


# -- TensorBoard in the panel: link + tab through the proxy route -------------------------------------
def test_widget_panel_tensorboard_link_and_tab(test_comm):
    import ipywidgets

    r = make_renderer("widget", display=FakeDisplay(), interval=0.0)
    panel = r.backend.panel
    r.update(cluster(node(step=1), cluster_id="0123abcd"))
    assert panel.children == (panel.stop_button, panel.table)  # no TensorBoard: no tab
    tb = dict(cluster_id="0123abcd", tensorboard="http://10.9.9.9:6006")
    r.update(cluster(node(step=2), **tb))
    header, tabs = panel.children
    assert isinstance(tabs, ipywidgets.Tab) and tabs.titles == ("Nodes", "TensorBoard") and tabs.children[0] is panel.table
    assert header.children == (panel.stop_button, panel.tensorboard_link)
    (link,) = panel.tensorboard_link.outputs
    assert re.search(r'<a id="tfos-tbl-0123abcd"[^>]*data-tfos-path="tfos_nb/tensorboard/0123abcd/"', link["data"]["text/html"])
    (frame,) = tabs.children[1].outputs
    assert '<iframe id="tfos-tb-' in frame["data"]["text/html"] and "jupyter-config-data" in frame["data"]["text/html"]
    assert 'data-tfos-path="tfos_nb/tensorboard/0123abcd/"' in frame["data"]["text/html"]
    assert "10.9.9.9" not in frame["data"]["text/html"] + link["data"]["text/html"] + panel.table.value
    # later pushes leave the frame alone (no TensorBoard reload every half second)
    sent = len(test_comm.sent)
    r.update(cluster(node(step=3), **tb))
    assert tabs.children[1].outputs == (frame,) and len(test_comm.sent) == sent + 1
    r.finish(cluster(node("finished", step=4), state="finished", **tb))
    assert panel.tensorboard_link.outputs == ()
    assert "%tfos_tensorboard --logdir DIR" in tabs.children[1].outputs[0]["data"]["text/html"]
    assert "<iframe" not in tabs.children[1].outputs[0]["data"]["text/html"]


def test_widget_panel_tensorboard_tab_is_never_a_blank_frame(test_comm, monkeypatch):
    """Without the Jupyter server's tfos_nb route the tab's frame says why after a while; on Databricks (no
    Jupyter server behind the page) the tab is the message, with no link or frame that could never load."""
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    tb = dict(cluster_id="0123abcd", tensorboard="http://10.9.9.9:6006")
    r = make_renderer("widget", display=FakeDisplay(), interval=0.0)
    r.update(cluster(node(step=2), **tb))
    (frame,) = r.backend.panel.children[1].children[1].outputs
    page = frame["data"]["text/html"]
    assert page.index('<div id="tfos-tb-') < page.index("<iframe")  # the note above the frame
    assert "1000 * 20.0" in page and "jupyter server extension enable tfos_nb.tbproxy" in page
    assert "No Jupyter server answers at %URL%" in page

    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    r = make_renderer("widget", display=FakeDisplay(), interval=0.0)
    r.update(cluster(node(step=2), **tb))
    panel = r.backend.panel
    (frame,) = panel.children[1].children[1].outputs
    assert "<iframe" not in frame["data"]["text/html"] and panel.tensorboard_link.outputs == ()
    assert "Databricks notebook has no Jupyter server" in frame["data"]["text/plain"]
    assert "%load_ext tensorboard" in frame["data"]["text/html"]


def test_html_fallback_links_tensorboard_and_drops_the_link_at_the_end():
    disp = FakeDisplay()
    r = make_renderer("html", display=disp, interval=0.0)
    tb = dict(cluster_id="0123abcd", tensorboard="http://10.0.0.5:6006")
    r.update(cluster(node(step=2), **tb))
    live = disp.calls[-1][1]["text/html"]
    assert 'data-tfos-path="tfos_nb/tensorboard/0123abcd/"' in live and "jupyter-config-data" in live
    r.finish(cluster(node("finished", step=4), state="finished", **tb))
    assert "TensorBoard" not in disp.calls[-1][1]["text/html"]  # the saved notebook holds no dead link


def test_cluster_route_registers_while_tensorboard_runs(tmp_path, monkeypatch):
    from tfos_nb import tensorboard
    from tfos_nb.tensorboard import _records

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    route = tensorboard.ClusterRoute()
    route(cluster(cluster_id="0123abcd"), False)
    assert route.path is None and not list(tmp_path.rglob("*.json"))
    url = "http://127.0.0.1:6006"
    route(cluster(cluster_id="0123abcd", tensorboard=url), False)
    route(cluster(cluster_id="0123abcd", tensorboard=url), False)
    assert route.path == "tfos_nb/tensorboard/0123abcd/"
    ep = _records.read_record(str(tmp_path), "0123abcd")
    assert (ep.host, ep.port) == ("127.0.0.1", 6006)
    # a retried cluster: new id, new TensorBoard; the old route goes
    route(cluster(cluster_id="4567cdef", tensorboard="http://127.0.0.1:6007"), False)
    assert route.path == "tfos_nb/tensorboard/4567cdef/"
    assert _records.read_record(str(tmp_path), "0123abcd") is None
    route(cluster(cluster_id="4567cdef", state="finished", tensorboard="http://127.0.0.1:6007"), True)
    assert route.path is None and _records.read_record(str(tmp_path), "4567cdef") is None and route.error is None
    route(cluster(cluster_id="89abcdef", tensorboard=url), False)  # after the end: nothing registered again
    assert _records.read_record(str(tmp_path), "89abcdef") is None
