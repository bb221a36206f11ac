"""What the users of tests/test_jupyterhub.py run in their kernels: the quickstart's cells, and a short job with retries.

:func:`quickstart_cells`: the quickstart's code cells up to its accuracy line, on the hub's shared Spark cluster
(the session ``spark-defaults.conf`` gives), the training cell with ``--tensorboard`` (and ``--mlflow``, for a user
given a tracking URI) and its nodes held at the end of ``fit``.  :func:`backed_cells`: the quickstart's data and model
trained one epoch with ``--retries 1`` on the user's own embedded ``local-cluster``, whose nodes run as the user, so
that the job keeps backups (on the shared cluster its nodes run as Spark's account and could not).  :class:`Run`:
one such sequence of cells in a kernel of the user's, in a thread, with what it printed and the hold.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import requests

from tests.hub_fixture import Hub, Kernel

REPO = Path(__file__).resolve().parents[1]

# test instrumentation in the user's own kernel: the cluster secrets its driver makes go to a 0600 file of theirs
RECORD_SECRETS = """\
import os
from tfos_nb.runtime.protocol import messages as _messages
_codec_init = _messages.Codec.__init__
def _record_secret(self, secret, *a, **k):
    fd = os.open(os.path.expanduser("~/.cluster-secrets"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, secret.hex().encode() + b"\\n")
    os.close(fd)
    _codec_init(self, secret, *a, **k)
_messages.Codec.__init__ = _record_secret
"""
# a tracking URI with the user's credentials, in the kernel's environment before Spark starts (as a site's spawner
# or a startup file would set it): MLflow's client sends them as basic auth
TRACKING = """\
import os
os.environ["MLFLOW_TRACKING_URI"] = {uri!r}
"""
# the site's way into the shared cluster: spark-defaults.conf (SPARK_CONF_DIR, from the spawner) names the master
SESSION = """\
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("quickstart").getOrCreate()
print("APP", spark.sparkContext.applicationId, spark.sparkContext.master)
"""
HOLD = """\
def hold_at_end(name, folder={folder!r}):
    import os, time
    import tensorflow as tf
    class Hold(tf.keras.callbacks.Callback):  # after fit: say so, and wait (600 s at most) until the test releases
        def on_train_end(self, logs=None):
            open(os.path.join(folder, name + ".held"), "w").close()
            deadline = time.monotonic() + 600
            while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
                time.sleep(0.2)
    return Hold()
"""
AFTER = """\
import json
print("NODES", json.dumps([[f"{n.job_name}:{n.task_index}", n.pid, n.child_pid] for n in digits.nodes]))
print("HISTORY", digits.history.to_json(orient="records"))
"""
# the embedded local-cluster's workers make their executors' folders under $SPARK_HOME/work, and pyspark's own
# (installed for every user) is root's: a Spark home of the user's own, its work folder theirs, the rest pyspark's
OWN_SPARK_HOME = """\
import os, pyspark
installed, home = os.path.dirname(pyspark.__file__), os.path.expanduser("~/spark-home")
os.makedirs(os.path.join(home, "work"))
for name in os.listdir(installed):
    if name != "work":
        os.symlink(os.path.join(installed, name), os.path.join(home, name))
os.environ["SPARK_HOME"] = home
"""
BACKED = """\
%%tfos_cluster --workers 2 --data train_df --epochs 1 --retries 1 --name backed
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = make_model()
model.fit(ctx.get_data_feed().as_dataset(batch_size=32), epochs=args.epochs, verbose=0,
          callbacks=[ctx.progress_callback(), hold_at_end(f"{ctx.job_name}{ctx.task_index}")])
"""


def _quickstart() -> list[str]:
    """The quickstart's code cells up to its accuracy line."""
    nb = json.loads((REPO / "notebooks" / "quickstart.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    return cells[: next(i for i, c in enumerate(cells) if c.startswith("accuracy =")) + 1]


def quickstart_cells(hold_folder: str, export_root: str, tracking: str | None = None) -> list[str]:
    """The quickstart's cells on the shared cluster; the training cell with ``--tensorboard`` and the hold (and
    ``--mlflow``, logging to ``tracking``, the export folder in its args: the SavedModel is logged too); the
    SavedModel in a folder the executors' account can write (the kernel's own temporary folder is the user's)."""
    cells = _quickstart()
    train = next(i for i, c in enumerate(cells) if c.startswith("%%tfos_cluster"))
    export = 'tempfile.mkdtemp(prefix="tfos-digits-")'
    assert export in cells[train - 1], cells[train - 1]
    cells[train - 1] = cells[train - 1].replace(export, repr(export_root))
    old = (" --name digits\n", "callbacks=[ctx.progress_callback()]")
    assert all(o in cells[train] for o in old), cells[train]
    flags = " --name digits --tensorboard" + (" --mlflow tfos-hub --args dict(export_dir=export_dir)" if tracking else "")
    cells[train] = cells[train].replace(old[0], f"{flags}\n").replace(
        old[1], 'callbacks=[ctx.progress_callback(), hold_at_end(f"{ctx.job_name}{ctx.task_index}")]')
    first = [RECORD_SECRETS, *([TRACKING.format(uri=tracking)] if tracking else []), SESSION]
    return [*first, *cells[:train], HOLD.format(folder=hold_folder), cells[train], AFTER, *cells[train + 1:]]


def backed_cells(hold_folder: str) -> list[str]:
    """The quickstart's data (its ``spark_session()``: an embedded local-cluster, in a Spark home of the user's) and
    model, trained one epoch by a job with ``--retries 1``, held at the end of ``fit``; then the embedded Spark
    stopped."""
    cells = _quickstart()
    data = next(c for c in cells if "spark_session(" in c)
    model = next(c for c in cells if "def make_model" in c)
    return [cells[0], OWN_SPARK_HOME, data, model, HOLD.format(folder=hold_folder), BACKED, "spark.stop()"]


def hold_folder(hub: Hub, name: str, owner: str) -> Path:
    """Where the nodes of a run say they are held and wait for the release: ``owner``'s (the nodes' account)."""
    folder = hub.root / "hold" / name
    folder.mkdir(parents=True)
    os.chown(folder, hub.uid(owner), -1)
    return folder


class Run:
    """``cells`` run one after another in ``kernel``, in a thread; its nodes held in ``hold`` until released."""

    def __init__(self, kernel: Kernel, hold: Path, cells: list[str], context: Any = None) -> None:
        self.kernel, self.hold, self.context = kernel, hold, context
        self.user, self.token = kernel.user, kernel.token
        self.outputs: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._cells, args=(cells,), name=f"hub-{hold.name}", daemon=True)
        self.started = time.monotonic()
        self.thread.start()

    def _cells(self, cells: list[str]) -> None:
        try:
            for cell in cells:
                self.outputs.append(self.kernel.execute(cell))
        except BaseException as exc:
            self.error = exc

    def held(self) -> bool:
        assert self.error is None, f"{self.user}: {self.error}"
        return {p.name for p in self.hold.glob("*.held")} == {"chief0.held", "worker0.held"}

    def release(self) -> None:
        (self.hold / "release").touch()

    def text(self) -> str:
        return "".join(o["stdout"] for o in self.outputs)

    def stop(self) -> None:
        """Release the nodes, wait for the cells, and shut the kernel down (a front-end's "Shut Down Kernel")."""
        self.release()
        self.thread.join(300)
        self.kernel.close()
        requests.delete(f"{self.kernel.base}api/kernels/{self.kernel.kernel_id}", timeout=120,
                        headers={"Authorization": f"token {self.token}"}).raise_for_status()
