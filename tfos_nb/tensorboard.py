"""TensorBoard in the notebook, through the Jupyter server's ``tfos_nb.tbproxy`` route.

Kernel side: :func:`register` tells the Jupyter server (through a private file in
Jupyter's runtime directory) where a cluster's TensorBoard listens and returns the
proxy path; :func:`withdraw` ends that; :func:`start_local` starts TensorBoard on the
driver for a log directory after the cluster is gone; :class:`ClusterRoute` keeps a
``--tensorboard`` cluster registered while it runs; :func:`iframe_html` and
:func:`link_html` embed / link a proxy path, resolving it against the page's base URL
in the browser (so JupyterHub's ``/user/NAME/`` prefix is never hard-coded in the kernel).

Imports neither IPython nor TensorFlow nor pyspark (TensorBoard's manager only inside
:func:`start_local`).
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ._tb_html import (  # the HTML half, re-exported: tensorboard.iframe_html(...) etc.
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
from .runtime.procs import pid_alive as _pid_alive
from .tbproxy._records import Endpoint, check_cluster_id, check_host, new_secret, remove_record, write_record

__all__ = ["ANSWER_DEADLINE_S", "ClusterRoute", "LocalTensorBoard", "embed_html", "frontend", "frontend_output", "hosted_message",
           "iframe_html", "link_html", "missing_messages",
           "proxy_path", "proxy_url_from_env", "register", "start_local", "withdraw"]

_lock = threading.Lock()
_secrets: dict[str, str] = {}  # cluster id -> secret of the record this process wrote
_atexit_registered = False


def _runtime_dir() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return jupyter_runtime_dir()


def proxy_path(cluster_id: str) -> str:
    """``tfos_nb/tensorboard/<cluster_id>/``, relative to the Jupyter server's base URL."""
    return f"tfos_nb/tensorboard/{check_cluster_id(cluster_id)}/"


