"""The job's backup folder as the driver and every node open it: checked at every use, its files opened relative to
it and never through a link (the files themselves: :mod:`.ledger`; the root above the folder: :mod:`.folder`).

What is in the folder decides what the next attempt restores and skips, so no other user may change it.  Each
use opens the folder without following a link and checks that it is a folder of the job's user that only that
user can enter (:func:`check_folder`); a file in it is opened relative to that descriptor, never through a link,
and only when it is a regular file of the job's user with one name; a file is written whole — a new ``0600``
file (``O_EXCL``) beside it, synced, renamed into place.  What is not so is one ValueError naming it
(:func:`refused`).  A node that runs as another account than the driver (a shared Spark standalone cluster's)
cannot enter the folder at all: its ValueError says so, naming both accounts, at the node's first use of the
folder (its data feed, ``ctx.progress_callback()``), before the first step.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any

#: set by the driver on every node of a job with retries: the uid its backup folder belongs to (the driver's)
ENV_OWNER = "TFOS_BACKUP_OWNER"


def refused(folder: str, why: str) -> ValueError:
    """The one error for a backup folder, or a file in it, that is not what this job put there."""
    return ValueError(f"the job's backup folder {folder} {why}: it is not what this job wrote (another user may "
                      "have replaced the folder or planted files in it), so its backups are not used; run the job "
                      "again with a backup_dir (or TFOS_NB_BACKUP_ROOT) only you can write")


def _job_user() -> int:
    """The uid the job's backup folder belongs to: the driver's (:data:`ENV_OWNER`), else this process's."""
    return int(os.environ.get(ENV_OWNER) or os.geteuid())


def _account(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:  # a uid this machine has no name for
        return f"uid {uid}"


def _not_entered(folder: str) -> ValueError:
    """The error of a node that runs as another account than the driver and so cannot enter the job's ``0700``
    folder — every node of a shared Spark standalone cluster, whose executors run as its workers' account: no
    tampering, and no retry can fix it, so it says which accounts and what to do instead."""
    return ValueError(f"the job's backup folder {folder} belongs to the notebook's user, {_account(_job_user())}, and "
                      f"this node runs as {_account(os.geteuid())}, which cannot enter it: retries resume from backups "
                      "only where the nodes run as the notebook's user (a shared Spark standalone cluster runs them as "
                      "its workers' account), so there leave out backup_dir and TFOS_NB_BACKUP_ROOT, and each retry "
                      "starts again from the first step")


def _not_ours(st: os.stat_result, kind: str) -> str | None:
    """Why ``st`` is not a ``kind`` ("folder" or "file") that only this job's user can change; None when it is.
    That user is this process's, or the driver's (:data:`ENV_OWNER`: a node may run as root where the driver
    does not); root's files are trusted too (a node running as root writes them)."""
    if not (stat.S_ISDIR if kind == "folder" else stat.S_ISREG)(st.st_mode):
        return f"is not a {kind}"
    user = _job_user()
    if st.st_uid not in (user, os.geteuid(), 0):
        return f"is owned by uid {st.st_uid}, not this job's user (uid {user}) or root"
    if kind == "folder" and st.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(st.st_mode):04o}, not 0700"
    if kind == "file" and st.st_nlink != 1:
        return f"has {st.st_nlink} names (a hard link to another file?)"
    return None


def _open_folder(folder: str) -> int:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: not a folder; ENOENT: gone
        if exc.errno == errno.EACCES and _job_user() != os.geteuid():
            raise _not_entered(folder) from None
        why = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise refused(folder, f"cannot be opened as a folder ({why})") from None
    why = _not_ours(os.fstat(fd), "folder")
    if why is not None:
        os.close(fd)
        raise refused(folder, why)
    return fd


def check_folder(folder: str) -> os.stat_result:
    """The job's backup folder's status, once it is what the driver made: a folder (not a link) of the job's user
    that only that user can enter (``0700``); ValueError (:func:`refused`) otherwise."""
    fd = _open_folder(folder)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


@contextmanager
def opened(folder: str) -> Iterator[int]:
    """A descriptor on the job's checked folder (:func:`check_folder`), its files opened relative to it."""
    fd = _open_folder(folder)
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(folder: str, dir_fd: int, name: str, flags: int) -> int:
    """``name`` in the folder, opened with ``flags`` never through a link, once it is a regular file of the job's
    user with one name (new: ``0600``); FileNotFoundError when it is not there (and ``flags`` do not create it)."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a FIFO; EEXIST: a name made O_EXCL was taken
        why = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise refused(folder, f"holds {name}, which cannot be opened ({why})") from None
    why = _not_ours(os.fstat(fd), "file")
    if why is not None:
        os.close(fd)
        raise refused(folder, f"holds {name}, which {why}")
    return fd


def read(folder: str, dir_fd: int, name: str) -> bytes:
    """The whole of ``name`` in the folder (:func:`open_file`'s checks)."""
    with os.fdopen(open_file(folder, dir_fd, name, os.O_RDONLY), "rb") as f:
        return f.read()


def write_atomic(folder: str, dir_fd: int, name: str, write: Callable[[IO[bytes]], Any]) -> None:
    """``name`` in the folder, whole or not at all: ``write`` fills a new ``0600`` file beside it (``O_EXCL``: never
    one planted there), synced, then renamed into place (a link planted at ``name`` is replaced, not followed)."""
    tmp = f".tmp-{secrets.token_hex(8)}"
    fd = open_file(folder, dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
