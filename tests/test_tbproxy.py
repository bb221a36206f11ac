"""The TensorBoard proxy: a real ``jupyter server`` with the extension, a real TensorBoard
on logs of a real (tiny) TensorFlow training, and a tiny tornado upstream (HTTP +
websocket echo) to see exactly what crosses the proxy.  Security cases by status code.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.conftest import free_port, wait_until
from tests.jupyter_server import CONFIG_JSON, JupyterServer, Reply, child_env, config_with_extension, jupyter_server
from tests.server_abuse import as_nobody, as_nobody_wait, fork_as_nobody
from tfos_nb import tensorboard as tb
from tfos_nb.tbproxy import _records, _urls

REPO = Path(__file__).resolve().parents[1]
slow = pytest.mark.slow


# --------------------------------------------------------------------------- helpers
def wait_for(predicate: Callable[[], object], timeout: float, what: str, proc: subprocess.Popen | None = None) -> object:
    """:func:`wait_until` for a server or TensorBoard starting up: a refused connection means "not yet"."""
    return wait_until(predicate, timeout, 0.2, what=what, proc=proc, ignore=(OSError,))


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


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of the echo upstream."""
    d = tmp_path_factory.mktemp("upstream")
    (d / "up.py").write_text(UPSTREAM)
    port_file = d / "port"
    proc = subprocess.Popen([sys.executable, str(d / "up.py"), str(port_file)], env=child_env(), stderr=open(d / "log", "wb"))
    try:
        wait_for(port_file.exists, 30, "echo upstream", proc)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        stop(proc)


def upstream_log(upstream_url: str) -> list[str]:
    return _get_json(int(upstream_url.rsplit(":", 1)[1]), "/__log")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second upstream nobody registers: crafted paths must never reach it."""
    d = tmp_path_factory.mktemp("canary")
    (d / "up.py").write_text(UPSTREAM)
    port_file = d / "port"
    proc = subprocess.Popen([sys.executable, str(d / "up.py"), str(port_file)], env=child_env(), stderr=open(d / "log", "wb"))
    try:
        wait_for(port_file.exists, 30, "canary upstream", proc)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Logs of a real TensorFlow training (20 SGD steps, a ``loss`` scalar per step)."""
    d = tmp_path_factory.mktemp("logs")
    subprocess.run([sys.executable, "-c", TRAIN, str(d)], env=child_env(), check=True, timeout=300, capture_output=True)
    assert list((d / "train").glob("events.out.tfevents.*"))
    return d


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module", params=["/", "/user/alice/"], ids=["root", "hub-base-url"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real ``jupyter server`` with the extension enabled by the shipped config file."""
    root = tmp_path_factory.mktemp("jupyter")
    with jupyter_server(root, base_url=request.param, config_dir=config_with_extension(root), kind=Server,
                        startup_timeout=90) as srv:
        yield srv


