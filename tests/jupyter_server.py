"""The one launcher of the real Jupyter servers the tests start: ``jupyter_server``, JupyterLab, Notebook 7.

Each runs on a free loopback port with a token, its own runtime/config/data directories under the test's
folder, and the tfos_nb TensorBoard proxy loaded (from this environment's install, or from the shipped
config file with :func:`config_with_extension`); it is ready when ``api/status`` answers and its log says
the proxy is up.  :func:`start_jupyter_server` starts one without waiting (a test may start it while Spark
and TensorFlow start); :func:`jupyter_server` is the context manager that also waits and stops it.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
CONFIG_JSON = REPO / "jupyter-config" / "jupyter_server_config.d" / "tfos_nb.json"
PROXY_UP = "tfos_nb: TensorBoard proxy at"


class StatusError(OSError):
    """An error status from the server (an ``OSError``, as urllib's ``HTTPError``: waits take it for "not yet")."""


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class JupyterServer:
    port: int
    base_url: str
    token: str
    root: Path  # the test's folder: work/ (the server's root_dir), runtime/, config/, data/, server.log
    proc: subprocess.Popen
    app: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.base_url}"

    @property
    def runtime_dir(self) -> Path:
        return self.root / "runtime"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def path(self, rel: str) -> str:
        return self.base_url + rel

    def request(self, rel: str, method: str = "GET", *, auth: bool = True, headers: dict[str, str] | None = None,
                body: bytes | None = None, timeout: float = 60) -> Reply:
        """A request whose path is sent exactly as given (no client-side normalisation)."""
        hdrs = dict(headers or {})
        if auth:
            hdrs["Authorization"] = f"token {self.token}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, self.path(rel), body=body, headers=hdrs)
            resp = conn.getresponse()
            return Reply(resp.status, resp.headers, resp.read())
        finally:
            conn.close()

    def api(self, rel: str, method: str = "GET", body: object = None) -> Any:
        """A REST call with a JSON body; its JSON answer (None if empty); an error status raises :class:`StatusError`."""
        data = None if body is None else json.dumps(body).encode()
        reply = self.request(rel, method, headers={"Content-Type": "application/json"}, body=data, timeout=30)
        if not 200 <= reply.status < 300:
            raise StatusError(f"{method} {rel}: {reply.status} {reply.body[:300]!r}")
        return reply.json() if reply.body else None

    def wait_ready(self, timeout: float = 120) -> None:
        try:
            wait_until(lambda: self.request("api/status").status == 200, timeout, 0.2, what=self.app, proc=self.proc,
                       ignore=(OSError,))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log.read_text()[-3000:]}") from None
        assert PROXY_UP in self.log.read_text(), self.log.read_text()[-3000:]

    def stop(self) -> list[int]:
        """Stop the server; return the pids of its descendants still running 30 s later (killed)."""
        descendants = psutil.Process(self.proc.pid).children(recursive=True) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        _, alive = psutil.wait_procs(descendants, timeout=30)
        for p in alive:
            p.kill()
        return [p.pid for p in alive]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, proc: subprocess.Popen | None = None) -> object:
    """:func:`wait_until` for a server or TensorBoard starting up: a refused connection means "not yet"."""
    return wait_until(predicate, timeout, 0.2, what=what, proc=proc, ignore=(OSError,))


def child_env(**extra: str) -> dict[str, str]:
    """This environment for a server (and its kernels): this checkout importable, TensorFlow quiet, no GPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def config_with_extension(root: Path) -> Path:
    """A Jupyter config directory holding only the shipped file that enables the proxy extension."""
    cfg = root / "config"
    (cfg / "jupyter_server_config.d").mkdir(parents=True)
    shutil.copy(CONFIG_JSON, cfg / "jupyter_server_config.d" / "tfos_nb.json")
    return cfg


def start_jupyter_server(root: Path, *, app: str = "jupyter_server", base_url: str = "/",
                         env: dict[str, str] | None = None, config_dir: Path | None = None,
                         kind: type[JupyterServer] = JupyterServer, **extra_env: str) -> Any:
    """Start ``python -m APP`` in ``root`` (made here); ``config_dir``: its user config (default: empty, so the
    proxy is on only if this environment's install enabled it); ``kind``: a subclass of :class:`JupyterServer`
    to return (a test's own helpers); ``extra_env``: more variables for it."""
    for sub in ("runtime", "work", "data"):
        (root / sub).mkdir(parents=True, mode=0o700 if sub == "runtime" else 0o777)
    if config_dir is None:
        config_dir = root / "config"
        config_dir.mkdir()
    token, port = secrets.token_hex(16), free_port()
    env = dict(env if env is not None else child_env())
    env.update(JUPYTER_RUNTIME_DIR=str(root / "runtime"), JUPYTER_CONFIG_DIR=str(config_dir),
               JUPYTER_DATA_DIR=str(root / "data"), JUPYTER_PLATFORM_DIRS="1", **extra_env)
    cmd = [
        sys.executable, "-m", app, "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={token}", f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={root / 'work'}", "--TensorBoardProxy.request_timeout=30",
    ]  # fmt: skip
    if os.getuid() == 0:
        cmd.append("--allow-root")
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=root / "work", stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=log)
    return kind(port=port, base_url=base_url, token=token, root=root, proc=proc, app=app)


@contextmanager
def jupyter_server(root: Path, *, startup_timeout: float = 120, keep_log: Path | None = None,
                   **start: Any) -> Iterator[Any]:
    """:func:`start_jupyter_server`, ready; stopped at the end, failing if any of its processes outlives it.
    ``keep_log``: where to copy the server's log at the end (for a look after a failure)."""
    srv = start_jupyter_server(root, **start)
    try:
        srv.wait_ready(startup_timeout)
        yield srv
    finally:
        left = srv.stop()
        if keep_log is not None:
            keep_log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(srv.log, keep_log)
        assert not left, f"left running after {srv.app} stopped: {left}"
