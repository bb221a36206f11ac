"""TensorBoard's HTML in a cell: the iframe / link resolved against the page's base URL, per frontend.

Pure functions of a proxy path (``tensorboard.proxy_path``): no server, no process, nothing of IPython.
"""

from __future__ import annotations

import html
import json
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from ._records import new_secret

# Resolves one element's src/href against the page's base URL: JupyterLab / Notebook 7's
# <script id="jupyter-config-data"> (PageConfig baseUrl), classic Notebook's <body data-base-url>,
# or failing both the page's own path.  Every element with the id gets it (a panel re-rendered in
# place may briefly hold two).  An iframe gets its src only once the route answers (TensorBoard
# takes seconds to start after the chief reports it): a same-origin GET every second, for at most
# five minutes, stopping when the element leaves the page; and only once it is visible (a panel's
# tab opened), so that TensorBoard loads with the data written by then, not an empty log directory.
_RESOLVE_JS = """(function () {
  var base = null;
  var cfg = document.getElementById("jupyter-config-data");
  if (cfg) { try { base = JSON.parse(cfg.textContent).baseUrl; } catch (e) {} }
  if (!base && document.body && document.body.dataset) { base = document.body.dataset.baseUrl; }
  if (!base) {
    var m = window.location.pathname.match(/^(.*?\\/)(?:lab|tree|notebooks|doc|voila|edit)(?:\\/|$)/);
    base = m ? m[1] : "/";
  }
  if (base.charAt(base.length - 1) !== "/") { base += "/"; }
  var direct = %(direct)s, failed = %(failed)s, deadline = Date.now() + 1000 * %(deadline)s;
  var url = direct ? new URL(direct, window.location.href).href : new URL(base + %(path)s, window.location.origin).href;
  var attr = %(attr)s, tries = 0, ready = false;
  function elements() { return document.querySelectorAll('[id=' + JSON.stringify(%(id)s) + ']'); }
  function note(text, color) {
    document.querySelectorAll('[id=' + JSON.stringify(%(id)s + "-note") + ']').forEach(function (el) {
      el.style.display = text ? "" : "none"; el.style.color = color || "#888"; el.textContent = text || "";
    });
  }
  function missed(status) {
    // the route did not answer in time: say why, as far as the page can tell, and what to do
    if (direct) { note(failed.direct.replace("%%URL%%", url), "#dc322f"); return; }
    fetch(base + "tfos_nb/tensorboard/", {credentials: "same-origin"}).then(function (r) {
      note((r.ok ? failed.starting : failed.extension).replace("%%URL%%", url), "#dc322f");
    }, function () { note(failed.server.replace("%%URL%%", url), "#dc322f"); });
  }
  function set() {
    elements().forEach(function (el) { if (el.getAttribute(attr) !== url) { el.setAttribute(attr, url); } });
  }
  function showWhenVisible() {
    var hidden = false;
    elements().forEach(function (el) {
      if (el.getAttribute(attr) === url) { return; }
      if (el.getClientRects().length) { el.setAttribute(attr, url); } else { hidden = true; }
    });
    if (hidden) { setTimeout(showWhenVisible, 1000); }
  }
  function poll() {
    if (!elements().length) { return; }
    if (ready) { showWhenVisible(); return; }
    if (++tries > 300) { return; }
    if (deadline && Date.now() > deadline) { deadline = 0; missed(); }
    var opts = direct ? {mode: "no-cors"} : {credentials: "same-origin"};
    fetch(url, opts).then(function (r) {
      if (r.ok || r.type === "opaque") { ready = true; note(""); showWhenVisible(); } else { setTimeout(poll, 1000); }
    }, function () { setTimeout(poll, 1000); });
  }
  if (attr === "src") { if (deadline) { note(failed.waiting); } poll(); } else { set(); }
})();"""


def _check_path(path: str) -> str:
    if not isinstance(path, str) or path.startswith("/") or "//" in path or ".." in path or ":" in path or "<" in path:
        msg = f"path must be a proxy path relative to the base URL, like 'tfos_nb/tensorboard/<id>/', got {path!r}"
        raise ValueError(msg)
    return path


