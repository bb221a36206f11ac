"""Turning a request path into the one upstream URL it may reach.

Pure functions, unit-tested without a server.  The upstream URL is always
``http://<registered host:port><path>``: the path is validated, never parsed for a
host, so nothing a browser sends can choose where the request goes.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from .._records import Endpoint

# RFC 3986 path characters without ':' and '@' (no TensorBoard route uses them; they
# are what authority-looking paths are made of).
_PATH_CHARS = re.compile(r"^/[A-Za-z0-9\-._~!$&'()*+,;=%/]*$")
# Encoded '/', '\', NUL and control characters would change what "a segment" is
# between us and upstream.
_BAD_ESCAPES = re.compile(r"%(?:2f|5c|[01][0-9a-f]|7f)", re.IGNORECASE)
_ESCAPE = re.compile(r"%(?![0-9a-fA-F]{2})")


class BadPath(ValueError):
    """A request path the proxy refuses to forward (answered with 400)."""


def check_path(raw_path: str) -> str:
    """Return ``raw_path`` (still percent-encoded) if it is a plain relative-safe path.

    Refused: anything not starting with '/', '//' anywhere, '.' or '..' segments (also
    percent-encoded), encoded slashes/backslashes/control characters, '@' and ':' (also
    encoded), and characters outside RFC 3986's path set.
    """
    if not _PATH_CHARS.match(raw_path):
        raise BadPath(f"path has characters the proxy does not forward: {raw_path!r}")
    if _ESCAPE.search(raw_path) or _BAD_ESCAPES.search(raw_path):
        raise BadPath(f"path has a forbidden percent-escape: {raw_path!r}")
    decoded = unquote(raw_path, errors="strict")
    if "//" in decoded or "@" in decoded or ":" in decoded or "\\" in decoded:
        raise BadPath(f"path looks like an authority or absolute URL: {raw_path!r}")
    if any(seg in (".", "..") for seg in decoded.split("/")):
        raise BadPath(f"path has dot segments: {raw_path!r}")
    return raw_path


def strip_query(query: str, drop: frozenset[str] = frozenset({"token"})) -> str:
    """The query without Jupyter's credentials (``?token=``); untouched otherwise."""
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(k in drop for k, _ in pairs):
        return query
    return urlencode([(k, v) for k, v in pairs if k not in drop])


def upstream_url(endpoint: Endpoint, raw_path: str, query: str = "", scheme: str = "http") -> str:
    """``scheme://host:port/path?query`` for the registered endpoint only."""
    if scheme not in ("http", "ws"):
        raise ValueError(f"scheme must be http or ws, got {scheme!r}")
    path = check_path(raw_path)
    query = strip_query(query)
    url = f"{scheme}://{endpoint.netloc}{path}" + (f"?{query}" if query else "")
    parts = urlsplit(url)
    # Belt and braces: whatever the checks above missed, the URL must still name the
    # registered endpoint.
    if (parts.hostname or "").lower() != endpoint.host.lower() or parts.port != endpoint.port or parts.username or parts.password:
        raise BadPath(f"path would leave the registered endpoint: {raw_path!r}")
    return url
