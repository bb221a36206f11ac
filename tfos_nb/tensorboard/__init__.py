"""TensorBoard in the notebook: its kernel side, its HTML, and the Jupyter server's proxy (``proxy/``).

The kernel registers a cluster's TensorBoard with the proxy and starts one of its own for a log
directory (``_kernel.py``); ``_html.py`` embeds and links it per frontend; ``_records.py`` is the
endpoint record both the kernel and the proxy read; ``proxy/`` is the Jupyter server extension
(enabled as ``tfos_nb.tbproxy``), which imports neither pyspark nor TensorFlow.  The runtime's
halves (the chief's TensorBoard, what the driver takes from its heartbeat) and the port finder and
URL checker every side calls are in ``tfos_nb.runtime.tensorboard``, below this package.
"""

from __future__ import annotations

from ._html import (
    ANSWER_DEADLINE_S,
    embed_html,
    frontend,
    frontend_output,
    hosted_message,
    iframe_html,
    link_html,
    missing_messages,
    proxy_url_from_env,
)
from ._kernel import (
    ClusterRoute,
    LocalStartFailed,
    LocalTensorBoard,
    local_cluster_id,
    proxy_path,
    register,
    start_local,
    stop_local,
    withdraw,
)

__all__ = ["ANSWER_DEADLINE_S", "ClusterRoute", "LocalStartFailed", "LocalTensorBoard", "embed_html", "frontend",
           "frontend_output", "hosted_message", "iframe_html", "link_html", "local_cluster_id", "missing_messages",
           "proxy_path", "proxy_url_from_env", "register", "start_local", "stop_local", "withdraw"]
