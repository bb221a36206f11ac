"""What the TensorBoard proxy refuses, by status code, and that nothing refused reaches an upstream: crafted
paths (never sent on, neither to the registered upstream nor to a canary nobody registered), requests without
Jupyter's login, a foreign page's websocket, unknown or withdrawn cluster ids, and endpoint records it must not
trust.  The setup (a real ``jupyter server``, TensorBoard, echo upstreams) is ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.server_abuse import nobody_http_server
from tests.tbproxy.conftest import Server, _ws, tb_path, upstream_log
from tfos_nb import tensorboard as notebook_tensorboard
from tfos_nb.tensorboard import _records
from tfos_nb.tensorboard.proxy import _urls

slow = pytest.mark.slow


@pytest.mark.parametrize(
    "raw",
    ["/../x", "/a/..", "/%2e%2e/x", "/%2E./x", "/a%2Fb", "/a%2fb", "/a%5cb", "/a\\b", "//evil/", "/@evil", "/%40evil",
     "/http://evil/", "/evil:80/",
     "/127.0.0.1:22/", "/%3a", "/a%00", "/a%zz", "/a b", "x", "", "/a/./b"],
)  # fmt: skip
def test_check_path_refuses(raw: str) -> None:
    with pytest.raises(_urls.BadPath):
        _urls.check_path(raw)

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
    assert notebook_tensorboard.withdraw(cid)
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
def test_a_port_held_by_another_user_is_never_proxied(server: Server, register: Callable[[str], str]) -> None:
    """Issue 51, finding 3: between a TensorBoard's exit and the withdrawal of its route (the chief's, until its
    next heartbeat), the registered loopback port may be taken by another local user.  The proxy checks, on
    every request, whose socket the port is (Linux's socket table): uid ``nobody``'s → 502, and its server
    is never contacted, over HTTP or websocket."""
    with nobody_http_server() as (port, hits):
        cid = register(f"http://127.0.0.1:{port}")
        for method in ("GET", "POST"):
            resp = server.fetch(tb_path(cid, ""), method, body=b"" if method == "POST" else None)
            assert resp.status == 502 and b"nobody" not in resp.body, (method, resp.status, resp.body[:200])
        from tornado import httpclient

        with pytest.raises(httpclient.HTTPClientError) as err:
            asyncio.run(_ws(server, tb_path(cid, "ws"), {"Authorization": f"token {server.token}"}))
        assert err.value.code == 502
        assert hits() == 0
