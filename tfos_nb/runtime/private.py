"""Files only this user can read or write: the nodes' logs, the coordinator's, TensorBoard's output.

A log's path is predictable (``tfos_nb-<cluster>-node<i>.log`` in a Spark work directory, or in
a private directory made for it), and a directory another user can write may hold what they
planted there first: a symlink to one of this user's files, a FIFO, a file of theirs.  So a log
is opened without following a symlink, without blocking on a FIFO, and only if it is a regular
file of this user's with no other name; it is made mode 0600 whatever the umask.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat


def make_dirs(path: str) -> None:
    """``os.makedirs`` whose new folders only this user can enter (0700); folders already there are left as
    they are (a log folder the user chose, shared on purpose, keeps its mode).  By hand because
    ``os.makedirs`` gives ``mode`` to the last folder only (Python 3.7+), the ones above it 0777 & ~umask."""
    missing = []
    head = os.path.abspath(path)
    while not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # made meanwhile (another node on this host): left as it is
            if not os.path.isdir(folder):
                raise


def open_log(path: str) -> int:
    """A descriptor appending to the log at ``path`` (created 0600); ``OSError`` naming why it is refused."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a FIFO nobody reads; EACCES: e.g. a symlink in a sticky folder
        msg = (f"cannot open the log {path}: {exc.strerror} (a symlink, a special file or another user's file "
               "there is refused)")
        raise OSError(exc.errno, msg) from None
    try:
        _check_ours(fd, path)
        os.fchmod(fd, 0o600)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_tail(path: str, n: int) -> str:
    """The last ``n`` bytes of a log :func:`open_log` wrote (same checks: no symlink, ours), as text."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check_ours(fd, path)
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - n), os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)[-n:].decode("utf-8", "replace")
    finally:
        os.close(fd)


def _check_ours(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}, not this user ({os.geteuid()})"
    elif st.st_nlink != 1:
        why = f"it has {st.st_nlink} names (a hard link planted to another file?)"
    else:
        return
    msg = f"refusing the log {path}: {why}"
    raise OSError(errno.EPERM, msg)
