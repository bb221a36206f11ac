"""Tornado handlers of the TensorBoard proxy, and the traitlets that configure them.

Why tornado directly, not jupyter-server-proxy (>= 4.2):

* The route must reach *only* endpoints a kernel of this user registered, keyed by an
  opaque cluster id.  jupyter-server-proxy's generic routes are ``/proxy/<host>:<port>``
  with a host-only allow-list (any port on an allowed host passes); to key on a record
  we would subclass its ``ProxyHandler`` and override host/port resolution, i.e. depend
  on internals whose signatures changed between 3.x and 4.x.
* It is another dependency of the Jupyter server with a history of authentication
  advisories (unauthenticated websockets before 4.1.1/3.2.3, a further CVE fixed in
  4.2); pinning it would be our users' burden.
* What we need is small and reviewable here: ``JupyterHandler`` gives Jupyter's own
  authentication (token, cookie, JupyterHub's identity provider) and origin checks,
  ``AsyncHTTPClient`` / ``websocket_connect`` do the forwarding, and we control exactly
  which headers cross in each direction (no credentials upstream, no cookies or CORS
  headers back).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
from typing import TYPE_CHECKING, Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import origin_matches_pat, url_path_join
from tornado import httpclient, web, websocket
from traitlets import Float, Int, List, Unicode
from traitlets.config import Configurable

from ...runtime.net import resolve
from ...runtime.tensorboard.ports import is_local_address, listener_uids
from .._records import CLUSTER_ID_RE, Endpoint, read_record
from ._urls import BadPath, upstream_url

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

ROUTE = "tfos_nb/tensorboard"

# RFC 9110 7.6.1 hop-by-hop headers, plus what must not cross the proxy.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Trailers",
        "Transfer-Encoding",
        "Upgrade",
    )
)
# Jupyter's credentials stay with Jupyter: TensorBoard may run on a shared executor host.
_NOT_UPSTREAM = _HOP_BY_HOP | {"host", "cookie", "authorization", "x-xsrftoken", "x-csrftoken", "content-length", "origin", "referer"}
_NOT_UPSTREAM_WS = _NOT_UPSTREAM | {
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-accept",
    "sec-websocket-protocol",
}
# Nothing upstream says may weaken the Jupyter origin: no cookies, no CORS.
_NOT_DOWNSTREAM = _HOP_BY_HOP | {"set-cookie", "content-length", "server", "date"}


def _connection_tokens(headers: Any) -> set[str]:
    return {t.strip().lower() for v in headers.get_list("Connection") for t in v.split(",") if t.strip()}


@functools.lru_cache(maxsize=64)
def _on_this_machine(host: str) -> str | None:
    """``host``'s address when it is this machine's, else None; resolved once per host, not on every request."""
    address = resolve(host)
    return address if is_local_address(address) else None


def _uids(users: list[str]) -> set[int]:
    import pwd

    found = set()
    for user in users:
        try:
            found.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            pass  # an account this machine lacks trusts nothing
    return found


class TensorBoardProxy(Configurable):
    """Settings of the ``tfos_nb.tbproxy`` server extension (``c.TensorBoardProxy.*``)."""

    connect_timeout = Float(10.0, help="Seconds to wait for a TCP connection to a registered TensorBoard.").tag(config=True)
    request_timeout = Float(120.0, help="Seconds an upstream HTTP request may take in all.").tag(config=True)
    max_body_size = Int(256 * 1024 * 1024, help="Largest upstream response, in bytes, the proxy relays.").tag(config=True)
    websocket_max_message_size = Int(16 * 1024 * 1024, help="Largest websocket message, in bytes, relayed in either direction.").tag(
        config=True
    )
    trusted_users = List(Unicode(), default_value=[], help="Other accounts whose TensorBoard on this machine may be proxied besides this "
                         "server's own: the Spark workers' account where executors run as a service user on the hub's "
                         "machine (a shared standalone cluster). Their ports are then trusted as this user's.").tag(config=True)


class TensorBoardProxyHandler(WebSocketMixin, websocket.WebSocketHandler, JupyterHandler):
    """``<base_url>tfos_nb/tensorboard/<cluster_id>/<path>`` → the registered TensorBoard.

    Authentication is Jupyter's (403 without it, HTTP and websocket alike: WebSocketMixin
    makes ``prepare`` refuse rather than redirect).  The cluster id is resolved on every
    request from this server's runtime directory; unknown, withdrawn or untrusted → 404.
    """

    auth_resource = "tfos_nb"

    def initialize(self, proxy_config: TensorBoardProxy) -> None:
        self.proxy_config = proxy_config
        self._upstream_ws: websocket.WebSocketClientConnection | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._opened = False

    # -- authentication helpers ------------------------------------------------
    def check_xsrf_cookie(self) -> None:
        """Cookie-authenticated POSTs from TensorBoard's own page carry no ``_xsrf``.

        Browsers send ``Origin`` on every POST; a same-origin one is what XSRF protection
        is meant to establish, so it is accepted.  Anything else gets Jupyter's check.
        """
        if getattr(self, "_jupyter_current_user", None) is not None and not self.token_authenticated:
            origin = self.request.headers.get("Origin")
            host = self.request.headers.get("Host")
            if origin and host and origin.lower() in (f"http://{host.lower()}", f"https://{host.lower()}"):
                return None
        return super().check_xsrf_cookie()

    def set_cors_headers(self) -> None:
        """Only the CORS policy an administrator configured (``ServerApp.allow_origin[_pat]``).

        Jupyter also reflects any ``Origin`` for token-authenticated requests; proxied
        TensorBoard pages get no such default, so the proxy adds no CORS header of its own.
        """
        if self.allow_origin:
            self.set_header("Access-Control-Allow-Origin", self.allow_origin)
        elif self.allow_origin_pat:
            origin = self.get_origin()
            if origin and origin_matches_pat(self.allow_origin_pat, origin):
                self.set_header("Access-Control-Allow-Origin", origin)
        if (self.allow_origin or self.allow_origin_pat) and self.allow_credentials:
            self.set_header("Access-Control-Allow-Credentials", "true")

    async def _authorize(self) -> None:
        if self.current_user is None:
            raise web.HTTPError(403)
        action = "read" if self.request.method in ("GET", "HEAD") else "write"
        allowed = self.authorizer.is_authorized(self, self.current_user, action, self.auth_resource)
        if inspect.isawaitable(allowed):  # custom authorizers may be async
            allowed = await allowed
        if not allowed:
            raise web.HTTPError(403)

    def _resolve(self, cluster_id: str) -> tuple[Endpoint, str]:
        """The registered endpoint and the (validated, still encoded) upstream path."""
        if not CLUSTER_ID_RE.match(cluster_id):
            raise web.HTTPError(404)
        if self.serverapp is None:  # a handler outside a Jupyter server application
            raise web.HTTPError(500)
        endpoint = read_record(self.serverapp.runtime_dir, cluster_id)
        if endpoint is None:
            raise web.HTTPError(404)
        self._check_listener(endpoint)
        prefix = url_path_join(self.base_url, ROUTE, cluster_id)
        raw = self.request.path
        if not raw.startswith(prefix + "/"):
            raise web.HTTPError(404)
        return endpoint, raw[len(prefix) :]

    def _check_listener(self, endpoint: Endpoint) -> None:
        """On this machine, the registered port must be held by this server's user, checked on every request.

        A TensorBoard that exited freed its port, and another local user may bind it before its route is
        withdrawn; what they serve there would run on Jupyter's origin.  Another machine's socket table is
        out of reach: the check covers loopback and this machine's own addresses (the embedded Spark's
        chief, a ``%tfos_tensorboard --logdir`` TensorBoard).
        """
        address = _on_this_machine(endpoint.host)
        if address is None:
            return
        uids = listener_uids(address, endpoint.port)
        if uids - {os.getuid(), *_uids(self.proxy_config.trusted_users)}:
            self.log.warning("tfos_nb TensorBoard proxy: %s is held by uid %s, not this server's (%d): refused",
                             endpoint.netloc, ",".join(map(str, sorted(uids))), os.getuid())
            raise web.HTTPError(502, "TensorBoard is not reachable")

    def _url(self, endpoint: Endpoint, path: str, scheme: str) -> str:
        try:
            return upstream_url(endpoint, path, self.request.query, scheme=scheme)
        except BadPath as exc:
            raise web.HTTPError(400, str(exc)) from None

    # -- HTTP ------------------------------------------------------------------
    async def get(self, cluster_id: str, path: str = "") -> None:
        if self.request.headers.get("Upgrade", "").lower() == "websocket":
            await self._open_websocket(cluster_id)
            return
        await self._proxy_http(cluster_id)

    async def head(self, cluster_id: str, path: str = "") -> None:
        await self._proxy_http(cluster_id)

    async def post(self, cluster_id: str, path: str = "") -> None:
        await self._proxy_http(cluster_id)

    async def _proxy_http(self, cluster_id: str) -> None:
        await self._authorize()
        endpoint, path = self._resolve(cluster_id)
        url = self._url(endpoint, path, "http")
        drop = _NOT_UPSTREAM | _connection_tokens(self.request.headers)
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in drop}
        method = self.request.method or "GET"
        body = self.request.body if method == "POST" else None
        req = httpclient.HTTPRequest(
            url,
            method=method,
            headers=headers,
            body=body,
            follow_redirects=False,
            decompress_response=False,
            allow_nonstandard_methods=True,
            connect_timeout=self.proxy_config.connect_timeout,
            request_timeout=self.proxy_config.request_timeout,
        )
        client = httpclient.AsyncHTTPClient(max_body_size=self.proxy_config.max_body_size)
        try:
            resp = await client.fetch(req, raise_error=False)
        except (OSError, httpclient.HTTPClientError) as exc:
            self.log.warning("tfos_nb TensorBoard proxy: %s unreachable: %s", endpoint.netloc, exc)
            raise web.HTTPError(502, "TensorBoard is not reachable") from None
        if resp.code == 599:
            self.log.warning("tfos_nb TensorBoard proxy: %s failed: %s", endpoint.netloc, resp.error)
            raise web.HTTPError(502 if not isinstance(resp.error, TimeoutError) else 504, "TensorBoard is not reachable")
        self.set_status(resp.code, resp.reason)
        self.clear_header("Content-Type")
        drop_down = _NOT_DOWNSTREAM | _connection_tokens(resp.headers)
        origin = f"http://{endpoint.netloc}"
        for name, value in resp.headers.get_all():
            lname = name.lower()
            if lname in drop_down or lname.startswith("access-control-"):
                continue
            if lname == "location" and value.startswith(origin):
                value = url_path_join(self.base_url, ROUTE, cluster_id) + value[len(origin) :]
            self.add_header(name, value)
        if method != "HEAD" and resp.code not in (204, 304) and resp.body:
            self.write(resp.body)
        await self.finish()

    # -- websockets ------------------------------------------------------------
    async def _open_websocket(self, cluster_id: str) -> None:
        await self._authorize()
        endpoint, path = self._resolve(cluster_id)
        url = self._url(endpoint, path, "ws")
        # Jupyter's origin check runs in WebSocketHandler.get, after the upstream connection below: a request it
        # refuses (a foreign page riding the browser's cookie) must cost TensorBoard no connection, so check first.
        refused = self._cross_origin_refused()
        if refused is not None:
            self.log.warning("tfos_nb TensorBoard proxy: websocket refused: %s", refused)
            raise web.HTTPError(403, "Cross origin websockets not allowed")
        drop = _NOT_UPSTREAM_WS | _connection_tokens(self.request.headers)
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in drop}
        subprotocols = [p.strip() for p in self.request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        req = httpclient.HTTPRequest(
            url, headers=headers, connect_timeout=self.proxy_config.connect_timeout, request_timeout=self.proxy_config.connect_timeout
        )
        try:
            self._upstream_ws = await websocket.websocket_connect(
                req, subprotocols=subprotocols or None, max_message_size=self.proxy_config.websocket_max_message_size
            )
        except (OSError, httpclient.HTTPClientError, websocket.WebSocketError, asyncio.TimeoutError) as exc:
            self.log.warning("tfos_nb TensorBoard proxy: websocket to %s failed: %s", endpoint.netloc, exc)
            raise web.HTTPError(502, "upstream websocket refused") from None
        try:
            await websocket.WebSocketHandler.get(self, cluster_id)
        finally:
            if not self._opened and self._upstream_ws is not None:  # refused after all: on_close will not run
                self._upstream_ws.close()
                self._upstream_ws = None

    def _cross_origin_refused(self) -> str | None:
        """Why tornado's websocket handshake would refuse this request's origin, else None (its own algorithm)."""
        check = getattr(self, "_check_cross_origin", None)
        if check is not None:  # tornado >= 6.5: Sec-Fetch-Site, then Origin
            refused: str | None = check(self.check_origin)
            return refused
        origin = self.request.headers.get("Origin") or self.request.headers.get("Sec-Websocket-Origin")
        return None if origin is None or self.check_origin(origin) else f"Origin {origin!r} not allowed"

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        chosen = self._upstream_ws.selected_subprotocol if self._upstream_ws is not None else None
        return chosen if chosen in subprotocols else None

    def get_compression_options(self) -> dict[str, Any] | None:
        return None

    def open(self, *args: Any, **kwargs: Any) -> None:
        self._opened = True
        super().open(*args, **kwargs)
        self._pump_task = asyncio.ensure_future(self._pump_upstream())

    async def _pump_upstream(self) -> None:
        upstream = self._upstream_ws
        assert upstream is not None
        while True:
            msg = await upstream.read_message()
            if msg is None:
                break
            try:
                await self.write_message(msg, binary=isinstance(msg, bytes))
            except websocket.WebSocketClosedError:
                break
        self.close(upstream.close_code, upstream.close_reason)

    async def on_message(self, message: str | bytes) -> None:
        if self._upstream_ws is None:
            return
        try:
            await self._upstream_ws.write_message(message, binary=isinstance(message, bytes))
        except websocket.WebSocketClosedError:
            self.close()

    def on_close(self) -> None:
        if self.ping_callback is not None:
            self.ping_callback.stop()
        if self._upstream_ws is not None:
            self._upstream_ws.close()
            self._upstream_ws = None


class TensorBoardRootHandler(JupyterHandler):
    """``…/tfos_nb/tensorboard/<id>`` → ``…/<id>/``: TensorBoard's relative URLs need the slash."""

    auth_resource = "tfos_nb"

    @web.authenticated
    def get(self, cluster_id: str) -> None:
        if not CLUSTER_ID_RE.match(cluster_id):
            raise web.HTTPError(404)
        target = url_path_join(self.base_url, ROUTE, cluster_id) + "/"
        self.redirect(target + (f"?{self.request.query}" if self.request.query else ""))

    head = get


class StatusHandler(JupyterHandler):
    """``…/tfos_nb/tensorboard/``: 200 to a logged-in user, so a page can tell "extension enabled" from "no route"."""

    auth_resource = "tfos_nb"

    @web.authenticated
    def get(self) -> None:
        from ... import __version__

        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"tfos_nb": __version__}))

    head = get


def setup_handlers(serverapp: ServerApp) -> None:
    config = TensorBoardProxy(parent=serverapp)
    base = serverapp.web_app.settings["base_url"]
    # The id group is permissive on purpose: the handlers answer a malformed id with 404
    # (after authentication), instead of letting it fall through to other routes.
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, ROUTE) + "/?", StatusHandler),
            (url_path_join(base, ROUTE, r"([^/]+)"), TensorBoardRootHandler),
            (url_path_join(base, ROUTE, r"([^/]+)(/.*)"), TensorBoardProxyHandler, {"proxy_config": config}),
        ],
    )
    serverapp.log.info("tfos_nb: TensorBoard proxy at %s", url_path_join(base, ROUTE, "<cluster_id>/"))
