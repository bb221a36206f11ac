"""Endpoint records: how a kernel tells the Jupyter server where a TensorBoard listens.

A record is one JSON file ``<runtime_dir>/tfos_nb/<cluster_id>.json``, written by the
kernel (:mod:`tfos_nb.tensorboard`) and read by the proxy (:mod:`tfos_nb.tensorboard.proxy`) on every request, so a
withdrawn record stops the route at once.  Both sides share this module; it imports
neither jupyter_server nor tensorflow.

The proxy trusts a record only if it is a regular file (not a symlink), owned by the
uid the server runs as, with no group/other permission bits, inside a directory with
the same properties.  Another user's runtime directory therefore cannot point our
proxy anywhere.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from dataclasses import dataclass

from ..runtime.private import write_atomic
from ..runtime.procs import pid_alive as _pid_alive
from ..runtime.tensorboard.urls import check_host

RECORD_VERSION = 1
RECORD_SUBDIR = "tfos_nb"
CLUSTER_ID_RE = re.compile(r"^[0-9a-f]{8,32}$")
_MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class Endpoint:
    """Where the TensorBoard of one cluster listens, as registered by its kernel."""

    cluster_id: str
    host: str
    port: int
    secret: str
    pid: int

    def __post_init__(self) -> None:
        check_cluster_id(self.cluster_id)
        check_host(self.host)
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            msg = f"port must be an int in 1..65535, got {self.port!r}"
            raise ValueError(msg)
        if not isinstance(self.secret, str) or len(self.secret) < 16:
            msg = "secret must be a string of at least 16 characters"
            raise ValueError(msg)
        if isinstance(self.pid, bool) or not isinstance(self.pid, int) or self.pid <= 0:
            msg = f"pid must be a positive int, got {self.pid!r}"
            raise ValueError(msg)

    @property
    def netloc(self) -> str:
        """``host:port`` with IPv6 literals bracketed, ready for a URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "cluster_id": self.cluster_id,
                "host": self.host,
                "port": self.port,
                "secret": self.secret,
                "pid": self.pid,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Endpoint:
        """Strict decode (types, required keys); unknown keys are ignored for forward compatibility."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
            msg = "not a tfos_nb endpoint record of a known version"
            raise ValueError(msg)
        try:
            return cls(cluster_id=data["cluster_id"], host=data["host"], port=data["port"], secret=data["secret"], pid=data["pid"])
        except KeyError as exc:
            msg = f"endpoint record lacks {exc}"
            raise ValueError(msg) from exc


def check_cluster_id(cluster_id: object) -> str:
    if not isinstance(cluster_id, str) or not CLUSTER_ID_RE.match(cluster_id):
        msg = f"cluster id must be 8 to 32 lowercase hex digits, got {cluster_id!r}"
        raise ValueError(msg)
    return cluster_id


def new_secret() -> str:
    return secrets.token_hex(16)


def record_dir(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, RECORD_SUBDIR)


def record_path(runtime_dir: str, cluster_id: str) -> str:
    return os.path.join(record_dir(runtime_dir), f"{check_cluster_id(cluster_id)}.json")


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not (st.st_mode & 0o077)


def write_record(runtime_dir: str, endpoint: Endpoint) -> str:
    """Atomically write ``endpoint`` (mode 0600, directory 0700); return the file's path."""
    directory = record_dir(runtime_dir)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        msg = f"{directory} is not a directory owned by this user; remove it"
        raise PermissionError(msg)
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
    final = record_path(runtime_dir, endpoint.cluster_id)
    write_atomic(final, endpoint.to_json())
    return final


def remove_record(runtime_dir: str, cluster_id: str, secret: str | None = None) -> bool:
    """Remove the record; with ``secret``, only if it is still the one we wrote."""
    path = record_path(runtime_dir, cluster_id)
    if secret is not None:
        current = read_record(runtime_dir, cluster_id, check_pid=False)
        if current is None or current.secret != secret:
            return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def read_record(runtime_dir: str, cluster_id: str, *, check_pid: bool = True) -> Endpoint | None:
    """The endpoint registered for ``cluster_id``, or None if absent, untrusted or stale.

    Untrusted: a symlink, not a regular file, not owned by this uid, readable or writable
    by group/others, or in a directory that is any of these.  Stale: the registering
    process is gone (a crashed kernel never withdrew it).
    """
    try:
        check_cluster_id(cluster_id)
        st = os.lstat(record_dir(runtime_dir))
    except (ValueError, OSError):
        return None
    if not stat.S_ISDIR(st.st_mode) or not _private(st):
        return None
    try:
        fd = os.open(record_path(runtime_dir, cluster_id), os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > _MAX_RECORD_BYTES:
            return None
        raw = os.read(fd, _MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    try:
        endpoint = Endpoint.from_json(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if endpoint.cluster_id != cluster_id:
        return None
    if check_pid and not _pid_alive(endpoint.pid):
        return None
    return endpoint
