"""TensorBoard in the notebook, through the Jupyter server's ``tfos_nb.tbproxy`` route.

Kernel side: :func:`register` tells the Jupyter server (through a private file in
Jupyter's runtime directory) where a cluster's TensorBoard listens and returns the
proxy path; :func:`withdraw` ends that; :func:`start_local` starts TensorBoard on the
driver for a log directory after the cluster is gone; :class:`ClusterRoute` keeps a
``--tensorboard`` cluster registered while it runs; :func:`iframe_html` and
:func:`link_html` embed / link a proxy path, resolving it against the page's base URL
in the browser (so JupyterHub's ``/user/NAME/`` prefix is never hard-coded in the kernel).

Imports neither IPython nor TensorFlow nor pyspark (TensorBoard runs as a child process
of :func:`start_local`).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..runtime import private, procs
from ..runtime.tensorboard.ports import listening_port
from ..runtime.tensorboard.urls import check_url
from ._records import Endpoint, check_cluster_id, new_secret, remove_record, write_record

__all__ = ["ClusterRoute", "LocalStartFailed", "LocalTensorBoard", "local_cluster_id", "proxy_path", "register",
           "start_local", "stop_local", "withdraw"]

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
    host, port = check_url(url)
    endpoint = Endpoint(
        cluster_id=check_cluster_id(cluster_id), host=host, port=port, secret=new_secret(), pid=os.getpid()
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
    registers the chief's TensorBoard the first time a snapshot carries its URL (the chief
    reports it once its own TensorBoard process answers there), and withdraws it when the
    URL goes (TensorBoard exited) and with the final snapshot; so the panel's TensorBoard tab and link
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
            if not url and self._registered is not None:
                self._withdraw()  # the chief's TensorBoard exited: its port is anyone's to take now
            elif url and (view.cluster_id, url) != self._registered:
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
    """A TensorBoard this process started (or reused) on the driver, registered with the proxy.

    ``log``: its output (mode 0600, in a private directory).
    """

    cluster_id: str
    path: str
    url: str
    pid: int
    reused: bool
    log: str = ""


@dataclass(frozen=True)
class LocalStartFailed:
    """TensorBoard did not come up: ``reason``, its exit code (None: it did not listen in time and was stopped), its output."""

    reason: str
    exit_code: int | None
    log: str
    tail: str

    def __str__(self) -> str:
        text = f"{self.reason} (its output: {self.log})"
        return text + (f"\n{self.tail}" if self.tail.strip() else "")


# TensorBoards started by start_local, by cluster id: the one owner of each process (stop_local, atexit).
_local: dict[str, tuple[subprocess.Popen[bytes], LocalTensorBoard]] = {}
_local_dir: list[str] = []  # the private directory of their logs (and TensorBoard's own info files)
_local_lock = threading.Lock()  # held while one starts: a second call for the same directory reuses it
_local_atexit = False
_TAIL_BYTES = 4000


def local_cluster_id(logdir: str) -> str:
    """A stable id for a log directory, so ``%tfos_tensorboard --logdir D`` twice reuses one route."""
    return hashlib.sha256(os.path.realpath(logdir).encode()).hexdigest()[:16]


def start_local(logdir: str, *, timeout: float = 60.0) -> LocalTensorBoard | LocalStartFailed:
    """Start TensorBoard on the driver for ``logdir`` (loopback, a port the OS picks) and register it.

    Only a TensorBoard this process started is ever reused (a second call for the same
    directory while it runs), registered or stopped: TensorBoard's own launcher
    (``tensorboard.manager``) trusts info files in a world-writable directory, so a file
    another local user planted there could name their server and their process.  The port
    is read from the child's own listening socket (``/proc``), its output goes to a private
    log (0600).  Returns :class:`LocalTensorBoard`, or :class:`LocalStartFailed` (its exit
    code and last output) for the caller to render.  :func:`stop_local` stops it, and so
    does this process's exit.
    """
    if not os.path.isdir(logdir):
        msg = f"log directory does not exist: {logdir!r}"
        raise ValueError(msg)
    if importlib.util.find_spec("tensorboard") is None:
        msg = "TensorBoard is not installed in the kernel's environment: pip install tensorboard"
        raise ImportError(msg)
    cluster_id = local_cluster_id(logdir)
    with _local_lock:
        running = _local.get(cluster_id)
        if running is not None and running[0].poll() is None:
            return dataclasses.replace(running[1], reused=True)
        if running is not None:  # it exited (killed?): start afresh
            del _local[cluster_id]
        proc, log = _spawn(os.path.realpath(logdir), cluster_id)
        port = _await_port(proc, timeout)
        if port is None:
            exited = proc.poll() is not None
            code = proc.returncode if exited else procs.kill_tree(proc)
            reason = (f"TensorBoard {procs.describe_exit(code)} before it listened" if exited
                      else f"TensorBoard did not listen within {timeout:g} s, and was stopped")
            return LocalStartFailed(reason, code if exited else None, log, _tail(log))
        url = f"http://127.0.0.1:{port}"
        try:
            path = register(cluster_id, url)
        except BaseException:
            procs.kill_tree(proc)
            raise
        local = LocalTensorBoard(cluster_id=cluster_id, path=path, url=url, pid=proc.pid, reused=False, log=log)
        _local[cluster_id] = (proc, local)
        threading.Thread(target=_withdraw_at_exit, args=(proc, local), name=f"tfos-tensorboard-exit-{cluster_id}",
                         daemon=True).start()
        global _local_atexit
        if not _local_atexit:
            atexit.register(_stop_all_local)
            _local_atexit = True
    return local


def _withdraw_at_exit(proc: subprocess.Popen[bytes], local: LocalTensorBoard) -> None:
    """Withdraw ``local``'s route as soon as its process exits (killed, crashed): its loopback port is then
    anyone's to take, and the route must not lead there.  Ends with the process (:func:`stop_local` stops it)."""
    proc.wait()
    with _local_lock:
        if _local.get(local.cluster_id, (None,))[0] is not proc:
            return  # stop_local withdrew it, or a new TensorBoard holds the id now
        del _local[local.cluster_id]
        try:
            withdraw(local.cluster_id)  # under the lock: a start_local for the same folder re-registers after it
        except OSError:
            pass  # the runtime directory went away: the proxy finds no route either