@pytest.fixture
def register(server: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Register an upstream URL the way a kernel of this server would; returns its cluster id."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    ids: list[str] = []

    def _register(url: str) -> str:
        cid = secrets.token_hex(8)
        assert tb.register(cid, url) == tb_path(cid)
        ids.append(cid)
        return cid

    yield _register
    for cid in ids:
        tb.withdraw(cid)


# --------------------------------------------------------------------------- fast units
def test_records_are_private_and_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    path = tb.register("0123abcd", "http://127.0.0.1:6006")
    assert path == "tfos_nb/tensorboard/0123abcd/"
    rec = tmp_path / "rt" / "tfos_nb" / "0123abcd.json"
    assert stat.S_IMODE(rec.stat().st_mode) == 0o600
    assert stat.S_IMODE(rec.parent.stat().st_mode) == 0o700
    ep = _records.read_record(str(tmp_path / "rt"), "0123abcd")
    assert ep is not None and (ep.host, ep.port, ep.pid) == ("127.0.0.1", 6006, os.getpid()) and len(ep.secret) >= 16
    assert tb.withdraw("0123abcd") and not rec.exists() and not tb.withdraw("0123abcd")
    for bad in ("ABCDEF12", "abc", "../x1234567", "0" * 33):
        with pytest.raises(ValueError):
            tb.register(bad, "http://127.0.0.1:1")
    for bad in ("https://h:1", "http://h", "http://u@h:1", "http://h:1/x", "http://h:1?a=b", "http://h_x:1"):
        with pytest.raises(ValueError):
            tb.register("0123abcd", bad)
    with pytest.raises(ValueError):
        _records.Endpoint.from_json('{"version": 1, "cluster_id": "0123abcd", "host": "h", "port": "1", "secret": "x", "pid": 1}')
    ok = _records.Endpoint("0123abcd", "::1", 1, "s" * 32, 1)
    assert _records.Endpoint.from_json(ok.to_json()[:-1] + ', "future": 1}') == ok and ok.netloc == "[::1]:1"


@pytest.mark.parametrize(
    "raw",
    ["/../x", "/a/..", "/%2e%2e/x", "/%2E./x", "/a%2Fb", "/a%2fb", "/a%5cb", "/a\\b", "//evil/", "/@evil", "/%40evil",
     "/http://evil/", "/evil:80/",
     "/127.0.0.1:22/", "/%3a", "/a%00", "/a%zz", "/a b", "x", "", "/a/./b"],
)  # fmt: skip
def test_check_path_refuses(raw: str) -> None:
    with pytest.raises(_urls.BadPath):
        _urls.check_path(raw)


def test_upstream_url_is_the_registered_endpoint() -> None:
    ep = _records.Endpoint("0123abcd", "10.0.0.5", 6006, "s" * 32, 1)
    assert _urls.upstream_url(ep, "/data/runs", "token=abc&x=1") == "http://10.0.0.5:6006/data/runs?x=1"
    assert _urls.upstream_url(ep, "/", "") == "http://10.0.0.5:6006/"
    assert _urls.upstream_url(ep, "/ws", "a=b", scheme="ws") == "ws://10.0.0.5:6006/ws?a=b"
    assert _urls.upstream_url(ep, "/data/plugin/scalars/tags", "run=a%2Fb") == "http://10.0.0.5:6006/data/plugin/scalars/tags?run=a%2Fb"


def test_iframe_src_built_in_browser() -> None:
    html = tb.iframe_html("tfos_nb/tensorboard/0123abcd/")
    assert "jupyter-config-data" in html and "dataset.baseUrl" in html
    assert 'src="' not in html.split("<script>")[0]  # no hard-coded src: computed from the page's base URL
    for bad in ("/tfos_nb/tensorboard/0123abcd/", "http://evil/", "../x", "a//b"):
        with pytest.raises(ValueError):
            tb.iframe_html(bad)


def test_layers_import_one_way() -> None:
    code = (
        "import sys, tfos_nb.tensorboard, tfos_nb.tbproxy._handlers\n"
        "bad = [m for m in ('tensorflow', 'pyspark', 'IPython') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "import tfos_nb.tbproxy; del sys.modules['tfos_nb.tbproxy._handlers']\n"
    )
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True, timeout=120)
    # The kernel side does not need jupyter_server at all.
    code = "import sys, tfos_nb.tensorboard\nassert 'jupyter_server' not in sys.modules and 'tornado' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True, timeout=120)


@slow
def test_extension_listed_ok(tmp_path: Path) -> None:
    assert json.loads(CONFIG_JSON.read_text()) == {"ServerApp": {"jpserver_extensions": {"tfos_nb.tbproxy": True}}}
    env = child_env(JUPYTER_CONFIG_DIR=str(config_with_extension(tmp_path)))
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", "server", "extension", "list"], env=env, capture_output=True, text=True, timeout=120
    )
    text = out.stdout + out.stderr
    assert "tfos_nb.tbproxy" in text and "enabled" in text, text
    line = next(ln for ln in text.splitlines() if "tfos_nb.tbproxy" in ln and "OK" in ln)
    assert "0.1.0" in line


