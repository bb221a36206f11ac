"""The runtime's logs are private and never another user's: through the real launcher (``spawn_detached``, which
starts every supervisor and coordinator), with what uid ``nobody`` plants at a log's predictable path first."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.server_abuse import as_nobody, as_nobody_wait, writable_by_all
from tfos_nb.runtime import private
from tfos_nb.runtime.driver.launch.start import driver_log_path
from tfos_nb.runtime.executor.process.launch import start_coordinator
from tfos_nb.runtime.protocol import messages

# A coordinator whose meta lacks its settings: it writes a traceback to its log and exits at once.
# no coordinator section: the coordinator process fails at start
BROKEN = messages.LaunchMeta(cluster_id="c0ffee", secret="00", control=["127.0.0.1", 0], hb_interval=0.5, driver_timeout=10.0,
                      env={}, keras="tf_keras", default_fs="file:///", driver_pid=0)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can write, like /tmp (sticky) or a shared work directory."""
    with writable_by_all(0o1777) as d:
        yield d


def test_a_log_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        status, proc = start_coordinator(BROKEN, str(tmp_path / "new.log"))
        (tmp_path / "old.log").write_text("before\n")
        (tmp_path / "old.log").chmod(0o644)
        os.close(private.open_log(str(tmp_path / "old.log")))
    finally:
        os.umask(old)
    assert proc.wait(10) != 0 and "missing field 'name'" in status["error"]  # its output reached its log, and the message
    assert stat.S_IMODE(os.stat(tmp_path / "new.log").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "old.log").st_mode) == 0o600


def test_a_symlink_planted_at_a_log_path_is_not_followed(shared_dir: Path, tmp_path: Path) -> None:
    as_nobody()
    target = tmp_path / "precious"
    target.write_text("precious\n")
    log = shared_dir / "tfos_nb-c0ffee-node0.log"
    as_nobody_wait(lambda: os.symlink(target, log))
    with pytest.raises(OSError, match="cannot open the log .*node0.log: .*a symlink, a special file or another user's"):
        start_coordinator(BROKEN, str(log))
    assert target.read_text() == "precious\n"


def test_a_file_planted_at_a_log_path_by_another_user_is_refused(shared_dir: Path) -> None:
    as_nobody()
    log = shared_dir / "tfos_nb-c0ffee-node0.log"

    def plant() -> None:
        os.close(os.open(log, os.O_WRONLY | os.O_CREAT, 0o666))
        os.chmod(log, 0o666)

    as_nobody_wait(plant)
    with pytest.raises(OSError, match=r"refusing the log .*owned by uid \d+, not this user"):
        start_coordinator(BROKEN, str(log))
    assert log.stat().st_size == 0  # nothing of ours went into their file


def test_a_fifo_planted_at_a_log_path_does_not_block(shared_dir: Path) -> None:
    as_nobody()
    log = shared_dir / "tfos_nb-c0ffee-node0.log"
    as_nobody_wait(lambda: os.mkfifo(log, 0o666))
    with pytest.raises(OSError, match="log .*node0.log"):
        private.open_log(str(log))


def test_a_node_on_the_driver_logs_in_a_fresh_private_directory() -> None:
    first, second = driver_log_path("c0ffee", 0), driver_log_path("c0ffee", 0)
    try:
        assert os.path.dirname(first) != os.path.dirname(second)  # not a name anyone can predict
        st = os.stat(os.path.dirname(first))
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    finally:
        for path in (first, second):
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_the_chiefs_new_tensorboard_log_folder_is_private(tmp_path: Path) -> None:
    """The folder the chief's TensorBoard reads (and Keras' callback writes) is made 0700, not 0755."""
    from tfos_nb.runtime.tensorboard.chief import ChiefTensorBoard

    old = os.umask(0o022)  # the usual umask, which left new folders readable by every user
    logdir = tmp_path / "runs" / "tensorboard_0"
    tb = ChiefTensorBoard("127.0.0.1", str(logdir))
    try:
        tb.start()
        assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "runs").stat().st_mode) == 0o700
    finally:
        tb.stop()
        os.umask(old)


@pytest.mark.slow
def test_the_chiefs_tensorboard_keeps_its_info_file_out_of_a_shared_tmpdir(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 51, finding 4: TensorBoard writes ``<TMPDIR>/.tensorboard-info/pid-N.info`` (a folder it makes 0777,
    following a link planted there).  With the node's ``TMPDIR`` a folder every user may write (no sticky
    bit), uid ``nobody`` plants ``.tensorboard-info`` as a link to a folder of theirs: the chief's TensorBoard
    writes nothing there, its info file is in a TMPDIR of its own (0700), removed when it stops."""
    from tfos_nb.runtime.tensorboard.chief import ChiefTensorBoard

    as_nobody()
    theirs = tmp_path / "nobodys"
    theirs.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    with writable_by_all() as shared:
        as_nobody_wait(lambda: os.symlink(theirs, shared / ".tensorboard-info"))
        monkeypatch.setenv("TMPDIR", str(shared))
        tb = ChiefTensorBoard("127.0.0.1", str(tmp_path / "logs"))
        try:
            tb.start()
            # TensorBoard writes its info file before it serves: once its URL is verified (it answered), it is there
            assert wait_until(lambda: tb.url or tb.error, 300, what="the chief's TensorBoard"), tb.error
            assert tb.url, tb.error
            assert os.listdir(theirs) == [], "TensorBoard wrote through the planted link"
            own = tb._tmpdir
            assert own is not None
            st = os.stat(own)
            assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
            assert [f for f in os.listdir(os.path.join(own, ".tensorboard-info")) if f.startswith("pid-")]
        finally:
            tb.stop()
    assert not os.path.exists(own)