def register(cluster_id: str, url: str) -> str:
    """Let the Jupyter server proxy ``url`` (``http://host:port``) for ``cluster_id``.

    Writes ``<jupyter runtime dir>/tfos_nb/<cluster_id>.json`` (mode 0600, directory
    0700) and returns the proxy path, relative to the server's base URL.  Registering
    again replaces the record.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None or parts.username or parts.password:
        msg = f"url must look like http://host:port, got {url!r}"
        raise ValueError(msg)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        msg = f"url must be TensorBoard's root, http://host:port, got {url!r}"
        raise ValueError(msg)
    endpoint = Endpoint(
        cluster_id=check_cluster_id(cluster_id), host=check_host(parts.hostname), port=parts.port, secret=new_secret(), pid=os.getpid()
    )
    global _atexit_registered
    with _lock:
        write_record(_runtime_dir(), endpoint)
        _secrets[cluster_id] = endpoint.secret
        if not _atexit_registered:
            atexit.register(_withdraw_all)
            _atexit_registered = True
    return proxy_path(cluster_id)


def withdraw(cluster_id: str) -> bool:
    """Remove this process's registration of ``cluster_id``; True if one was removed.

    A record written since by another process (another kernel re-registering the id) is
    left alone: only the record holding this process's secret is removed.
    """
    check_cluster_id(cluster_id)
    with _lock:
        secret = _secrets.pop(cluster_id, None)
        if secret is None:
            return False
        return remove_record(_runtime_dir(), cluster_id, secret)


def _withdraw_all() -> None:
    for cluster_id in list(_secrets):
        try:
            withdraw(cluster_id)
        except OSError:
            pass


class ClusterRoute:
    """Keeps a ``--tensorboard`` cluster's proxy route registered while the cluster runs.

    An observer ``(view, final)`` of the cell's handle (a ``ClusterView`` snapshot): it
    registers the chief's TensorBoard the first time a snapshot carries its URL, and
    withdraws it with the final snapshot; so the panel's TensorBoard tab and link
    (``<base_url>tfos_nb/tensorboard/<cluster_id>/``) work exactly while TensorBoard
    does.  Errors (an unwritable runtime directory) are kept in ``error``, never raised
    into the runtime's thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cluster_id: str | None = None
        self.path: str | None = None
        self.error: str | None = None
        self._registered: tuple[str, str] | None = None
        self._ended = False

    def __call__(self, view: Any, final: bool) -> None:
        with self._lock:
            if self._ended:
                return
            if final:
                self._ended = True
                self._withdraw()
                return
            url = getattr(view, "tensorboard", None)
            if url and (view.cluster_id, url) != self._registered:
                self._withdraw()  # a retried cluster: a new id, a new TensorBoard
                try:
                    self.path = register(view.cluster_id, url)
                    self.cluster_id, self._registered = view.cluster_id, (view.cluster_id, url)
                except (OSError, ValueError) as exc:
                    self.error = f"{type(exc).__name__}: {exc}"

    def _withdraw(self) -> None:
        if self.cluster_id is None:
            return
        try:
            withdraw(self.cluster_id)
        except (OSError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        self.cluster_id, self.path, self._registered = None, None, None


@dataclass(frozen=True)
class LocalTensorBoard:
    """A TensorBoard started (or reused) on the driver and registered with the proxy."""

    cluster_id: str
    path: str
    url: str
    pid: int
    reused: bool


def local_cluster_id(logdir: str) -> str:
    """A stable id for a log directory, so ``%tfos_tensorboard --logdir D`` twice reuses one route."""
    return hashlib.sha256(os.path.realpath(logdir).encode()).hexdigest()[:16]


def start_local(logdir: str, *, timeout: float = 60.0) -> Any:
    """Start TensorBoard on the driver for ``logdir`` (loopback, a free port) and register it.

    Uses TensorBoard's own launcher, :func:`tensorboard.manager.start`: it reuses an
    instance already serving the same arguments, learns the port the OS picked
    (``--port 0``, so no race for a "free" port) from TensorBoard's info file, and reports
    failures as values.  Returns :class:`LocalTensorBoard`, or TensorBoard's
    ``StartFailed`` / ``StartExecFailed`` / ``StartTimedOut`` for the caller to render.
    The process outlives the kernel, like ``%tensorboard``'s; :func:`stop_local` ends it.
    """
    if not os.path.isdir(logdir):
        msg = f"log directory does not exist: {logdir!r}"
        raise ValueError(msg)
    try:
        from tensorboard import manager
    except ImportError as exc:
        msg = "TensorBoard is not installed in the kernel's environment: pip install tensorboard"
        raise ImportError(msg) from exc
    args = ["--logdir", os.path.realpath(logdir), "--host", "127.0.0.1", "--port", "0"]
    # manager.start runs `tensorboard` from PATH unless TENSORBOARD_BINARY says otherwise;
    # a kernel's PATH often lacks its own environment's bin/, so name it explicitly.
    binary = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    with _lock:
        saved = os.environ.get("TENSORBOARD_BINARY")
        if saved is None and os.access(binary, os.X_OK):
            os.environ["TENSORBOARD_BINARY"] = binary
        try:
            for _attempt in range(2):
                outcome = manager.start(args, timeout=datetime.timedelta(seconds=timeout))
                if not isinstance(outcome, manager.StartReused) or _pid_alive(outcome.info.pid):
                    break
                # A TensorBoard killed with SIGKILL leaves its info file behind, and the
                # manager would "reuse" the dead instance: drop the file, start afresh.
                _remove_stale_info(manager, outcome.info.pid)
        finally:
            if saved is None:
                os.environ.pop("TENSORBOARD_BINARY", None)
    if not isinstance(outcome, (manager.StartLaunched, manager.StartReused)):
        return outcome
    info = outcome.info
    cluster_id = local_cluster_id(logdir)
    url = f"http://127.0.0.1:{info.port}"
    path = register(cluster_id, url)
    return LocalTensorBoard(cluster_id=cluster_id, path=path, url=url, pid=info.pid, reused=isinstance(outcome, manager.StartReused))


def _remove_stale_info(manager: Any, pid: int) -> None:
    # The file name is TensorBoard's ("pid-<pid>.info" in manager._get_info_dir()),
    # private but stable since TensorBoard 1.14.
    try:
        os.unlink(os.path.join(manager._get_info_dir(), f"pid-{int(pid)}.info"))
    except (OSError, AttributeError):
        pass


def stop_local(tb: LocalTensorBoard) -> None:
    """Withdraw the route and terminate the TensorBoard process started by :func:`start_local`."""
    import signal
    import time

    withdraw(tb.cluster_id)
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(tb.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:  # reap it when it is our child (TensorBoard's launcher does not keep a handle)
                if os.waitpid(tb.pid, os.WNOHANG)[0] == tb.pid:
                    return
            except ChildProcessError:
                if not _pid_alive(tb.pid):
                    return
            time.sleep(0.05)
