"""The chief's TensorBoard: on a port the OS picks, reported only once it is its own and answers.

Started with ``--port 0``: no port number is chosen ahead of time or shown on its
command line (every user reads ``/proc/PID/cmdline``), so nobody can take the port
before TensorBoard binds it.  Its URL is reported (:attr:`ChiefTensorBoard.url`) only
once

1. the TensorBoard process itself holds a listening socket on the node's address,
   read from its own descriptors (``/proc/PID/fd`` matched against
   ``/proc/PID/net/tcp{,6}``), never from a file or from its output;
2. that address answers TensorBoard's ``/data/environment``;
3. the socket still is the process's after the answer.

Its output goes to the node's log (the supervisor's stderr).  A TensorBoard that exits
or never listens becomes :attr:`~ChiefTensorBoard.error`, with its last lines; a URL
reported before is withdrawn then (the port is free for anyone to take).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from .. import net, procs
from ..private import make_dirs
from .ports import listening_port

# TensorBoard imports TensorFlow when it is installed: 17 s to listen was seen on a loaded machine.
LISTEN_TIMEOUT_S = 300.0
POLL_S = 0.2
TAIL_LINES = 30
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy


class ChiefTensorBoard:
    """Owns the chief's TensorBoard process, its output reader and its watcher (:meth:`start`, :meth:`stop`)."""

    def __init__(self, host: str, logdir: str, *, listen_timeout: float = LISTEN_TIMEOUT_S) -> None:
        self.host = host
        self.logdir = logdir
        self.listen_timeout = listen_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._url: str | None = None
        self._error: str | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tmpdir: str | None = None

    @property
    def url(self) -> str | None:
        """``http://host:port`` once TensorBoard is verified to listen and answer there; None before and after."""
        with self._lock:
            return self._url

    @property
    def error(self) -> str | None:
        """Why there is no TensorBoard (it exited, or never listened), with its last output lines."""
        with self._lock:
            return self._error

    def start(self) -> None:
        """Start TensorBoard and its watcher (once)."""
        if self.proc is not None:
            return
        try:
            make_dirs(self.logdir)  # a new TensorBoard log folder is private (0700)
            # TensorBoard writes <TMPDIR>/.tensorboard-info/pid-N.info, a folder it makes 0777 in a TMPDIR
            # any user may write (following links planted there): give it a TMPDIR of its own (0700)
            self._tmpdir = tempfile.mkdtemp(prefix="tfos_nb-tensorboard-")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tensorboard.main", "--logdir", self.logdir, "--host", self.host,
                 "--port", "0"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(os.environ, TMPDIR=self._tmpdir),
            )
        except OSError as exc:
            self._fail(f"TensorBoard could not start: {type(exc).__name__}: {exc}")
            return
        for name, target in (("output", self._read_output), ("watch", self._watch)):
            t = threading.Thread(target=target, name=f"tfos-tensorboard-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Withdraw the URL, end TensorBoard's process group and join the threads (idempotent)."""
        self._stopping.set()
        with self._lock:
            self._url = None
        if self.proc is not None:
            procs.kill_tree(self.proc, grace=1)
        for t in self._threads:
            t.join(timeout=5)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    # -- threads ------------------------------------------------------------------------------
    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")[:2000]
            sys.stderr.write(f"[tensorboard] {line}\n")  # the supervisor's stderr is the node's log
            with self._lock:
                self._tail.append(line)
        self.proc.stdout.close()

    def _watch(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.listen_timeout
        url = None
        while url is None and self.proc.poll() is None and not self._stopping.is_set():
            url = self._verified_url()
            if url is None:
                if time.monotonic() > deadline:
                    procs.kill_tree(self.proc, grace=1)
                    self._fail(f"TensorBoard did not listen on {self.host} within {self.listen_timeout:.0f} s")
                    return
                self._stopping.wait(POLL_S)
        if url is not None:
            with self._lock:
                self._url = url
        code = self.proc.wait()
        with self._lock:
            self._url = None  # at once: its port is free for anyone to take
        if not self._stopping.is_set():
            self._fail(f"TensorBoard {procs.describe_exit(code)}")

    def _verified_url(self) -> str | None:
        """TensorBoard's URL when its own socket listens on the node's address and answers as TensorBoard."""
        assert self.proc is not None
        port = self._own_port()
        if port is None:
            return None
        url = f"http://{net.hostport(self.host, port)}"
        try:
            with _DIRECT.open(f"{url}/data/environment", timeout=5) as resp:
                env: Any = json.loads(resp.read())
        except (OSError, ValueError):
            return None  # listening, not yet serving
        if not isinstance(env, dict) or "data_location" not in env:
            return None  # not TensorBoard's answer (its own socket, so not yet serving, or a bug)
        return url if self._own_port() == port else None  # the socket that answered was its own

    def _own_port(self) -> int | None:
        assert self.proc is not None
        return listening_port(self.proc.pid, self.host)

    def _fail(self, reason: str) -> None:
        with self._lock:
            self._url = None  # before anything that waits: the port TensorBoard had is anyone's now
        # the reader may still be draining the last lines: wait for EOF briefly, so the tail is whole
        if self._threads and threading.current_thread() is not self._threads[0]:
            self._threads[0].join(timeout=2)
        with self._lock:
            self._url = None
            tail = "\n".join(self._tail)
            self._error = f"{reason}; its last output lines:\n{tail}" if tail else f"{reason} (no output)"