def _js_json(value: Any) -> str:
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _resolve_script(element_id: str, attr: str, path: str, direct: str | None = None, deadline: float = 0,
                    node_url: str | None = None) -> str:
    # ids are [a-z0-9-]; every other value goes through _js_json, which escapes "<", ">" and "&".
    failed = missing_messages(node_url)
    values = {"id": json.dumps(element_id), "attr": json.dumps(attr), "path": _js_json(path), "direct": _js_json(direct),
              "deadline": json.dumps(deadline), "failed": _js_json(failed)}
    return "<script>" + _RESOLVE_JS % values + "</script>"


ANSWER_DEADLINE_S = 20.0  # after this long without an answer, the frame says why it is empty


def missing_messages(node_url: str | None = None) -> dict[str, str]:
    """What an embedded TensorBoard frame says when its URL does not answer (``%URL%``: the URL tried)."""
    reach = (f" TensorBoard itself listens at {node_url}: open it from a browser that can reach that address"
             if node_url else "")
    proxy = (" Front-ends with a proxy of their own: set TENSORBOARD_PROXY_URL in the kernel's environment "
             "(e.g. /proxy/%PORT%/ with jupyter-server-proxy; %PORT% and %HOST% are filled in).")
    return {
        "waiting": "Waiting for TensorBoard…",
        "starting": "TensorBoard does not answer yet at %URL%: the Jupyter server's tfos_nb extension is there, "
        "TensorBoard may still be starting (the frame appears when it answers) or its cluster has ended "
        "(%tfos_tensorboard --logdir DIR starts one on the driver)." + reach,
        "extension": "TensorBoard's route %URL% does not exist on this Jupyter server: its tfos_nb extension is "
        "not enabled. Run `jupyter server extension enable tfos_nb.tbproxy` in the server's environment and "
        "restart the server." + proxy + reach,
        "server": "No Jupyter server answers at %URL%: this front-end (VS Code, Colab, a hosted notebook) does "
        "not serve the tfos_nb route." + proxy + reach,
        "direct": "TensorBoard does not answer at %URL% (from TENSORBOARD_PROXY_URL): check that the proxy "
        "reaches TensorBoard's host and port." + reach,
    }


def proxy_url_from_env(node_url: str, environ: Any = None) -> str | None:
    """``TENSORBOARD_PROXY_URL`` with ``%PORT%`` (and ``%HOST%``) of ``node_url`` filled in, as TensorBoard's own
    ``%tensorboard`` does; None when it is not set."""
    template = (os.environ if environ is None else environ).get("TENSORBOARD_PROXY_URL")
    if not template:
        return None
    parts = urlsplit(node_url)
    return template.replace("%PORT%", str(parts.port or "")).replace("%HOST%", parts.hostname or "")


def hosted_message(node_url: str | None = None, environ: Any = None) -> str | None:
    """What to show instead of a frame in a hosted notebook whose page has no Jupyter server behind it
    (Databricks: ``DATABRICKS_RUNTIME_VERSION`` set, no ``TENSORBOARD_PROXY_URL``); None elsewhere."""
    env = os.environ if environ is None else environ
    if env.get("TENSORBOARD_PROXY_URL") or not env.get("DATABRICKS_RUNTIME_VERSION"):
        return None
    where = f"TensorBoard listens at {node_url}, but a" if node_url else "A"
    return (f"{where} Databricks notebook has no Jupyter server to show it through: use Databricks' own "
            "`%load_ext tensorboard` then `%tensorboard --logdir DIR` with the run's log directory (on /dbfs/... or "
            "/Volumes/...), or set TENSORBOARD_PROXY_URL in the kernel's environment to a proxy that reaches the node "
            "(%PORT% and %HOST% are filled in).")


def frontend(shell: Any) -> str:
    """Where this kernel's output goes, as far as the kernel can tell: ``terminal`` (IPython without a
    kernel), ``colab``, ``proxy`` (TENSORBOARD_PROXY_URL set), ``databricks`` (no Jupyter server behind
    the page: :func:`hosted_message`), else ``jupyter`` (a Jupyter server's page, which may or may not run
    the tfos_nb extension: the page's script finds out)."""
    if shell is None or getattr(shell, "kernel", None) is None:
        return "terminal"
    if "google.colab" in sys.modules:
        return "colab"
    if os.environ.get("TENSORBOARD_PROXY_URL"):
        return "proxy"
    if hosted_message() is not None:
        return "databricks"
    return "jupyter"


