"""The job's backup folder is this user's alone: what another local user (uid ``nobody``) can do to a shared
backup root, and what they could plant in a job's folder, is refused — on the real folder code, real files and
real links (``tests/test_recovery.py`` runs recovery itself on a real cluster)."""

from __future__ import annotations

import json
import os
import pwd
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.server_abuse import as_nobody, as_nobody_wait, writable_by_all
from tfos_nb.runtime.recovery import files, ledger
from tfos_nb.runtime.recovery.folder import ENV_ROOT, JobBackups
from tfos_nb.runtime.recovery.keras_backup import KerasBackup

NOBODY = pwd.getpwnam("nobody").pw_uid
EPOCH_END = {"seq": 9, "attempt": 1, "epoch": 7, "steps": 0, "global_step": 900, "epoch_end": True,
             "steps_per_element": 1, "saved_s": 0.01}  # a backup at epoch 8's end: the retry would skip 8 epochs


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A folder every user can write with the sticky bit, as /tmp."""
    as_nobody()
    with writable_by_all(0o1777) as d:
        yield d


def _backup(folder: str, seq: int) -> None:
    Path(folder, f"weights-{seq}.npz").touch(0o600)
    ledger.commit(folder, ledger.Backup(seq, 1, 0, 0, 10, True, 1, 0.01))


def test_a_root_another_user_owns_is_refused(sticky: Path) -> None:
    root = sticky / "backups"  # a guessable shared path nobody made first
    as_nobody_wait(lambda: os.mkdir(root, 0o755))
    with pytest.raises(ValueError, match=re.escape(f"backup_dir {root}: it is owned by uid {NOBODY}, not this user")
                       + r".*another user could replace the job's backups.*mkdir -m 700"):
        JobBackups.open("local[2]", str(root))
    assert os.listdir(root) == []
    team = sticky / "team"  # a folder of ours below one of theirs: they can rename ours away
    as_nobody_wait(lambda: os.mkdir(team, 0o755))
    (team / "mine").mkdir(mode=0o700)
    with pytest.raises(ValueError, match=re.escape(f"the folder above it, {team}, is owned by uid {NOBODY}")):
        JobBackups.open("local[2]", str(team / "mine"))


def test_a_root_others_can_write_is_refused_unless_it_is_sticky_as_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    as_nobody()
    with writable_by_all(0o777) as root:
        with pytest.raises(ValueError, match=re.escape(f"backup_dir {root}: it is writable by other users (mode 0777) "
                                                       f"without the sticky bit") + ".*" + re.escape(f"chmod go-w {root}")):
            JobBackups.open("local[2]", str(root))
        monkeypatch.setenv(ENV_ROOT, str(root))
        with pytest.raises(ValueError, match=re.escape(f"${ENV_ROOT} {root}: it is writable by other users")):
            JobBackups.open("yarn")
        assert os.listdir(root) == []
        root.chmod(0o1777)  # the sticky bit: only an entry's owner may rename or remove it
        backups = JobBackups.open("yarn")
        assert backups is not None and backups.attempt(1)[ledger.ENV_DIR] == backups.folder

        def swap() -> None:
            try:
                os.rename(backups.folder, str(root / "away"))
            except PermissionError:
                return
            raise AssertionError("nobody renamed the job's folder in a sticky root")

        as_nobody_wait(swap)
        backups.close()
        assert os.listdir(root) == []


def test_links_planted_in_the_job_folder_are_not_followed(sticky: Path, tmp_path: Path) -> None:
    backups = JobBackups.open("local[2]", str(sticky))
    assert backups is not None
    folder = backups.folder
    backups.attempt(1)
    precious = tmp_path / "precious"
    precious.write_text("precious\n")
    theirs = sticky / "theirs.json"
    os.chmod(folder, 0o777)  # what a folder another user can write allows (the test loosens ours for a moment)

    def plant() -> None:
        theirs.write_text(json.dumps(EPOCH_END))
        os.symlink(precious, os.path.join(folder, "elements-a1-chief0.jsonl"))
        os.symlink(theirs, os.path.join(folder, "state-9.json"))

    as_nobody_wait(plant)
    os.chmod(folder, 0o700)
    log = ledger.ElementLog(folder, 1, "chief:0")
    with pytest.raises(ValueError, match=re.escape(f"backup folder {folder} holds elements-a1-chief0.jsonl, which "
                                                   "cannot be opened (it is a symlink)")):
        log.element(1, 0, [(0, 0, 4)])
    assert precious.read_text() == "precious\n"
    with pytest.raises(ValueError, match=r"holds state-9\.json, which cannot be opened \(it is a symlink\): it is "
                                         r"not what this job wrote"):
        backups.attempt(2)  # not a plan made of their backup
    backups.close()


def test_a_link_planted_at_the_weights_is_not_loaded(sticky: Path) -> None:
    backups = JobBackups.open("local[2]", str(sticky))
    assert backups is not None
    folder = backups.folder
    theirs = sticky / "theirs.npz"
    os.chmod(folder, 0o777)

    def plant() -> None:
        with open(theirs, "wb") as f:
            np.savez(f, n=np.int64(0), n_weights=np.int64(0))
        os.symlink(theirs, os.path.join(folder, "weights-9.npz"))

    as_nobody_wait(plant)
    os.chmod(folder, 0o700)
    node = KerasBackup(SimpleNamespace(is_chief=True, attempt=2), folder)
    model = SimpleNamespace(variables=[], optimizer=None)  # a model of no variables: what matters is the file
    with pytest.raises(ValueError, match=r"holds weights-9\.npz, which cannot be opened \(it is a symlink\)"):
        node._restore(model, ledger.Backup(**EPOCH_END))
    backups.close()


def test_a_job_folder_swapped_between_attempts_is_detected(sticky: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backups = JobBackups.open("local[2]", str(sticky))
    assert backups is not None
    folder = backups.folder
    backups.attempt(1)
    _backup(folder, 1)
    sticky.chmod(0o777)  # the root loses its sticky bit for a moment: what a root others can write allows

    def swap() -> None:
        os.rename(folder, folder + "-away")
        os.mkdir(folder, 0o700)
        with open(os.path.join(folder, "state-9.json"), "w") as f:
            f.write(json.dumps(EPOCH_END))

    as_nobody_wait(swap)
    sticky.chmod(0o1777)
    replaced = re.escape(f"the job's backup folder {folder} is owned by uid {NOBODY}, not this job's user")
    with pytest.raises(ValueError, match=replaced):
        backups.attempt(2)  # the driver plans no retry from their files
    with pytest.raises(ValueError, match=replaced):
        ledger.ElementLog(folder, 2, "chief:0")  # nor does a node log into their folder
    with pytest.raises(ValueError, match=replaced):
        KerasBackup(SimpleNamespace(is_chief=True, attempt=2), folder)  # or restore from it
    backups.close()
    assert os.path.isdir(folder)  # theirs: not removed
    monkeypatch.setenv(files.ENV_OWNER, str(NOBODY))  # were nobody the driver's user (its nodes running as root)
    assert [b.seq for b in ledger.backups(folder)] == [9]


def test_a_job_folder_replaced_by_another_folder_of_this_users_is_detected(tmp_path: Path) -> None:
    backups = JobBackups.open("local[2]", str(tmp_path))
    assert backups is not None
    backups.attempt(1)
    os.rename(backups.folder, backups.folder + "-away")
    os.mkdir(backups.folder, 0o700)
    with pytest.raises(ValueError, match=re.escape(f"backup folder {backups.folder} was replaced since this job "
                                                   "made it")):
        backups.attempt(2)


def test_a_node_of_another_account_says_it_cannot_enter_the_folder(sticky: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   ) -> None:
    """A shared Spark standalone cluster runs every node as its workers' account, the driver as the notebook's user:
    a node's first use of the driver's 0700 folder (its feed's element log, its Keras backup) is one ValueError
    naming both accounts and what to do instead — not the error that says another user tampered with it."""
    backups = JobBackups.open("spark://127.0.0.1:7077", str(sticky))
    assert backups is not None
    monkeypatch.setenv(files.ENV_OWNER, backups.attempt(1)[files.ENV_OWNER])  # as every node of the job gets it
    read, write = os.pipe()

    def node() -> None:
        for first_use in (lambda: ledger.ElementLog(backups.folder, 1, "chief:0"),
                          lambda: KerasBackup(SimpleNamespace(is_chief=True, attempt=1), backups.folder)):
            try:
                first_use()
            except ValueError as exc:
                os.write(write, f"{exc}\n".encode())

    as_nobody_wait(node)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read().splitlines()
    backups.close()
    expected = (f"the job's backup folder {backups.folder} belongs to the notebook's user, root (uid 0), and this node "
                f"runs as nobody (uid {NOBODY}), which cannot enter it: retries resume from backups only where the "
                "nodes run as the notebook's user")
    assert len(said) == 2 and all(s.startswith(expected) for s in said), said
    assert all(s.endswith("leave out backup_dir and TFOS_NB_BACKUP_ROOT, and each retry starts again from the first "
                          "step") for s in said), said


def test_a_malformed_file_in_the_folder_is_one_clear_error(tmp_path: Path) -> None:
    folder = str(tmp_path)
    state = tmp_path / "state-3.json"
    for text, why in [('{"seq": 3}', "its attempt is None, not a count"),
                      ("[not json", "it is not a JSON object"),
                      (json.dumps({**EPOCH_END, "seq": 4}), "it says backup 4"),
                      (json.dumps({**EPOCH_END, "seq": 3, "epoch": "7"}), "its epoch is '7', not a count")]:
        state.write_text(text)
        with pytest.raises(ValueError, match=re.escape(f"the job's backup folder {folder} holds state-3.json, which "
                                                       f"is not a backup's state ({why}): it is not what this job")):
            ledger.plan(folder)
    state.unlink()
    (tmp_path / "attempt-1.json").write_text('{"epoch": 0, "skip": {"0": "all"}}')
    with pytest.raises(ValueError, match=r"holds attempt-1\.json, which is not an attempt's start"):
        ledger.Start.load(folder, 1)
    (tmp_path / "attempt-1.json").unlink()
    # an element log's line of another shape ends the log, as a line cut by a kill does
    log = ledger.ElementLog(folder, 1, "chief:0")
    log.element(1, 0, [(0, 0, 2)])
    with open(log.path, "a") as f:
        f.write('{"g":1,"i":1,"s":"rows"}\n')
    _backup_at(folder, 1, steps=1)
    _backup_at(folder, 2, steps=2)  # needs the chief's second element: not in its log
    plan = ledger.plan(folder)
    assert (plan.backup.seq if plan.backup else None, plan.skip) == (1, {0: [(0, 2)]})


def _backup_at(folder: str, seq: int, steps: int) -> None:
    Path(folder, f"weights-{seq}.npz").touch(0o600)
    ledger.commit(folder, ledger.Backup(seq, 1, 0, steps, steps, False, 1, 0.01))
