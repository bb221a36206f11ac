"""Files only this user can read or write: the nodes' logs, the coordinator's, TensorBoard's output.

A log's path is predictable (``tfos_nb-<cluster>-node<i>.log`` in a Spark work directory, or in
a private directory made for it), and a directory another user can write may hold what they
planted there first: a symlink to one of this user's files, a FIFO, a file of theirs.  So a log
is opened without following a symlink, without blocking on a FIFO, and only if it is a regular
file of this user's with no other name; it is made mode 0600 whatever the umask.

What leaves this machine from a folder (an MLflow upload of a SavedModel or a TensorBoard log
directory) is copied by :func:`copy_plain_tree`: regular files only, never through a link.

A child process's temporary files (a node's named sets, deterministic mode's early partitions) live in
a :class:`PrivateTmp` its owner removes; what an owner killed with its child left is swept by the next.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile


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


def write_atomic(path: str, text: str) -> None:
    """``text`` as ``path``, whole or not at all: a new 0600 file beside it (``O_EXCL``: never one planted there),
    synced, renamed into place; removed if anything fails."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
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


def copy_plain_tree(src: str, dst: str) -> list[str]:
    """Copy the regular files under the folder ``src`` into the new folder ``dst``, keeping the tree and the modes.

    Returns what was left out, as paths relative to ``src``: every symlink (to a file or a folder, wherever it
    points: ``~/.ssh/id_rsa``, ``/etc/shadow``), every file with more than one name (a hard link planted to one
    of this user's files) and everything that is neither a regular file nor a folder (FIFOs, sockets, devices).
    ``src`` itself is resolved (the folder the user named may be a link); below it nothing is followed: each
    folder and file is opened relative to its parent's descriptor with ``O_NOFOLLOW`` and checked on the open
    descriptor, so a link swapped in while the copy runs is refused too.
    """
    skipped: list[str] = []
    modes: list[tuple[str, int]] = []  # the folders' own modes, set once their files are in
    top = os.open(os.path.realpath(src), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack = [(top, "")]
    try:
        os.mkdir(dst, 0o700)
        modes.append((dst, stat.S_IMODE(os.fstat(top).st_mode)))
        while stack:
            dir_fd, rel = stack.pop()
            try:
                with os.scandir(dir_fd) as scan:
                    entries = sorted(scan, key=lambda e: e.name)
                for entry in entries:
                    path = os.path.join(rel, entry.name)
                    fd = _open_plain(entry, dir_fd)
                    if fd is None:
                        skipped.append(path)
                        continue
                    st = os.fstat(fd)
                    if stat.S_ISDIR(st.st_mode) and entry.is_dir(follow_symlinks=False):
                        os.mkdir(os.path.join(dst, path), 0o700)
                        modes.append((os.path.join(dst, path), stat.S_IMODE(st.st_mode)))
                        stack.append((fd, path))
                        continue
                    try:
                        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and entry.is_file(follow_symlinks=False):
                            _copy_fd(fd, os.path.join(dst, path), stat.S_IMODE(st.st_mode))
                        else:
                            skipped.append(path)
                    finally:
                        os.close(fd)
            finally:
                os.close(dir_fd)
    except BaseException:
        for fd, _ in stack:
            os.close(fd)
        raise
    for path, mode in reversed(modes):  # deepest first: a read-only folder is filled before it becomes one
        os.chmod(path, mode | stat.S_IRWXU)
    return skipped


def _open_plain(entry: os.DirEntry[str], dir_fd: int) -> int | None:
    """A descriptor on ``entry`` when it is a folder or a regular file (not followed if a link); None otherwise."""
    if not (entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)):
        return None  # a symlink, FIFO, socket or device: not even opened
    try:
        return os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOENT):  # replaced by a link or a socket, or gone
            return None
        raise


def _copy_fd(fd: int, path: str, mode: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(out, "wb") as w, os.fdopen(os.dup(fd), "rb") as r:
        shutil.copyfileobj(r, w)
        os.fchmod(w.fileno(), mode | stat.S_IRUSR)


PRIVATE_PREFIX = "tfos_nb-child-"  # a child's private temporary folder, in the temporary directory
PRIVATE_LOCK = ".owner.lock"  # in it: locked (flock) by the folder's owner for as long as it lives


class PrivateTmp:
    """A child's private temporary folder (``0700``, the child's ``TMPDIR``): what the child keeps on disk (a
    node's named sets and deterministic mode's early partitions, TensorFlow's own temporary files) goes with it.

    The owner removes it once it has seen the child end, however it ended (returned, raised, killed by SIGKILL).
    An owner that could not (itself killed, the machine stopped) leaves it behind: the next child started on the
    host sweeps every folder of this user whose lock nobody holds.  The owner holds an advisory lock on a file in
    the folder for its life, from the folder's first moment under its name (it is made under another name and
    renamed once locked), so a live owner's folder is never swept, in whatever process namespace that owner runs.
    """

    def __init__(self, base: str) -> None:
        sweep_private_tmp(base)
        making = tempfile.mkdtemp(prefix=".tfos_nb-new-", dir=base)
        try:
            self._lock: int | None = os.open(os.path.join(making, PRIVATE_LOCK),
                                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            self.path = os.path.join(base, PRIVATE_PREFIX + os.path.basename(making)[len(".tfos_nb-new-"):])
            os.rename(making, self.path)
        except OSError:
            shutil.rmtree(making, ignore_errors=True)
            raise

    def remove(self) -> None:
        """The folder and all in it go (idempotent)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(lock)


def temp_base(env: dict[str, str]) -> str:
    """Where a child's private folder goes: under the ``TMPDIR`` its environment names, else this process's."""
    wanted = env.get("TMPDIR")
    return wanted if wanted and os.path.isdir(wanted) else tempfile.gettempdir()


def sweep_private_tmp(base: str) -> list[str]:
    """Remove the private folders under ``base`` left by owners that are gone (no process holds their lock); the
    names removed.  Only this user's folders, never through a link; another user's, or a live owner's, stay."""
    try:
        base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return []
    removed = []
    try:
        for name in os.listdir(base_fd):
            if name.startswith(PRIVATE_PREFIX) and _owner_gone(base_fd, name):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)  # refuses a link, follows none in it
                removed.append(name)
    finally:
        os.close(base_fd)
    return removed


def _owner_gone(base_fd: int, name: str) -> bool:
    """Whether ``name`` is a folder of this user whose lock file nobody holds."""
    try:
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base_fd)
    except OSError:  # a link, a file, gone meanwhile
        return False
    try:
        if os.fstat(folder).st_uid != os.getuid():
            return False
        try:
            lock = os.open(PRIVATE_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except OSError:
            return False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner lives
            return False
        finally:
            os.close(lock)
        return True
    finally:
        os.close(folder)