# --------------------------------------------------------------------------- real server
@slow
def test_tensorboard_through_proxy(server: Server, tensorboard: str, register: Callable[[str], str]) -> None:
    cid = register(tensorboard)
    runs = server.fetch(tb_path(cid, "data/runs"))
    assert runs.status == 200 and "train" in runs.json()
    tags = server.fetch(tb_path(cid, "data/plugin/scalars/tags"))
    assert tags.status == 200 and "loss" in tags.json()["train"]
    index = server.fetch(tb_path(cid))
    assert index.status == 200 and index.headers["Content-Type"].startswith("text/html")
    assert b"<tf-tensorboard" in index.body or b"TensorBoard" in index.body
    assert server.fetch(tb_path(cid), "HEAD").status == 200
    # Compressed answers pass through untouched, with their Content-Encoding.
    gz = server.fetch(tb_path(cid), headers={"Accept-Encoding": "gzip"})
    assert gz.status == 200
    body = gzip.decompress(gz.body) if gz.headers.get("Content-Encoding") == "gzip" else gz.body
    assert body == index.body
    # The page's relative asset URLs resolve under the proxy route (the trailing slash matters).
    scripts = re.findall(rb'<script[^>]+src="([^"]+)"', index.body)
    assert scripts, index.body[:500]
    for src in scripts:
        asset = server.fetch(tb_path(cid, src.decode()))
        assert asset.status == 200 and len(asset.body) > 1000, (src, asset.status)
    # Without the trailing slash TensorBoard's relative URLs break: redirect to it, under the base URL.
    bare = server.fetch(f"tfos_nb/tensorboard/{cid}")
    assert bare.status == 302 and bare.headers["Location"] == server.path(tb_path(cid))


@slow
def test_cookie_session_like_a_browser(server: Server, upstream: str, register: Callable[[str], str]) -> None:
    cid = register(upstream)
    cookie = server.login_cookie()
    host = f"127.0.0.1:{server.port}"
    assert server.fetch(tb_path(cid, "x"), auth=False, headers={"Cookie": cookie}).status == 200
    same = server.fetch(tb_path(cid, "post"), "POST", auth=False, body=b"q=1", headers={"Cookie": cookie, "Origin": f"http://{host}"})
    assert same.status == 200 and same.json()["body"] == "q=1"
    # Cross-site form POST riding the cookie: Jupyter's XSRF protection still applies
    # (a foreign Origin is answered 404 by Jupyter's own check, a missing _xsrf 403).
    before = upstream_log(upstream)
    for origin, status in (("http://evil.example", 404), (None, 403)):
        hdrs = {"Cookie": cookie} | ({"Origin": origin} if origin else {})
        assert server.fetch(tb_path(cid, "post"), "POST", auth=False, body=b"q=1", headers=hdrs).status == status
    assert upstream_log(upstream) == before
    assert not any("cookie" in k.lower() for k in same.json()["headers"])


@slow
def test_unauthenticated_refused(server: Server, tensorboard: str, upstream: str, register: Callable[[str], str]) -> None:
    cid = register(tensorboard)
    before = upstream_log(upstream)
    for rel in (tb_path(cid, "data/runs"), tb_path(cid), tb_path("0000000000000000", "x"), tb_path("nothex", "x")):
        for method in ("GET", "HEAD", "POST"):
            resp = server.fetch(rel, method, auth=False, body=b"" if method == "POST" else None)
            assert resp.status == 403, (rel, method, resp.status)
        wrong = server.fetch(rel, auth=False, headers={"Authorization": "token " + secrets.token_hex(16)})
        assert wrong.status == 403
        assert server.fetch(rel + "?token=" + secrets.token_hex(16), auth=False).status == 403
    bare = server.fetch(f"tfos_nb/tensorboard/{cid}", auth=False)
    assert bare.status in (302, 403) and (bare.status == 403 or "login" in bare.headers["Location"])
    assert upstream_log(upstream) == before


async def _ws(server: Server, rel: str, headers: dict[str, str], subprotocols: list[str] | None = None) -> object:
    from tornado import httpclient, websocket

    req = httpclient.HTTPRequest(f"ws://127.0.0.1:{server.port}{server.path(rel)}", headers=headers, request_timeout=20)
    return await websocket.websocket_connect(req, subprotocols=subprotocols)


