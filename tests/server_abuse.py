"""What another local user, or anyone who can reach a tfos_nb server's port, can do: for the tests.

:func:`fork_as_nobody` runs code as a second identity (uid ``nobody``; needs root, which CI has).

Idle connections, a sender that trickles bytes, and a real server in a subprocess whose
file descriptors run out (``RLIMIT_NOFILE`` lowered below what it has open) while a peer
waits: its CPU time over a window tells a back-off from a spin.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from tests.conftest import skip_environment

REPO = Path(__file__).resolve().parents[1]
SECRET = b"s" * 32


def as_nobody() -> None:
    """Tests that act as a second local user (uid ``nobody``) need root (CI runs as root: there it fails instead)."""
    if os.getuid() != 0:
        skip_environment("acting as uid nobody needs root")


def fork_as_nobody(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child that is uid and gid ``nobody``; its pid (a child of this process).

    A fork, not an exec: this interpreter and its standard library may lie where ``nobody`` cannot reach them
    (under ``/root``), so ``work`` must use only modules already loaded.
    """
    import pwd

    nobody = pwd.getpwnam("nobody")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            work()
            code = 0
        finally:
            os._exit(code)
    return pid


def as_nobody_wait(work: Callable[[], None]) -> None:
    """:func:`fork_as_nobody` and wait for it; it must succeed."""
    _, status = os.waitpid(fork_as_nobody(work), 0)
    assert status == 0, f"the work done as nobody failed ({status})"


