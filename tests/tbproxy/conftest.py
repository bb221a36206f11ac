"""The TensorBoard proxy's test setup: a real ``jupyter server`` with the extension (at the root and under a
JupyterHub-style base URL), a real TensorBoard on logs of a real (tiny) TensorFlow training, and a tiny tornado
upstream (HTTP + websocket echo) to see exactly what crosses the proxy.

The servers, the training, TensorBoard and the echo upstreams are package-scoped: started once for the three
modules here (what crosses the proxy, what it refuses, a TensorBoard the kernel starts itself), stopped after
the last of them.
"""

from __future__ import annotations

import http.client
import json
import secrets
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.conftest import free_port
from tests.jupyter_server import JupyterServer, Reply, child_env, config_with_extension, jupyter_server, wait_for
from tfos_nb import tensorboard as notebook_tensorboard


# --------------------------------------------------------------------------- helpers
def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Server(JupyterServer):
    """The test's server, with requests that check what the proxy must never weaken."""

    def fetch(
        self, rel: str, method: str = "GET", *, auth: bool = True, headers: dict | None = None, body: bytes | None = None
    ) -> Reply:
        """A request whose path is sent exactly as given (no client-side normalisation)."""
        out = self.request(rel, method, auth=auth, headers=headers, body=body)
        # The proxy never weakens the Jupyter origin, whatever the answer (Jupyter itself
        # sends an empty Access-Control-Allow-Origin on API responses: no origin allowed).
        assert out.headers.get_all("Access-Control-Allow-Origin") in (None, [""]), out.headers
        assert "Access-Control-Allow-Credentials" not in out.headers, out.headers
        assert not any("upstream=" in c for c in out.headers.get_all("Set-Cookie") or []), out.headers
        return out

    def login_cookie(self) -> str:
        """Log in through the form like a browser; return the Cookie header it would send."""
        first = self.fetch("login", auth=False)
        jar = SimpleCookie()
        for v in first.headers.get_all("Set-Cookie") or []:
            jar.load(v)
        xsrf = jar["_xsrf"].value
        form = urlencode({"password": self.token, "_xsrf": xsrf}).encode()
        cookie = f"_xsrf={xsrf}"
        resp = self.fetch(
            "login", "POST", auth=False, body=form, headers={"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie}
        )
        assert resp.status == 302, (resp.status, resp.body[:300])
        for v in resp.headers.get_all("Set-Cookie") or []:
            jar.load(v)
        return "; ".join(f"{k}={m.value}" for k, m in jar.items() if m.value)


def tb_path(cluster_id: str, rest: str = "") -> str:
    return f"tfos_nb/tensorboard/{cluster_id}/{rest}"


# Tiny upstream: records every request it gets, echoes headers/body, sets headers the
# proxy must drop, and echoes websocket messages on /ws.
UPSTREAM = textwrap.dedent(
    """
    import asyncio, json, sys
    from tornado import web, websocket

    seen = []

    class Echo(websocket.WebSocketHandler):
        def select_subprotocol(self, subprotocols):
            return subprotocols[0] if subprotocols else None
        def open(self):
            seen.append("WS " + self.request.uri)
            self.upstream_headers = dict(self.request.headers)
        def on_message(self, message):
            if message == "headers":
                message = json.dumps(self.upstream_headers)
            self.write_message(message, binary=isinstance(message, bytes))

    class Log(web.RequestHandler):
        def get(self):
            self.write(json.dumps(seen))

    class Any(web.RequestHandler):
        def _answer(self):
            seen.append(self.request.method + " " + self.request.uri)
            self.set_header("Set-Cookie", "upstream=1; Path=/")
            self.set_header("Access-Control-Allow-Origin", "*")
            self.set_header("Access-Control-Allow-Credentials", "true")
            self.set_header("Proxy-Authenticate", "Basic")
            self.set_header("Keep-Alive", "timeout=99")
            self.set_header("X-Upstream", "yes")
            if self.request.path == "/moved":
                self.redirect("http://%s/elsewhere" % self.request.host)
                return
            self.set_header("Content-Type", "application/json")
            if self.request.method != "HEAD":
                self.write(json.dumps({"method": self.request.method, "uri": self.request.uri,
                                       "headers": dict(self.request.headers), "body": self.request.body.decode()}))
        get = post = head = _answer

    async def main():
        app = web.Application([(r"/__log", Log), (r"/ws", Echo), (r"/.*", Any)])
        server = app.listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(port))
        import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)

TRAIN = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    w = tf.Variable(0.0)
    writer = tf.summary.create_file_writer(sys.argv[1] + "/train")
    with writer.as_default():
        for step in range(20):
            with tf.GradientTape() as tape:
                loss = (w - 3.0) ** 2
            w.assign_sub(0.1 * tape.gradient(loss, w))
            tf.summary.scalar("loss", loss, step=step)
    writer.flush()
    """
)


def _get_json(port: int, path: str) -> object:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return json.loads(resp.read()) if resp.status == 200 else None
    finally:
        conn.close()


async def _ws(server: Server, rel: str, headers: dict[str, str], subprotocols: list[str] | None = None) -> object:
    from tornado import httpclient, websocket

    req = httpclient.HTTPRequest(f"ws://127.0.0.1:{server.port}{server.path(rel)}", headers=headers, request_timeout=20)
    return await websocket.websocket_connect(req, subprotocols=subprotocols)


@contextmanager
def echo_upstream(folder: Path, what: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run :data:`UPSTREAM` from ``folder``: ``(http://127.0.0.1:PORT, its process)``, stopped at the end."""
    (folder / "up.py").write_text(UPSTREAM)
    port_file = folder / "port"
    proc = subprocess.Popen([sys.executable, str(folder / "up.py"), str(port_file)], env=child_env(),
                            stderr=open(folder / "log", "wb"))
    try:
        wait_for(port_file.exists, 30, what, proc)
        yield f"http://127.0.0.1:{int(port_file.read_text())}", proc
    finally:
        stop(proc)


def upstream_log(upstream_url: str) -> list[str]:
    return _get_json(int(upstream_url.rsplit(":", 1)[1]), "/__log")  # type: ignore[return-value]


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="package")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of the echo upstream."""
    with echo_upstream(tmp_path_factory.mktemp("upstream"), "echo upstream") as (url, _):
        yield url


@pytest.fixture(scope="package")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second upstream nobody registers: crafted paths must never reach it."""
    with echo_upstream(tmp_path_factory.mktemp("canary"), "canary upstream") as (url, _):
        yield url


@pytest.fixture
def own_upstream(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """An echo upstream of the test's own (its log and connections are the test's alone)."""
    with echo_upstream(tmp_path, "echo upstream") as up:
        yield up


@pytest.fixture(scope="package")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Logs of a real TensorFlow training (20 SGD steps, a ``loss`` scalar per step)."""
    d = tmp_path_factory.mktemp("logs")
    subprocess.run([sys.executable, "-c", TRAIN, str(d)], env=child_env(), check=True, timeout=300, capture_output=True)
    assert list((d / "train").glob("events.out.tfevents.*"))
    return d


@pytest.fixture(scope="package")
def tensorboard(logdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real TensorBoard on ``logdir``, once it lists the run: ``http://127.0.0.1:PORT``."""
    port = free_port()
    log = tmp_path_factory.mktemp("tb") / "tb.log"
    cmd = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--load_fast=false",
    ]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    try:
        wait_for(lambda: "train" in (_get_json(port, "/data/runs") or []), 120, "TensorBoard", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def _server(tmp_path_factory: pytest.TempPathFactory, base_url: str, trusted: tuple[str, ...] = ()) -> Iterator[Server]:
    """A real ``jupyter server`` with the extension enabled by the shipped config file; ``trusted``: its
    ``c.TensorBoardProxy.trusted_users``."""
    root = tmp_path_factory.mktemp("jupyter")
    config = config_with_extension(root)
    if trusted:
        (config / "jupyter_server_config.json").write_text(json.dumps({"TensorBoardProxy": {"trusted_users": trusted}}))
    with jupyter_server(root, base_url=base_url, config_dir=config, kind=Server, startup_timeout=90) as srv:
        yield srv


@pytest.fixture(scope="package")
def root_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(tmp_path_factory, "/")


@pytest.fixture(scope="package")
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """As a hub's single-user server: under ``/user/alice/``, trusting another account's ports than ``nobody``'s
    (the refusal tests then show that trusting one account trusts no other)."""
    yield from _server(tmp_path_factory, "/user/alice/", trusted=("daemon",))


@pytest.fixture(params=["root_server", "hub_server"], ids=["root", "hub-base-url"])
def server(request: pytest.FixtureRequest) -> Server:
    """Each test once at the root and once under a JupyterHub-style base URL.  Two package-scoped servers rather
    than one parametrized fixture: pytest's grouping by parameter and tests/conftest.py's grouping by module
    would interleave the modules here and restart the server at each change of parameter."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def register(server: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Register an upstream URL the way a kernel of this server would; returns its cluster id."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    ids: list[str] = []

    def _register(url: str) -> str:
        cid = secrets.token_hex(8)
        assert notebook_tensorboard.register(cid, url) == tb_path(cid)
        ids.append(cid)
        return cid

    yield _register
    for cid in ids:
        notebook_tensorboard.withdraw(cid)

