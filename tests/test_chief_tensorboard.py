"""The chief's TensorBoard (``runtime/tensorboard/chief.py``) and who may name its URL (the controller).

Issue 27, finding 2: the URL reaches the proxy only once the chief's own TensorBoard process
listens and answers there, never from another node or for another host, and a TensorBoard
that fails says why.  The squatter runs as a real second identity (uid ``nobody``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import cloudpickle
import psutil
import pytest

from tests.conftest import NODE_ENV, skip_environment, spark_fixture, wait_until
from tfos_nb import TFCluster
from tfos_nb.runtime.driver.control import state
from tfos_nb.runtime.driver.control.controller import Controller
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.protocol import messages

cloudpickle.register_pickle_by_value(sys.modules[__name__])

CHIEF_HOST, WORKER_HOST = "10.0.0.5", "10.0.0.6"


# -- the controller: who may name the TensorBoard URL (fast) ----------------------------------------------------
def formed(tensorboard: bool = True) -> tuple[state.ClusterState, Controller]:
    st = state.ClusterState("0123abcd", "t", [("chief", 0), ("worker", 0)])
    ctl = Controller(st, JobOptions(num_gpus=0, heartbeat_timeout=10.0), input_mode_spark=False, tensorboard=tensorboard, log_dir="/tmp/tb")
    for i, host in enumerate((CHIEF_HOST, WORKER_HOST)):
        assert ctl.handle(messages.Register(node=i, host=host, port=5000 + i, executor_id=str(i), pid=100 + i)).ok
    return st, ctl


def test_a_tensorboard_url_from_a_node_that_is_not_the_chief_is_ignored():
    st, ctl = formed()
    assert ctl.handle(messages.Heartbeat(node=1, state="running", tensorboard=f"http://{WORKER_HOST}:6006")).ok
    assert st.snapshot().tensorboard is None and st.nodes[1].tensorboard is None
    # nor may it say the chief's TensorBoard failed
    assert ctl.handle(messages.Heartbeat(node=1, state="running", tensorboard_error="TensorBoard exited")).ok
    assert st.snapshot().tensorboard_error is None


def test_a_tensorboard_url_naming_another_host_or_not_a_root_url_is_ignored():
    st, ctl = formed()
    for url in (f"http://{WORKER_HOST}:6006", "http://evil.example:6006", "http://127.0.0.1:6006",
                f"https://{CHIEF_HOST}:6006", f"http://{CHIEF_HOST}", f"http://{CHIEF_HOST}:6006/x",
                f"http://u:p@{CHIEF_HOST}:6006", f"http://{CHIEF_HOST}:99999"):
        assert ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard=url)).ok
        assert st.snapshot().tensorboard is None, url
    assert ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard=f"http://{CHIEF_HOST}:6006/")).ok
    assert st.snapshot().tensorboard == f"http://{CHIEF_HOST}:6006"


def test_no_tensorboard_url_is_taken_when_the_cluster_runs_none():
    st, ctl = formed(tensorboard=False)
    assert ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard=f"http://{CHIEF_HOST}:6006")).ok
    assert st.snapshot().tensorboard is None


def test_the_chiefs_tensorboard_failure_withdraws_its_url_and_is_said_once():
    st, ctl = formed()
    lines: list[tuple[str, list[str]]] = []
    st.add_log_listener(lambda label, new: lines.append((label, new)))
    assert ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard=f"http://{CHIEF_HOST}:6006")).ok
    error = "TensorBoard exited with code 1; its last output lines:\nboom"
    for _ in range(2):
        assert ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard_error=error)).ok
    view = st.snapshot()
    assert view.tensorboard is None and view.tensorboard_error == error
    assert lines == [("chief:0", ["[tfos_nb] no TensorBoard: TensorBoard exited with code 1; its last output lines:",
                                  "[tensorboard] boom"])]


def test_the_panel_says_the_chiefs_tensorboard_failed():
    from tfos_nb.widgets._view import panel_html, panel_model, text_line

    st, ctl = formed()
    error = "TensorBoard exited with code 1; its last output lines:\nboom"
    assert ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard_error=error)).ok
    model = panel_model(st.snapshot())
    said = "no TensorBoard: TensorBoard exited with code 1; its last output lines: (its output is in the chief's log)"
    assert model["tensorboard_error"] == said and model["tensorboard"] is None
    assert said in text_line(model) and said.replace("'", "&#x27;") in panel_html(model)


def test_the_proxy_route_is_withdrawn_when_the_url_goes(tmp_path, monkeypatch):
    """A TensorBoard that exited frees its port for anyone: the route must not outlive it."""
    from tfos_nb import tensorboard as notebook_tensorboard

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    st, ctl = formed()
    route = notebook_tensorboard.ClusterRoute()
    ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard=f"http://{CHIEF_HOST}:6006"))
    route(st.snapshot(), False)
    record = tmp_path / "tfos_nb" / "0123abcd.json"
    assert record.exists()
    ctl.handle(messages.Heartbeat(node=0, state="running", tensorboard_error="TensorBoard exited with code 1 (no output)"))
    route(st.snapshot(), False)
    assert not record.exists() and route.path is None


# -- real clusters (slow) --------------------------------------------------------------------------------------
spark = spark_fixture(2)


def tb_fun(args, ctx):
    import os as o
    import time as t

    deadline = t.monotonic() + 180
    while not o.path.exists(args["done"]) and t.monotonic() < deadline:
        t.sleep(0.2)


def _start(sc, tmp_path, **kw):
    env = {**NODE_ENV, **kw.pop("env", {})}
    return TFCluster.run(sc, tb_fun, {"done": str(tmp_path / "done")}, 2, master_node="chief", tensorboard=True,
                         log_dir=str(tmp_path / "logs"), env=env, **kw)


def _stop(cluster, tmp_path) -> None:
    (tmp_path / "done").write_text("ok")
    cluster.shutdown(timeout=60)


def _listener(port: int) -> psutil.Process | None:
    """The process holding the listening TCP socket on ``port`` (any address)."""
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return psutil.Process(c.pid)
    return None


def _assert_the_chiefs_tensorboard_owns(cluster, url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    owner = _listener(port)
    chief = next(n for n in cluster.status().nodes if n.label == "chief:0")
    assert owner is not None, url
    assert "tensorboard.main" in owner.cmdline() and owner.ppid() == chief.pid and owner.uids().real == os.getuid(), (
        url, owner.cmdline(), owner.ppid(), chief.pid, owner.uids())
    assert url == f"http://{chief.host}:{port}"


def _environment(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url + "/data/environment", timeout=5) as r:
        return r.status


@pytest.mark.slow
def test_the_url_is_reported_once_the_chiefs_own_tensorboard_answers_there(sc, tmp_path, no_leaks):
    cluster = _start(sc, tmp_path)
    try:
        url = wait_until(cluster.tensorboard_url, 300, what="the chief's TensorBoard URL")
        # no waiting here: the URL is reported only once TensorBoard serves it
        assert _environment(url) == 200
        _assert_the_chiefs_tensorboard_owns(cluster, url)
        chief = next(n for n in cluster.status().nodes if n.label == "chief:0")
        tb = next(p for p in psutil.Process(chief.pid).children() if "tensorboard.main" in p.cmdline())
        assert tb.cmdline()[tb.cmdline().index("--port") + 1] == "0"  # no port on the command line
    finally:
        _stop(cluster, tmp_path)


# A local user's squatter: finds TensorBoard's command line in /proc, binds the port it names
# first, and answers like TensorBoard (its logdir too, read from the same command line).
SQUATTER = r"""
import json, os, socket, sys, time
deadline = time.monotonic() + float(sys.argv[1])
seen = set()
while time.monotonic() < deadline:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid in seen:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0")]
        except OSError:
            continue
        if "tensorboard.main" not in argv or "--port" not in argv:
            continue
        seen.add(pid)
        host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
        logdir = argv[argv.index("--logdir") + 1]
        if not logdir.startswith(sys.argv[2]):  # another test's TensorBoard (test.sh runs two test processes)
            continue
        print("saw", host, port, flush=True)
        if not port:
            continue
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            s.bind((host, port))
            s.listen(16)
        except OSError as exc:
            print("bind failed", exc, flush=True)
            continue
        print("squatted", host, port, flush=True)
        body = json.dumps({"data_location": logdir, "window_title": "", "version_string": "x"}).encode()
        while True:
            c, _ = s.accept()
            c.recv(65536)
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
            c.close()
    time.sleep(0.02)
