"""What crosses the TensorBoard proxy: its records and URLs, the shipped extension config, then through a real
``jupyter server`` (at the root and under a hub base URL) to a real TensorBoard and to an echo upstream that
shows exactly what arrives: HTTP, compressed answers, a browser's cookie session, websockets, headers, errors.
What the proxy refuses is ``test_refusals.py``; the setup is ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import secrets
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.jupyter_server import CONFIG_JSON, child_env, config_with_extension
from tests.tbproxy.conftest import Server, _ws, tb_path, upstream_log
from tfos_nb import tensorboard as notebook_tensorboard
from tfos_nb.tensorboard import _records
from tfos_nb.tensorboard.proxy import _urls

slow = pytest.mark.slow


# --------------------------------------------------------------------------- fast units
def test_records_are_private_and_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    path = notebook_tensorboard.register("0123abcd", "http://127.0.0.1:6006")
    assert path == "tfos_nb/tensorboard/0123abcd/"
    rec = tmp_path / "rt" / "tfos_nb" / "0123abcd.json"
    assert stat.S_IMODE(rec.stat().st_mode) == 0o600
    assert stat.S_IMODE(rec.parent.stat().st_mode) == 0o700
    ep = _records.read_record(str(tmp_path / "rt"), "0123abcd")
    assert ep is not None and (ep.host, ep.port, ep.pid) == ("127.0.0.1", 6006, os.getpid()) and len(ep.secret) >= 16
    assert notebook_tensorboard.withdraw("0123abcd") and not rec.exists() and not notebook_tensorboard.withdraw("0123abcd")
    for bad in ("ABCDEF12", "abc", "../x1234567", "0" * 33):
        with pytest.raises(ValueError):
            notebook_tensorboard.register(bad, "http://127.0.0.1:1")
    for bad in ("https://h:1", "http://h", "http://u@h:1", "http://h:1/x", "http://h:1?a=b", "http://h_x:1"):
        with pytest.raises(ValueError):
            notebook_tensorboard.register("0123abcd", bad)
    with pytest.raises(ValueError):
        _records.Endpoint.from_json('{"version": 1, "cluster_id": "0123abcd", "host": "h", "port": "1", "secret": "x", "pid": 1}')
    ok = _records.Endpoint("0123abcd", "::1", 1, "s" * 32, 1)
    assert _records.Endpoint.from_json(ok.to_json()[:-1] + ', "future": 1}') == ok and ok.netloc == "[::1]:1"



def test_upstream_url_is_the_registered_endpoint() -> None:
    ep = _records.Endpoint("0123abcd", "10.0.0.5", 6006, "s" * 32, 1)
    assert _urls.upstream_url(ep, "/data/runs", "token=abc&x=1") == "http://10.0.0.5:6006/data/runs?x=1"
    assert _urls.upstream_url(ep, "/", "") == "http://10.0.0.5:6006/"
    assert _urls.upstream_url(ep, "/ws", "a=b", scheme="ws") == "ws://10.0.0.5:6006/ws?a=b"
    assert _urls.upstream_url(ep, "/data/plugin/scalars/tags", "run=a%2Fb") == "http://10.0.0.5:6006/data/plugin/scalars/tags?run=a%2Fb"


def test_iframe_src_built_in_browser() -> None:
    html = notebook_tensorboard.iframe_html("tfos_nb/tensorboard/0123abcd/")
    assert "jupyter-config-data" in html and "dataset.baseUrl" in html
    assert 'src="' not in html.split("<script>")[0]  # no hard-coded src: computed from the page's base URL
    for bad in ("/tfos_nb/tensorboard/0123abcd/", "http://evil/", "../x", "a//b"):
        with pytest.raises(ValueError):
            notebook_tensorboard.iframe_html(bad)


def test_layers_import_one_way() -> None:
    code = (
        "import sys, tfos_nb.tensorboard, tfos_nb.tensorboard.proxy._handlers\n"
        "bad = [m for m in ('tensorflow', 'pyspark', 'IPython') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "import tfos_nb.tbproxy; del sys.modules['tfos_nb.tensorboard.proxy._handlers']\n"
        # the name users enable is the extension itself
        "assert tfos_nb.tbproxy._load_jupyter_server_extension is tfos_nb.tensorboard.proxy._load_jupyter_server_extension\n"
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
def test_upstream_down_is_502(server: Server, register: Callable[[str], str]) -> None:
    with socket.socket() as held:  # bound, never listening: nothing else can serve this port meanwhile
        held.bind(("127.0.0.1", 0))
        cid = register(f"http://127.0.0.1:{held.getsockname()[1]}")
        assert server.fetch(tb_path(cid, "data/runs")).status == 502


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