def _private_dir() -> str:
    if not _local_dir:
        _local_dir.append(tempfile.mkdtemp(prefix="tfos_nb-tensorboard-"))  # mode 0700, a fresh name
    return _local_dir[0]


def _spawn(logdir: str, cluster_id: str) -> tuple[subprocess.Popen[bytes], str]:
    directory = _private_dir()
    log = os.path.join(directory, f"{cluster_id}-{time.time_ns()}.log")
    fd = private.open_log(log)
    env = dict(os.environ)
    # TensorBoard writes an info file of its own under $TMPDIR/.tensorboard-info (a folder it makes 0777):
    # keep that in the private directory too, where no other user can plant or swap a file.
    env["TMPDIR"] = directory
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1", "--port", "0"],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env, start_new_session=True,
        )
    finally:
        os.close(fd)
    return proc, log


def _await_port(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The loopback port our child listens on, from its own sockets; None if it exits or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        port = listening_port(proc.pid, "127.0.0.1")
        if port is not None:
            return port
        time.sleep(0.1)
    return None


def _tail(log: str) -> str:
    try:
        return private.read_tail(log, _TAIL_BYTES)
    except OSError:
        return ""


def stop_local(tb: LocalTensorBoard) -> None:
    """Withdraw the route and stop the TensorBoard process :func:`start_local` started (SIGTERM, then SIGKILL).

    Only a process this process started and still owns is signalled; anything else is left alone.
    """
    withdraw(tb.cluster_id)
    with _local_lock:
        running = _local.get(tb.cluster_id)
        if running is None or running[0].pid != tb.pid:
            return
        del _local[tb.cluster_id]
    procs.kill_tree(running[0])


def _stop_all_local() -> None:
    for _proc, local in list(_local.values()):
        try:
            stop_local(local)
        except OSError:
            pass
    if _local_dir and not _local:
        shutil.rmtree(_local_dir.pop(), ignore_errors=True)