"""


def _python_for_nobody() -> str:
    """An interpreter user ``nobody`` may run (the test's own may sit in a directory only root reads)."""
    if os.geteuid() != 0:
        skip_environment("a second local identity (uid nobody) needs root to start")
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            probe = subprocess.run([exe, "-c", "pass"], user="nobody", extra_groups=[], cwd="/", capture_output=True)
        except PermissionError:
            continue
        if probe.returncode == 0:
            return exe
    pytest.fail("no Python interpreter that uid nobody can run (tried the test's and /usr/bin/python3)")


@pytest.mark.slow
def test_a_local_user_squatting_tensorboards_port_is_never_registered(sc, tmp_path, no_leaks):
    exe = _python_for_nobody()
    squatter = subprocess.Popen([exe, "-c", SQUATTER, "300", str(tmp_path)], user="nobody", extra_groups=[], cwd="/",
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cluster = _start(sc, tmp_path)
        try:
            url = wait_until(cluster.tensorboard_url, 300, what="the chief's TensorBoard URL")
            _assert_the_chiefs_tensorboard_owns(cluster, url)
        finally:
            _stop(cluster, tmp_path)
    finally:
        squatter.kill()
        out = squatter.communicate(timeout=10)[0]
    assert "saw" in out, out  # the squatter did watch TensorBoard start
    assert "squatted" not in out, out  # the command line named no port to take


@pytest.mark.slow
def test_a_tensorboard_that_fails_to_start_says_why(sc, tmp_path, no_leaks):
    # a broken `tensorboard` ahead of the real one on the nodes' path
    broken = tmp_path / "broken" / "tensorboard"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "main.py").write_text("import sys\nprint('simulated TensorBoard breakage', file=sys.stderr)\nsys.exit(3)\n")
    cluster = _start(sc, tmp_path, env={"PYTHONPATH": str(broken.parent)})
    try:
        error = wait_until(lambda: cluster.status().tensorboard_error, 300, what="the TensorBoard error")
        assert error.startswith("TensorBoard exited with code 3") and "simulated TensorBoard breakage" in error, error
        assert cluster.tensorboard_url() is None
        logs = cluster.logs("chief:0")["chief:0"]
        assert any(line.startswith("[tfos_nb] no TensorBoard: TensorBoard exited with code 3") for line in logs), logs
        assert "[tensorboard] simulated TensorBoard breakage" in logs, logs
        assert cluster.status().state == "running"  # training goes on without it
    finally:
        _stop(cluster, tmp_path)


@pytest.mark.slow
def test_a_tensorboard_that_crashes_mid_run_is_named_and_training_goes_on(sc, tmp_path, no_leaks):
    """TensorBoard killed (SIGKILL) after it served: the URL is withdrawn at once (its port is anyone's now), the
    panel's TensorBoard error says how it ended, and the nodes go on; named within issue 41's 30 s."""
    cluster = _start(sc, tmp_path)
    try:
        url = wait_until(cluster.tensorboard_url, 300, what="the chief's TensorBoard URL")
        tensorboard = _listener(int(url.rsplit(":", 1)[1]))
        assert tensorboard is not None and "tensorboard.main" in tensorboard.cmdline(), url
        killed_at = time.monotonic()
        tensorboard.kill()
        error = wait_until(lambda: cluster.status().tensorboard_error, 30, what="the TensorBoard error")
        named = time.monotonic() - killed_at
        assert error.startswith("TensorBoard killed by SIGKILL"), error
        assert cluster.tensorboard_url() is None and cluster.status().tensorboard is None
        assert cluster.status().state == "running"  # training goes on without it
        print(f"\nTensorBoard killed mid-run: named in {named:.1f} s")
    finally:
        _stop(cluster, tmp_path)
