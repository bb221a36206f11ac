"""The one URL checker: what a TensorBoard's address may be, wherever one is taken in.

The kernel registers a URL with the Jupyter server's proxy (``tfos_nb.tensorboard.register``), the
driver takes one from the chief's heartbeat (``news.py``), the proxy reads a host from an endpoint
record (``tfos_nb/tensorboard/_records.py``): each asks here.  Standard library only.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from .ports import same_address

_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def check_host(host: object) -> str:
    """``host`` when it is an IP address or a DNS name; else ValueError."""
    if not isinstance(host, str):
        msg = f"host must be a string, got {host!r}"
        raise ValueError(msg)
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not _HOSTNAME_RE.match(host):
        msg = f"host must be an IP address or a DNS name, got {host!r}"
        raise ValueError(msg)
    return host


def check_url(url: str, host: str | None = None) -> tuple[str, int]:
    """``(host, port)`` of ``url`` when it is a TensorBoard's root, ``http://host:port`` and nothing else.

    With ``host``, the URL must name that address (``::ffff:10.0.0.5`` is ``10.0.0.5``).  Else
    ValueError, saying why.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        msg = f"url must look like http://host:port, got {url!r}"
        raise ValueError(msg) from exc
    if (parts.scheme != "http" or not parts.hostname or port is None or not 0 < port < 65536 or parts.username
            or parts.password):
        msg = f"url must look like http://host:port, got {url!r}"
        raise ValueError(msg)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        msg = f"url must be TensorBoard's root, http://host:port, got {url!r}"
        raise ValueError(msg)
    if host is not None and not (host and same_address(parts.hostname, host)):
        msg = f"url must name {host!r}, got {url!r}"
        raise ValueError(msg)
    return check_host(parts.hostname), port
