"""The driver's side of recovery: a job's backup folder, from its first attempt to its end, and each attempt's start.

One owner per job with retries (``run_job(retries=N)``, ``%%tfos_cluster --retries N``): :meth:`JobBackups.open`
makes the folder (``0700``, under the root the user named, else — for a local master, whose nodes share this
machine — under the temporary directory), :meth:`JobBackups.attempt` says what attempt ``n`` restores and feeds
and what its nodes are told (environment variables), and :meth:`JobBackups.close` removes the folder (a folder
of its own under a root the user named: the root stays).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping

from . import ledger
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
        self.resume = Resume(None, 0, {})  # what the running attempt restored and feeds

    @classmethod
    def open(cls, master: str, root: str | None = None) -> JobBackups | None:
        """The job's folder under ``root`` (or ``$TFOS_NB_BACKUP_ROOT``, or, on a local master, the temporary
        directory); None, with a warning, where no folder every node can reach is known."""
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
            os.makedirs(root, exist_ok=True)
        return cls(tempfile.mkdtemp(prefix="tfos_nb-backup-", dir=root))

    def attempt(self, attempt: int) -> Mapping[str, str]:
        """Plan attempt ``attempt`` (1, 2, …) from the backups so far; the environment its nodes get."""
        self.resume = Resume(None, 0, {}) if attempt == 1 else ledger.plan(self.folder)
        seq = self.resume.backup.seq if self.resume.backup else 0
        Start(attempt, self.resume.epoch, self.resume.skip, seq).save(self.folder)
        env = {ledger.ENV_DIR: self.folder}
        if seq:
            env[ledger.ENV_SEQ] = str(seq)
        return env

    def describe(self) -> str:
        """What the running attempt resumed from, for the retry's message."""
        b = self.resume.backup
        if b is None:
            return "from the first step (no backup yet)"
        skipped = self.resume.rows_skipped
        rows = f"; {skipped} row(s) of that epoch already trained are not fed again" if skipped else ""
        return f"from the backup at {b.where}{rows}"

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
