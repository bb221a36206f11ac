"""The driver's side of recovery: a job's backup folder, from its first attempt to its end, and each attempt's start.

One owner per job with retries (``run_job(retries=N)``, ``%%tfos_cluster --retries N``): :meth:`JobBackups.open`
makes the folder (``0700``, under the root the user named, else — for a local master, whose nodes share this
machine — under the temporary directory), :meth:`JobBackups.attempt` says what attempt ``n`` restores and feeds
and what its nodes are told (environment variables), and :meth:`JobBackups.close` removes the folder (a folder
of its own under a root the user named: the root stays).

Whoever can rename the job's folder can put their own in its place — the backups every node restores and the
rows the retry skips — so the root must be safe before anything is written there (:func:`check_root`): it and
every folder above it (as named and as resolved) are this user's or root's, and none is writable by others
without the sticky bit (``/tmp``'s ``1777`` is safe: there only an entry's owner may rename it).  A root that is
not is refused with a ValueError saying how to fix it, not replaced by a private folder of this machine's:
the nodes of a cluster could not reach that one, and retries would start from the first step unannounced.
The folder itself (``0700``, this user's, not a link) is checked at every use (:func:`.files.check_folder`),
and the driver checks at each attempt that it is still the folder it made.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import suppress

from ..private import make_dirs
from . import files, ledger
from .ledger import Resume, Start

log = logging.getLogger(__name__)

#: a root for backup folders (a path every node reaches: NFS, /dbfs, /Volumes), when run_job's backup_dir is not given
ENV_ROOT = "TFOS_NB_BACKUP_ROOT"


def local_master(master: str) -> bool:
    """Whether every node of a Spark application with this master runs on this machine."""
    return master.startswith(("local", "local-cluster"))


class JobBackups:
    """The backup folder of one job, and what each of its attempts restores and feeds."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        st = files.check_folder(folder)
        self._id = (st.st_dev, st.st_ino)  # the folder this job made: another one put in its place is refused
        self.resume = Resume(None, 0, {})  # what the running attempt restored and feeds

    @classmethod
    def open(cls, master: str, root: str | None = None) -> JobBackups | None:
        """The job's folder under ``root`` (or ``$TFOS_NB_BACKUP_ROOT``, or, on a local master, the temporary
        directory); None, with a warning, where no folder every node can reach is known."""
        named = "backup_dir" if root else f"${ENV_ROOT}"
        root = root or os.environ.get(ENV_ROOT) or None
        if root is None and not local_master(master):
            log.warning("tfos_nb: retries start again from the first step: no backup folder every node reaches "
                        "is known (give run_job(backup_dir=...) or set %s to a shared path)", ENV_ROOT)
            return None
        if root is not None and "://" in root:
            msg = (f"backup_dir {root!r}: backups are written to a path every node mounts (NFS, /dbfs, /Volumes); "
                   "a URI is not supported")
            raise ValueError(msg)
        if root is not None:
            make_dirs(root)
        check_root(root or tempfile.gettempdir(), named if root else "the temporary directory")
        folder = tempfile.mkdtemp(prefix="tfos_nb-backup-", dir=root)
        try:
            return cls(folder)
        except ValueError:  # not 0700 and ours once made (a mount that reports other modes and owners)
            with suppress(OSError):
                os.rmdir(folder)
            raise

    def attempt(self, attempt: int) -> Mapping[str, str]:
        """Plan attempt ``attempt`` (1, 2, …) from the backups so far; the environment its nodes get."""
        if not self._same():
            raise files.refused(self.folder, "was replaced since this job made it")
        self.resume = Resume(None, 0, {}) if attempt == 1 else ledger.plan(self.folder)
        seq = self.resume.backup.seq if self.resume.backup else 0
        Start(attempt, self.resume.epoch, self.resume.skip, seq).save(self.folder)
        env = {ledger.ENV_DIR: self.folder, files.ENV_OWNER: str(os.geteuid())}
        if seq:
            env[ledger.ENV_SEQ] = str(seq)
        return env

    def describe(self) -> str:
        """What the running attempt resumed from, for the retry's message."""
        b = self.resume.backup
        if b is None:
            return "from the first step (no backup yet)"
        if self.resume.whole_epoch:
            return (f"from the backup after the last step of epoch {b.epoch + 1} (global step {b.global_step}): all "
                    f"of that epoch was trained, training resumes at epoch {self.resume.epoch + 1}")
        skipped = self.resume.rows_skipped
        rows = f"; {skipped} row(s) of that epoch already trained are not fed again" if skipped else ""
        return f"from the backup at {b.where}{rows}"

    def _same(self) -> bool:
        st = files.check_folder(self.folder)
        return (st.st_dev, st.st_ino) == self._id

    def close(self) -> None:
        try:
            same = self._same()
        except ValueError:
            same = False
        if same:  # a folder put in its place is not ours to remove
            shutil.rmtree(self.folder, ignore_errors=True)


def _folders(path: str) -> Iterator[str]:
    """``path`` and every folder above it."""
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def check_root(root: str, named: str) -> None:
    """ValueError unless no user but this one (and root) can replace what is in ``root``: it and every folder above
    it, as named and as symlinks resolve it, are this user's or root's and not writable by others, or else carry the
    sticky bit (as ``/tmp``); ``named`` is what the user called it (``backup_dir``)."""
    euid = os.geteuid()
    named_path, real = os.path.abspath(root), os.path.realpath(root)
    for path in dict.fromkeys([*_folders(named_path), *_folders(real)]):
        st = os.stat(path)
        mode = stat.S_IMODE(st.st_mode)
        where = "it" if path in (named_path, real) else f"the folder above it, {path},"
        if st.st_uid not in (euid, 0):
            why = f"{where} is owned by uid {st.st_uid}, not this user (uid {euid}) or root"
            fix = "use a folder of your own instead (mkdir -m 700 DIR, in a folder no other user can write)"
        elif mode & 0o022 and not mode & stat.S_ISVTX:
            why = f"{where} is writable by other users (mode {mode:04o}) without the sticky bit"
            fix = f"chmod go-w {path} (or chmod +t {path}, as /tmp is), or use a folder of your own"
        else:
            continue
        msg = (f"{named} {root}: {why}, so another user could replace the job's backups with their own (what every "
               f"node restores and which rows the retry skips); {fix}")
        raise ValueError(msg)
