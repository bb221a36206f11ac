"""What the driver takes from a heartbeat about the chief's TensorBoard, and what it refuses.

The URL goes to the Jupyter server's proxy, so it is taken only from the node that was
asked to run TensorBoard (the chief) and only when it names that node's own registered
host: no node can point the proxy at another node or machine.  The chief's supervisor
reports a URL only once its own TensorBoard process listens and answers there
(``chief.py``), and an error, with TensorBoard's last lines, when it exits
or never listens; the error withdraws the URL.
"""

from __future__ import annotations

import logging

from ..driver.control import state
from ..net import hostport
from ..protocol import messages
from .urls import check_url

log = logging.getLogger(__name__)


def tensorboard_news(node: state.NodeRecord, runs_tensorboard: bool, msg: messages.Heartbeat) -> list[str]:
    """Apply ``msg``'s TensorBoard URL or error to ``node`` (state lock held); the lines it adds to its log.

    ``runs_tensorboard``: the node's spec asked it to start TensorBoard (the chief of a
    ``tensorboard=True`` cluster).
    """
    if msg.tensorboard is None and msg.tensorboard_error is None:
        return []
    if not runs_tensorboard:
        log.warning("ignored TensorBoard news from %s: only the chief runs TensorBoard", node.label)
        return []
    if msg.tensorboard_error:
        if node.tensorboard_error == msg.tensorboard_error:
            return []
        node.tensorboard, node.tensorboard_error = None, msg.tensorboard_error
        first, *rest = msg.tensorboard_error.splitlines() or [""]
        return [f"[tfos_nb] no TensorBoard: {first}", *(f"[tensorboard] {line}" for line in rest)]
    url = checked_url(str(msg.tensorboard), node.host)
    if url is None:
        log.warning("ignored TensorBoard URL %r from %s: not http://<its host %s>:<port>",
                    msg.tensorboard, node.label, node.host)
        return []
    node.tensorboard = url
    return []


def checked_url(url: str, host: str) -> str | None:
    """``http://<host>:<port>`` when ``url`` is TensorBoard's root on ``host`` and nothing else; else None."""
    try:
        _, port = check_url(url, host)
    except ValueError:
        return None
    return f"http://{hostport(host, port)}"