def frontend_output(where: str, path: str, node_url: str, *, height: int = 800) -> tuple[str | None, str]:
    """What ``%tfos_tensorboard`` shows on a front-end (see :func:`frontend`): ``(frame HTML or None, text line)``.

    A terminal gets the URLs (as TensorBoard's own ``%tensorboard`` prints one there); Colab and Databricks,
    whose pages have no Jupyter server route, get what to use instead; a page gets the frame and the URL it loads.
    """
    if where == "terminal":
        return None, f"TensorBoard: {node_url} (through a Jupyter server with the tfos_nb extension: <Jupyter base URL>/{path})"
    if where == "colab":
        return None, (f"TensorBoard listens at {node_url}, but Colab has no Jupyter server to proxy it: for a log "
                      "directory on this machine use TensorBoard's own `%load_ext tensorboard` then `%tensorboard --logdir DIR`")
    if where == "databricks":
        return None, hosted_message(node_url, {"DATABRICKS_RUNTIME_VERSION": "any"}) or ""
    proxied = proxy_url_from_env(node_url)
    return embed_html(path, node_url, height=height), f"TensorBoard: {proxied or '<Jupyter base URL>/' + path}"


def embed_html(path: str, node_url: str | None, *, height: int = 800, deadline: float = ANSWER_DEADLINE_S) -> str:
    """The frame for a TensorBoard: through TENSORBOARD_PROXY_URL when set (with the node's port), else
    through the Jupyter server's tfos_nb route ``path``; either says why when it does not answer."""
    direct = proxy_url_from_env(node_url) if node_url else None
    return iframe_html(path, height=height, direct=direct, deadline=deadline, node_url=node_url)


def iframe_html(path: str, *, height: int = 800, direct: str | None = None, deadline: float = 0,
                node_url: str | None = None) -> str:
    """HTML embedding the proxy ``path`` in an iframe whose src is built in the browser.

    ``direct``: a URL to frame instead (TENSORBOARD_PROXY_URL's), relative to the page or
    absolute.  ``deadline`` (seconds): a line above the frame says "waiting", then, when
    the URL has not answered by then, why as far as the page can tell (no tfos_nb extension
    on the Jupyter server, no Jupyter server, TensorBoard not up) and what to do.

    The base URL comes from JupyterLab / Notebook 7's ``<script id="jupyter-config-data">``
    (PageConfig ``baseUrl``), classic Notebook's ``<body data-base-url>``, or failing both,
    the page's own path; so the same output works under JupyterHub's ``/user/NAME/``.
    """
    _check_path(path)
    if not isinstance(height, int) or isinstance(height, bool) or height <= 0:
        msg = f"height must be a positive int, got {height!r}"
        raise ValueError(msg)
    frame_id = "tfos-tb-" + new_secret()[:12]
    note = ""
    if deadline:  # shown as is where no script runs; the script replaces it (waiting, gone, or why it failed)
        note = (f'<div id="{frame_id}-note" style="font-family:monospace;font-size:12px;color:#888">'
                f"TensorBoard: {html.escape(direct or '<Jupyter base URL>/' + path)} (this front-end ran no script: "
                "open that URL in the browser)</div>")
    return note + (
        f'<iframe id="{frame_id}" width="100%" height="{height}" frameborder="0" '
        f'title="TensorBoard" data-tfos-path="{html.escape(path)}"></iframe>\n'
        + _resolve_script(frame_id, "src", path, direct, deadline, node_url)
    )


def link_html(path: str, text: str = "TensorBoard", *, element_id: str | None = None) -> str:
    """A plain link to the proxy ``path`` (opens in a new browser tab), href built in the browser like :func:`iframe_html`.

    ``element_id`` (``[a-z0-9-]``) makes the output deterministic, for a panel re-rendered in place.
    """
    _check_path(path)
    element_id = element_id or "tfos-tbl-" + new_secret()[:12]
    if not all(c.isdigit() or "a" <= c <= "z" or c == "-" for c in element_id):
        msg = f"element_id must be lowercase letters, digits and dashes, got {element_id!r}"
        raise ValueError(msg)
    return (
        f'<a id="{element_id}" target="_blank" rel="noopener" title="TensorBoard, through the Jupyter server" '
        f'data-tfos-path="{html.escape(path)}">{html.escape(text)}</a>' + _resolve_script(element_id, "href", path)
    )