@slow
def test_websocket(server: Server, upstream: str, register: Callable[[str], str]) -> None:
    from tornado import httpclient

    cid = register(upstream)

    async def scenario() -> None:
        for hdrs in ({}, {"Authorization": "token " + secrets.token_hex(16)}):
            with pytest.raises(httpclient.HTTPClientError) as err:
                await _ws(server, tb_path(cid, "ws"), hdrs)
            assert err.value.code == 403
        # A foreign page riding the browser's cookie (cross-site websocket hijacking):
        # Jupyter's origin check refuses it.  (A valid *token* skips the origin check, by
        # Jupyter's design: a foreign page cannot know it.)
        cookie = await asyncio.to_thread(server.login_cookie)
        with pytest.raises(httpclient.HTTPClientError) as err:
            await _ws(server, tb_path(cid, "ws"), {"Cookie": cookie, "Origin": "http://evil.example"})
        assert err.value.code == 403
        same = await _ws(server, tb_path(cid, "ws"), {"Cookie": cookie, "Origin": f"http://127.0.0.1:{server.port}"})
        await same.write_message("via cookie")
        assert await same.read_message() == "via cookie"
        same.close()
        with pytest.raises(httpclient.HTTPClientError) as err:
            await _ws(server, tb_path("0000000000000000", "ws"), {"Authorization": f"token {server.token}"})
        assert err.value.code == 404
        for crafted in ("..%2Fws", "%2F%2Fevil.example/ws", "@evil.example/ws", "x/../ws"):
            with pytest.raises(httpclient.HTTPClientError) as err:
                await _ws(server, tb_path(cid, crafted), {"Authorization": f"token {server.token}"})
            assert err.value.code == 400, crafted
        conn = await _ws(server, tb_path(cid, "ws"), {"Authorization": f"token {server.token}", "Cookie": "x=1"}, ["proto-a", "proto-b"])
        assert conn.selected_subprotocol == "proto-a"
        await conn.write_message("hello")
        assert await conn.read_message() == "hello"
        await conn.write_message(b"\x00\x01bin", binary=True)
        assert await conn.read_message() == b"\x00\x01bin"
        await conn.write_message("headers")
        seen = {k.lower() for k in json.loads(await conn.read_message())}
        assert not seen & {"cookie", "authorization", "origin"}, seen
        conn.close()

    asyncio.run(scenario())


@pytest.fixture
def own_upstream(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """An echo upstream of the test's own (its log and connections are the test's alone)."""
    (tmp_path / "up.py").write_text(UPSTREAM)
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "up.py"), str(port_file)], env=child_env(),
                            stderr=open(tmp_path / "log", "wb"))
    try:
        wait_for(port_file.exists, 30, "echo upstream", proc)
        yield f"http://127.0.0.1:{int(port_file.read_text())}", proc
    finally:
        stop(proc)


@slow
def test_a_refused_websocket_never_reaches_tensorboard(
    server: Server, own_upstream: tuple[str, subprocess.Popen], register: Callable[[str], str]
) -> None:
    """A foreign page riding the browser's cookie is refused before the proxy connects upstream."""
    import psutil
    from tornado import httpclient

    url, proc = own_upstream
    port = int(url.rsplit(":", 1)[1])
    cid = register(url)

    def upstream_connections() -> int:
        return sum(1 for c in psutil.Process(proc.pid).net_connections(kind="tcp")
                   if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)

    async def scenario() -> None:
        cookie = await asyncio.to_thread(server.login_cookie)
        for _ in range(20):
            with pytest.raises(httpclient.HTTPClientError) as err:
                await _ws(server, tb_path(cid, "ws"), {"Cookie": cookie, "Origin": "http://evil.example"})
            assert err.value.code == 403

    asyncio.run(scenario())
    assert not [line for line in upstream_log(url) if line.startswith("WS ")], upstream_log(url)
    assert wait_until(lambda: upstream_connections() == 0, 5), f"{upstream_connections()} upstream connections left open"


@slow
def test_unknown_and_withdrawn_404(server: Server, upstream: str, register: Callable[[str], str]) -> None:
    assert server.fetch(tb_path(secrets.token_hex(8), "data/runs")).status == 404
    for bad in ("ABCDEF0123", "abc", "0" * 33, "g" * 8, "..", "%2e%2e", "127.0.0.1:22", "0123abcd%2F"):
        assert server.fetch(f"tfos_nb/tensorboard/{bad}/x").status == 404, bad
    cid = register(upstream)
    assert server.fetch(tb_path(cid, "x")).status == 200
    assert tb.withdraw(cid)
    assert server.fetch(tb_path(cid, "x")).status == 404


