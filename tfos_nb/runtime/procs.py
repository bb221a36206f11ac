"""Process ownership: start in a new session, stop with SIGTERM -> SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def kill_tree(proc: subprocess.Popen[Any], grace: float = 3.0) -> int | None:
    """Stop ``proc`` and its process group; returns its exit code."""
    if proc.poll() is not None:
        _killpg(proc.pid, signal.SIGKILL)  # stragglers it left in its group
        return proc.returncode
    _killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:  # not the leader of its own group (started without a new session): the process itself
        proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return proc.returncode


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, or a debugger holds it): state T or t in Linux's ``/proc/PID/stat``;
    False where there is no such file.  (Read by hand: psutil is not among what executors need installed.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    end = stat.rfind(b")")  # the state follows the command name, which may hold spaces and parentheses
    return end >= 0 and stat[end + 2:end + 3] in (b"T", b"t")


def executor_jvm_pid() -> int | None:
    """The pid of the JVM above this Python process (Linux /proc), if any."""
    pid = os.getppid()
    for _ in range(6):
        if pid <= 1:
            return None
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if cmd and os.path.basename(cmd[0]).startswith(b"java"):
            return pid
        pid = ppid
    return None