def idle_connections(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that never send a byte."""
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (EOF or reset), without waiting."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


class Flood:
    """Connections opened by uid ``nobody`` at a steady rate (see :func:`flood_as_nobody`)."""

    def __init__(self, pid: int, progress: int, seconds: float) -> None:
        self._pid, self._progress, self._seconds = pid, progress, seconds
        self._seen = 0
        self._ended = False

    def connected(self) -> int:
        """How many connections it has opened so far."""
        if self._progress >= 0:
            try:
                while chunk := os.read(self._progress, 65536):
                    self._seen += len(chunk)
            except BlockingIOError:
                pass
        return self._seen

    def wait(self) -> int:
        """Wait for the flood to end (it ends by itself); how many connections it opened."""
        from tests.conftest import wait_until

        if not self._ended:
            ended = wait_until(lambda: os.waitpid(self._pid, os.WNOHANG)[0] == self._pid, self._seconds + 10)
            if not ended:
                os.kill(self._pid, 9)
                os.waitpid(self._pid, 0)
            self._ended = True
            assert ended, "the flood did not end in time"
        count = self.connected()
        if self._progress >= 0:
            os.close(self._progress)
            self._progress = -1
        return count


@contextmanager
def flood_as_nobody(port: int, rate: float, seconds: float, payload: bytes = b"", sources: int = 8) -> Iterator[Flood]:
    """As uid ``nobody``: ``rate`` connections a second to 127.0.0.1:``port`` for ``seconds``, from ``sources``
    source addresses (127.0.0.2, 127.0.0.3, …), each sending ``payload`` (nothing: an idle connection) and then
    nothing more, all held open until the flood ends.  Bounded: ``rate * seconds`` connections, loopback only."""
    as_nobody()
    import fcntl

    total = int(rate * seconds)
    progress, report = os.pipe()

    def work() -> None:
        os.close(progress)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < total + 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, total + 64), hard))
        held = []
        start = time.monotonic()
        while len(held) < total and time.monotonic() - start < seconds:
            due = min(total, int((time.monotonic() - start) * rate) + 1)
            while len(held) < due:
                s = socket.socket()
                held.append(s)
                try:
                    s.bind((f"127.0.0.{2 + len(held) % sources}", 0))
                    s.settimeout(1.0)
                    s.connect(("127.0.0.1", port))
                    s.setblocking(False)
                    if payload:
                        s.send(payload)  # what the kernel takes at once; a closed connection takes nothing
                except OSError:
                    pass
                os.write(report, b".")
            time.sleep(0.002)  # the pace is the attack itself, not a wait for a condition
        for s in held:
            s.close()

    pid = fork_as_nobody(work)
    os.close(report)
    fcntl.fcntl(progress, fcntl.F_SETFL, os.O_NONBLOCK)
    flood = Flood(pid, progress, seconds)
    try:
        yield flood
    finally:
        flood.wait()


def trickle(sock: socket.socket, data: bytes, every: float, limit: float) -> float | None:
    """Send ``data`` one byte at a time, a byte every ``every`` s, reading what the server sends meanwhile.

    Returns the seconds until the server closed the connection, or None if it had not within ``limit`` s
    (or the bytes ran out first).  The pace is the attack itself, not a wait for a condition.
    """
    start = time.monotonic()
    sock.settimeout(every)
    for i in range(len(data)):
        try:
            sock.sendall(data[i : i + 1])
        except OSError:
            return time.monotonic() - start
        try:
            while sock.recv(4096):  # the server's greeting, if it sends one; then the pace
                pass
            return time.monotonic() - start  # EOF: closed
        except TimeoutError:
            pass
        except OSError:
            return time.monotonic() - start
        if time.monotonic() - start > limit:
            return None
    return None


# The real server, in a process of its own.  Commands on stdin: "fill" lowers the process's descriptor limit
# below the descriptors it has open, so that every new one fails with EMFILE (answers "full"); "free" puts
# the limit back ("freed").  Lowering the limit, rather than opening files until none is left, leaves no
# free slot that a descriptor some library opened and closed meanwhile could give back.
_SERVER = textwrap.dedent(
    """
    import resource, socket, sys, time
    sys.path.insert(0, sys.argv[2])
    secret = b"s" * 32
    if sys.argv[1] == "control":
        from tfos_nb.runtime.protocol import messages as m
        from tfos_nb.runtime.protocol.channel import ControlServer
        server = ControlServer(m.Codec(secret, "cid", "driver"), lambda msg: m.Reply(ok=True), "127.0.0.1")
        port = server.start()[1]
    else:
        from tfos_nb.runtime.executor.feed.server import DataServer
        from tfos_nb.runtime.executor.feed.hub import FeedHub
        server = DataServer(FeedHub(), secret, "127.0.0.1").start()
        port = server.port
    print(port, flush=True)
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    for line in sys.stdin:
        if line.strip() == "fill":
            spend = socket.socket()  # made while descriptors remain
            resource.setrlimit(resource.RLIMIT_NOFILE, (3, limits[1]))  # stdin, stdout, stderr: nothing more
            # A thread blocked in accept() took its descriptor before the limit dropped: give it a connection to
            # spend it on, and answer once the server failed to accept, so the next peer meets EMFILE.
            spend.connect(("127.0.0.1", port))
            while getattr(server, "accept_errors", 1) == 0:
                time.sleep(0.01)
            print("full", flush=True)
        elif line.strip() == "free":
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            print("freed", flush=True)
    """
)


class Starved:
    """A real server (``kind``: "control" or "data") in a subprocess that can run out of descriptors."""

    def __init__(self, kind: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, kind, str(REPO)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        self.port = int(self._out.readline())

    def command(self, what: str) -> str:
        self._in.write(what + "\n")
        self._in.flush()
        return self._out.readline().strip()

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)

    def cpu_share(self, window: float = 2.0) -> float:
        """The share of one CPU the server used over the next ``window`` seconds (a measurement, not a wait)."""
        before, t0 = self.cpu_seconds(), time.monotonic()
        while time.monotonic() - t0 < window:
            time.sleep(0.05)  # sampling the process's CPU clock over a fixed window: nothing to synchronise on
        return (self.cpu_seconds() - before) / (time.monotonic() - t0)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._in.close()
        self._out.close()


@contextmanager
def starved(kind: str) -> Iterator[Starved]:
    server = Starved(kind)
    try:
        yield server
    finally:
        server.close()


@contextmanager
def nobody_http_server(port: int = 0) -> Iterator[tuple[int, Callable[[], int]]]:
    """A web server of uid ``nobody`` on 127.0.0.1 (``port``: one another process just freed; 0: any).

    Yields its port and a function telling how many requests it has been sent so far.  It answers every
    request with a page saying whose it is: what another local user would serve on a port TensorBoard left.
    """
    as_nobody()
    import fcntl

    ready_r, ready_w = os.pipe()
    hits_r, hits_w = os.pipe()

    def serve() -> None:
        os.close(ready_r)
        os.close(hits_r)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(16)
        os.write(ready_w, str(s.getsockname()[1]).encode() + b"\n")
        body = b"<html><script>/* nobody's page */</script></html>"
        while True:
            c, _ = s.accept()
            c.settimeout(10)
            try:
                c.recv(65536)
                os.write(hits_w, b".")
                c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            except OSError:
                pass
            c.close()

    pid = fork_as_nobody(serve)
    os.close(ready_w)
    os.close(hits_w)
    fcntl.fcntl(hits_r, fcntl.F_SETFL, os.O_NONBLOCK)
    seen = [0]

    def hits() -> int:
        try:
            while chunk := os.read(hits_r, 4096):
                seen[0] += len(chunk)
        except BlockingIOError:
            pass
        return seen[0]

    try:
        with os.fdopen(ready_r, "rb") as ready:
            line = ready.readline()  # the child's bind, or EOF if it failed
        assert line.strip(), f"uid nobody could not bind 127.0.0.1:{port}"
        yield int(line), hits
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(hits_r)


@contextmanager
def writable_by_all(mode: int = 0o777) -> Iterator[Path]:
    """A fresh folder every user can write, removed after: 0777 (no sticky bit: a shared export or work folder,
    a TMPDIR set carelessly) or 0o1777 (like /tmp)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp())
    d.chmod(mode)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