CRAFTED = [
    "../../api/status",
    "data/../../../api/status",
    "%2e%2e/%2e%2e/api/status",
    "data%2Fruns",
    "%2F%2Fevil.example/",
    "/evil.example/",
    "@evil.example/",
    "%40evil.example/",
    "http://evil.example/",
    "http:%2F%2Fevil.example/",
    "{canary}/",
    "x/{canary}/",
    "a%5c..%5c..%5c",
    "a\\b",
    "%00",
]


@slow
@pytest.mark.parametrize("crafted", CRAFTED)
def test_crafted_paths_refused(server: Server, upstream: str, canary: str, register: Callable[[str], str], crafted: str) -> None:
    cid = register(upstream)
    rel = tb_path(cid, crafted.format(canary=canary.removeprefix("http://")))
    before_up, before_canary = upstream_log(upstream), upstream_log(canary)
    for method in ("GET", "POST"):
        resp = server.fetch(rel, method, body=b"" if method == "POST" else None)
        assert resp.status in (400, 404), (rel, method, resp.status, resp.body[:200])
    assert upstream_log(upstream) == before_up and upstream_log(canary) == before_canary


@slow
def test_headers_crossing_the_proxy(server: Server, upstream: str, register: Callable[[str], str]) -> None:
    cid = register(upstream)
    resp = server.fetch(
        tb_path(cid, "echo?token=" + server.token + "&x=1"),
        headers={
            "Cookie": "secret=1",
            "Origin": "http://evil.example",
            "Proxy-Authorization": "Basic x",
            "Connection": "X-Custom",
            "X-Custom": "1",
            "Keep-Alive": "timeout=1",
            "TE": "trailers",
            "X-Kept": "yes",
        },
    )
    assert resp.status == 200
    got = resp.json()
    assert got["uri"] == "/echo?x=1"  # Jupyter's token never leaves Jupyter
    sent = {k.lower() for k in got["headers"]}
    assert not sent & {"cookie", "authorization", "proxy-authorization", "x-custom", "keep-alive", "te", "origin"}, sent
    assert "x-kept" in sent and got["headers"]["Host"] == upstream.removeprefix("http://")
    assert resp.headers["X-Upstream"] == "yes"
    for name in ("Proxy-Authenticate", "Keep-Alive", "Access-Control-Allow-Origin"):
        assert name not in resp.headers, name
    post = server.fetch(tb_path(cid, "p"), "POST", body=b'{"a": 1}', headers={"Content-Type": "application/json"})
    assert post.status == 200 and post.json()["body"] == '{"a": 1}' and post.json()["method"] == "POST"
    # An upstream redirect to its own origin stays on the proxy route.
    moved = server.fetch(tb_path(cid, "moved"))
    assert moved.status == 302 and moved.headers["Location"] == server.path(tb_path(cid, "elsewhere"))


@slow
def test_untrusted_records_not_served(server: Server, upstream: str, register: Callable[[str], str], tmp_path: Path) -> None:
    records = server.runtime_dir / "tfos_nb"
    # 1. Registered in another runtime directory (another user's, another server's).
    other = tmp_path / "other-runtime"
    cid = secrets.token_hex(8)
    _records.write_record(
        str(other), _records.Endpoint(cid, "127.0.0.1", int(upstream.rsplit(":", 1)[1]), _records.new_secret(), os.getpid())
    )
    assert server.fetch(tb_path(cid, "x")).status == 404
    # 2. ... and symlinked into ours.
    register(upstream)  # make sure our records directory exists
    (records / f"{cid}.json").symlink_to(other / "tfos_nb" / f"{cid}.json")
    assert server.fetch(tb_path(cid, "x")).status == 404
    # 3. Readable by others.
    cid = register(upstream)
    assert server.fetch(tb_path(cid, "x")).status == 200
    (records / f"{cid}.json").chmod(0o644)
    assert server.fetch(tb_path(cid, "x")).status == 404
    (records / f"{cid}.json").chmod(0o600)
    # 4. In a directory others can write to.
    records.chmod(0o777)
    try:
        assert server.fetch(tb_path(cid, "x")).status == 404
    finally:
        records.chmod(0o700)
    assert server.fetch(tb_path(cid, "x")).status == 200
    # 5. Owned by another uid (only root can make one).
    if os.getuid() == 0:
        os.chown(records / f"{cid}.json", 54321, -1)
        assert server.fetch(tb_path(cid, "x")).status == 404
        os.chown(records / f"{cid}.json", 0, -1)
    # 6. Left behind by a kernel that died without withdrawing.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cid = secrets.token_hex(8)
    _records.write_record(
        str(server.runtime_dir), _records.Endpoint(cid, "127.0.0.1", int(upstream.rsplit(":", 1)[1]), _records.new_secret(), dead.pid)
    )
    assert server.fetch(tb_path(cid, "x")).status == 404


