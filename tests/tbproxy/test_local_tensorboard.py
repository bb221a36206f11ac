"""A TensorBoard the kernel starts itself (``tfos_nb.tensorboard.start_local``, when the cluster that had one is
gone), served through the proxy of a real ``jupyter server``: reused while it runs, never reused once killed,
stopped when it does not listen in time, and never another local user's (TensorBoard's shared info folder).
The setup is ``conftest.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.jupyter_server import wait_for
from tests.server_abuse import as_nobody, as_nobody_wait, fork_as_nobody, nobody_http_server
from tests.tbproxy.conftest import Server, tb_path
from tfos_nb import tensorboard
from tfos_nb.tensorboard import _records

slow = pytest.mark.slow


def _our_listening_port(pid: int) -> set[int]:
    """The loopback ports ``pid`` listens on, if it is a child of this process (else nothing)."""
    import psutil

    child = psutil.Process(pid)
    if child.ppid() != os.getpid():
        return set()
    return {c.laddr.port for c in child.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def _registered_port(server: Server, cluster_id: str) -> int:
    endpoint = _records.read_record(str(server.runtime_dir), cluster_id)
    assert endpoint is not None
    return endpoint.port


@slow
def test_start_local_after_cluster_is_gone(server: Server, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    local = tensorboard.start_local(str(logdir), timeout=120)
    assert isinstance(local, tensorboard.LocalTensorBoard), local
    try:
        assert local.url.startswith("http://127.0.0.1:") and local.path == tb_path(local.cluster_id)
        # the registered port is our own child's listening socket; its output is a private file
        assert _registered_port(server, local.cluster_id) in _our_listening_port(local.pid)
        assert stat.S_IMODE(os.stat(local.log).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(local.log)).st_mode) == 0o700
        runs = wait_for(
            lambda: (r := server.fetch(tb_path(local.cluster_id, "data/runs"))).status == 200 and "train" in r.json() and r, 60, "runs"
        )
        assert runs
        again = tensorboard.start_local(str(logdir), timeout=120)
        assert isinstance(again, tensorboard.LocalTensorBoard) and again.reused and again.pid == local.pid
    finally:
        tensorboard.stop_local(local)
        wait_for(lambda: not _alive(local.pid), 20, "local TensorBoard exit")
    assert server.fetch(tb_path(local.cluster_id, "data/runs")).status == 404


@slow
def test_start_local_does_not_reuse_a_killed_tensorboard(server: Server, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    first = tensorboard.start_local(str(logdir), timeout=120)
    assert isinstance(first, tensorboard.LocalTensorBoard), first
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: not _alive(first.pid), 20, "killed TensorBoard exit")
    second = tensorboard.start_local(str(logdir), timeout=120)
    try:
        assert isinstance(second, tensorboard.LocalTensorBoard) and not second.reused and second.pid != first.pid, second
        assert server.fetch(tb_path(second.cluster_id, "data/runs")).status == 200
    finally:
        if isinstance(second, tensorboard.LocalTensorBoard):
            tensorboard.stop_local(second)
            wait_for(lambda: not _alive(second.pid), 20, "local TensorBoard exit")


@slow
def test_start_local_that_does_not_listen_in_time_is_stopped_and_says_where_its_output_is(logdir: Path) -> None:
    import psutil

    def tensorboards() -> set[int]:
        found = set()
        for p in psutil.Process().children(recursive=True):  # other tests' children come and go meanwhile
            try:
                if "tensorboard.main" in " ".join(p.cmdline()):
                    found.add(p.pid)
            except psutil.Error:  # exited (or a zombie) between the listing and the read: not a TensorBoard running
                continue
        return found

    before = tensorboards()  # the package's upstream TensorBoard (the `tensorboard` fixture) may be running
    out = tensorboard.start_local(str(logdir), timeout=0.5)  # TensorBoard takes seconds to import
    assert isinstance(out, tensorboard.LocalStartFailed), out
    assert str(out).startswith("TensorBoard did not listen within 0.5 s, and was stopped (its output: ")
    assert out.log in str(out) and stat.S_IMODE(os.stat(out.log).st_mode) == 0o600
    left = tensorboards() - before
    assert not left, left


@slow
def test_start_local_never_trusts_another_users_tensorboard_info(server: Server, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another local user plants, in TensorBoard's world-writable info folder, a file naming their server and
    their process under the key this kernel's TensorBoard would have: it is neither used nor signalled."""
    as_nobody()
    import tempfile
    import time

    from tensorboard import manager
    from tensorboard import version as tb_version

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    theirs = free_port()

    def serve() -> None:  # nobody's HTTP server, from modules already loaded (root's stdlib is out of its reach)
        listener = socket.socket()
        listener.bind(("127.0.0.1", theirs))
        listener.listen()
        while True:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n["nobody\'s"]')
            conn.close()

    http_server = fork_as_nobody(serve)
    sleeper = subprocess.Popen(["sleep", "600"], user="nobody")
    info_dir = os.path.join(tempfile.gettempdir(), ".tensorboard-info")
    planted = os.path.join(info_dir, f"pid-{sleeper.pid}.info")
    local = None
    try:
        wait_for(lambda: socket.create_connection(("127.0.0.1", theirs), 5).close() or True, 30, "nobody's HTTP server")
        real = os.path.realpath(logdir)
        info = manager.TensorBoardInfo(
            version=tb_version.VERSION, start_time=int(time.time()), pid=sleeper.pid, port=theirs, path_prefix="",
            logdir=real, db="",
            cache_key=manager.cache_key(working_directory=os.getcwd(),
                                        arguments=["--logdir", real, "--host", "127.0.0.1", "--port", "0"],
                                        configure_kwargs={}),
        )

        text = manager._info_to_string(info).encode()

        def plant() -> None:  # as TensorBoard's launcher would (the folder 0777), were nobody first
            os.makedirs(info_dir, exist_ok=True)
            if os.stat(info_dir).st_uid == os.getuid():
                os.chmod(info_dir, 0o777)
            fd = os.open(planted, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, text)
            os.close(fd)

        as_nobody_wait(plant)
        assert os.stat(planted).st_uid != 0

        local = tensorboard.start_local(str(logdir), timeout=120)
        assert isinstance(local, tensorboard.LocalTensorBoard), local
        port = _registered_port(server, local.cluster_id)
        assert not local.reused and local.pid != sleeper.pid and port != theirs, (local, port)
        assert port in _our_listening_port(local.pid), "the registered port is not our own TensorBoard's"
        runs = wait_for(lambda: (r := server.fetch(tb_path(local.cluster_id, "data/runs"))).status == 200 and r.json(), 60, "runs")
        assert "train" in runs  # type: ignore[operator]
        tensorboard.stop_local(local)
        wait_for(lambda: not _alive(local.pid), 20, "local TensorBoard exit")
        local = None
        assert sleeper.poll() is None and os.waitpid(http_server, os.WNOHANG) == (0, 0), "another user's process was signalled"
    finally:
        if local is not None and isinstance(local, tensorboard.LocalTensorBoard):
            tensorboard.stop_local(local)
        sleeper.kill()
        sleeper.wait(10)
        os.kill(http_server, signal.SIGKILL)
        os.waitpid(http_server, 0)
        if os.path.lexists(planted):
            os.unlink(planted)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True




@slow
def test_a_killed_tensorboards_route_is_withdrawn_before_another_user_can_serve_on_its_port(
    server: Server, logdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 51, finding 3: TensorBoard exits (killed, crashed), uid ``nobody`` binds the loopback port it left and
    serves a page: the route is gone by then (withdrawn when the process exited), so Jupyter's origin never
    serves nobody's page."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
    local = tensorboard.start_local(str(logdir), timeout=120)
    assert isinstance(local, tensorboard.LocalTensorBoard), local
    port = _registered_port(server, local.cluster_id)
    os.kill(local.pid, signal.SIGKILL)
    # the kernel's own thread withdraws it once the process is reaped: bounded by that, not by a request
    wait_for(lambda: _records.read_record(str(server.runtime_dir), local.cluster_id) is None, 20, "the route withdrawn")
    with nobody_http_server(port) as (squatted, hits):
        assert squatted == port
        resp = server.fetch(tb_path(local.cluster_id, "data/runs"))
        assert resp.status == 404 and b"nobody" not in resp.body, (resp.status, resp.body[:200])
        assert hits() == 0
    tensorboard.stop_local(local)  # nothing left to stop: a no-op