@slow
def test_upstream_down_is_502(server: Server, register: Callable[[str], str]) -> None:
    with socket.socket() as held:  # bound, never listening: nothing else can serve this port meanwhile
        held.bind(("127.0.0.1", 0))
        cid = register(f"http://127.0.0.1:{held.getsockname()[1]}")
        assert server.fetch(tb_path(cid, "data/runs")).status == 502


def _our_listening_port(pid: int) -> set[int]:
    """The loopback ports ``pid`` listens on, if it is a child of this process (else nothing)."""
    import psutil

    child = psutil.Process(pid)
    if child.ppid() != os.getpid():
        return set()
    return {c.laddr.port for c in child.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def _registered_port(server: Server, cluster_id: str) -> int:
    endpoint = _records.read_record(str(server.runtime_dir), cluster_id)
    assert endpoint is not None
    return endpoint.port


@slow
def test_start_local_after_cluster_is_gone(server: Server, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    local = tb.start_local(str(logdir), timeout=120)
    assert isinstance(local, tb.LocalTensorBoard), local
    try:
        assert local.url.startswith("http://127.0.0.1:") and local.path == tb_path(local.cluster_id)
        # the registered port is our own child's listening socket; its output is a private file
        assert _registered_port(server, local.cluster_id) in _our_listening_port(local.pid)
        assert stat.S_IMODE(os.stat(local.log).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(local.log)).st_mode) == 0o700
        runs = wait_for(
            lambda: (r := server.fetch(tb_path(local.cluster_id, "data/runs"))).status == 200 and "train" in r.json() and r, 60, "runs"
        )
        assert runs
        again = tb.start_local(str(logdir), timeout=120)
        assert isinstance(again, tb.LocalTensorBoard) and again.reused and again.pid == local.pid
    finally:
        tb.stop_local(local)
        wait_for(lambda: not _alive(local.pid), 20, "local TensorBoard exit")
    assert server.fetch(tb_path(local.cluster_id, "data/runs")).status == 404


@slow
def test_start_local_does_not_reuse_a_killed_tensorboard(server: Server, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    first = tb.start_local(str(logdir), timeout=120)
    assert isinstance(first, tb.LocalTensorBoard), first
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: not _alive(first.pid), 20, "killed TensorBoard exit")
    second = tb.start_local(str(logdir), timeout=120)
    try:
        assert isinstance(second, tb.LocalTensorBoard) and not second.reused and second.pid != first.pid, second
        assert server.fetch(tb_path(second.cluster_id, "data/runs")).status == 200
    finally:
        if isinstance(second, tb.LocalTensorBoard):
            tb.stop_local(second)
            wait_for(lambda: not _alive(second.pid), 20, "local TensorBoard exit")


@slow
def test_start_local_that_does_not_listen_in_time_is_stopped_and_says_where_its_output_is(logdir: Path) -> None:
    import psutil

    def tensorboards() -> set[int]:
        found = set()
        for p in psutil.Process().children(recursive=True):  # other tests' children come and go meanwhile
            try:
                if "tensorboard.main" in " ".join(p.cmdline()):
                    found.add(p.pid)
            except psutil.Error:  # exited (or a zombie) between the listing and the read: not a TensorBoard running
                continue
        return found

    before = tensorboards()  # the module's upstream TensorBoard (the `tensorboard` fixture) may be running
    out = tb.start_local(str(logdir), timeout=0.5)  # TensorBoard takes seconds to import
    assert isinstance(out, tb.LocalStartFailed), out
    assert str(out).startswith("TensorBoard did not listen within 0.5 s, and was stopped (its output: ")
    assert out.log in str(out) and stat.S_IMODE(os.stat(out.log).st_mode) == 0o600
    left = tensorboards() - before
    assert not left, left


@slow
def test_start_local_never_trusts_another_users_tensorboard_info(server: Server, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another local user plants, in TensorBoard's world-writable info folder, a file naming their server and
    their process under the key this kernel's TensorBoard would have: it is neither used nor signalled."""
    as_nobody()
    import tempfile
    import time

    from tensorboard import manager
    from tensorboard import version as tb_version

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    theirs = free_port()

    def serve() -> None:  # nobody's HTTP server, from modules already loaded (root's stdlib is out of its reach)
        listener = socket.socket()
        listener.bind(("127.0.0.1", theirs))
        listener.listen()
        while True:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n["nobody\'s"]')
            conn.close()

    http_server = fork_as_nobody(serve)
    sleeper = subprocess.Popen(["sleep", "600"], user="nobody")
    info_dir = os.path.join(tempfile.gettempdir(), ".tensorboard-info")
    planted = os.path.join(info_dir, f"pid-{sleeper.pid}.info")
    local = None
    try:
        wait_for(lambda: socket.create_connection(("127.0.0.1", theirs), 5).close() or True, 30, "nobody's HTTP server")
        real = os.path.realpath(logdir)
        info = manager.TensorBoardInfo(
            version=tb_version.VERSION, start_time=int(time.time()), pid=sleeper.pid, port=theirs, path_prefix="",
            logdir=real, db="",
            cache_key=manager.cache_key(working_directory=os.getcwd(),
                                        arguments=["--logdir", real, "--host", "127.0.0.1", "--port", "0"],
                                        configure_kwargs={}),
        )

        text = manager._info_to_string(info).encode()

        def plant() -> None:  # as TensorBoard's launcher would (the folder 0777), were nobody first
            os.makedirs(info_dir, exist_ok=True)
            if os.stat(info_dir).st_uid == os.getuid():
                os.chmod(info_dir, 0o777)
            fd = os.open(planted, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, text)
            os.close(fd)

        as_nobody_wait(plant)
        assert os.stat(planted).st_uid != 0

        local = tb.start_local(str(logdir), timeout=120)
        assert isinstance(local, tb.LocalTensorBoard), local
        port = _registered_port(server, local.cluster_id)
        assert not local.reused and local.pid != sleeper.pid and port != theirs, (local, port)
        assert port in _our_listening_port(local.pid), "the registered port is not our own TensorBoard's"
        runs = wait_for(lambda: (r := server.fetch(tb_path(local.cluster_id, "data/runs"))).status == 200 and r.json(), 60, "runs")
        assert "train" in runs  # type: ignore[operator]
        tb.stop_local(local)
        wait_for(lambda: not _alive(local.pid), 20, "local TensorBoard exit")
        local = None
        assert sleeper.poll() is None and os.waitpid(http_server, os.WNOHANG) == (0, 0), "another user's process was signalled"
    finally:
        if local is not None and isinstance(local, tb.LocalTensorBoard):
            tb.stop_local(local)
        sleeper.kill()
        sleeper.wait(10)
        os.kill(http_server, signal.SIGKILL)
        os.waitpid(http_server, 0)
        if os.path.lexists(planted):
            os.unlink(planted)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


@slow
def test_status_route_tells_a_page_the_extension_is_there(server: Server) -> None:
    """``GET …/tfos_nb/tensorboard/``: what the frame's script asks when TensorBoard does not answer."""
    from tfos_nb import __version__

    for rel in ("tfos_nb/tensorboard/", "tfos_nb/tensorboard"):
        resp = server.fetch(rel)
        assert resp.status == 200 and json.loads(resp.body) == {"tfos_nb": __version__}, (rel, resp.status)
        assert resp.headers["Content-Type"].startswith("application/json")
    anonymous = server.fetch("tfos_nb/tensorboard/", auth=False)
    assert anonymous.status in (302, 403) and b"tfos_nb" not in anonymous.body
