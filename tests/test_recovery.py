"""Recovery with no user code (issue 44), on a real cluster: an executor JVM killed mid-epoch, the job resumes
from the last backup, and every row is trained exactly once per epoch.

The node function is what a user writes today — Keras 3 (``import keras``) under ``MultiWorkerMirroredStrategy``,
``ctx.get_data_feed().as_dataset()``, ``ctx.progress_callback()`` and no checkpoint code.  Its model is the
audit: one embedding weight per row id, a loss that is minus the weight, plain SGD — so each time a row is
trained its weight grows by the same amount, and after the job every weight says how many times Keras
trained on that row (0: missing, 2 × epochs: fed twice).  Nothing but the model's own arithmetic is counted.

Here: the audit through a ``%%tfos_cluster --retries 1`` cell (tf_keras) and through ``run_job`` shrinking to one
node, and deterministic mode (a regression with dropout, in Keras 3 and in tf_keras, whose killed run must end
with a clean run's weights).
``run_trial`` is the audit's one trial through ``run_job`` with a randomly drawn kill: ``benchmarks/recovery_audit.py``
runs 20 of them.
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import sys
import threading
import time
from collections import Counter

import cloudpickle
import numpy as np
import psutil
import pytest

from tests.conftest import NODE_ENV, global_shell_with, spark_fixture, wait_until
from tfos_nb import TFCluster

pytestmark = [pytest.mark.slow]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# backups every half second at least (the default: 2 s), in the executors' environment so that cells get it too
spark = spark_fixture(3, conf={"spark.task.maxFailures": "4", "spark.executorEnv.TFOS_NB_BACKUP_MIN_S": "0.5"})

ROWS, PARTITIONS, BATCH, EPOCHS = 2400, 6, 32, 3  # the audit's trials (benchmarks/recovery_audit.py)
CI_EPOCHS = 2  # this module's own runs: a kill inside the second epoch of two still resumes mid-epoch
# the workload's own step time (the embedding model steps in a few ms; a real one takes longer): an epoch of
# ~38 steps a node lasts a few seconds, so a backup inside an epoch and a kill after it both happen
PAUSE_S = 0.06


def node_start(args, ctx) -> str:
    """On a node: says which executor it runs on (the killer's target) in ``a<attempt>-<role><index>.json``."""
    import json as j
    import os as o

    me = f"{ctx.job_name}{ctx.task_index}"
    with open(o.path.join(args["dir"], f"a{ctx.attempt}-{me}.json"), "w") as f:
        j.dump({"executor": ctx.spark_executor_id, "checkpoint_dir": ctx.checkpoint_dir}, f)
    return me


def paced(keras, args, ctx, me: str):
    """On a node: a callback that logs each step (attempt, global step, time) and takes ``args["pause"]`` s."""
    import os as o
    import time as t

    steps_log = o.path.join(args["dir"], f"steps-{me}.log")

    class Paced(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            with open(steps_log, "a") as f:
                f.write(f"{ctx.attempt} {int(self.model.optimizer.iterations.numpy())} {t.time():.3f}\n")
            t.sleep(args["pause"])

    return Paced()


def audit_fun(args, ctx):
    """Keras 3 (or tf_keras: ``args["flavour"]``) under MWMS, fed by Spark; one weight per row id counts the times
    the row was trained."""
    import os as o

    import numpy as np
    import tensorflow as tf

    if args.get("flavour") == "tf_keras":
        keras = tf.keras  # tf_keras on the nodes (TF_USE_LEGACY_KERAS=1, the nodes' default)
    else:
        import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    me = node_start(args, ctx)
    ds = ctx.get_data_feed().as_dataset(batch_size=args["batch"], columns=(0, 1))

    class MinusWeight(keras.losses.Loss):
        def __init__(self):
            super().__init__(reduction="sum")  # each row's gradient is the same whatever its batch

        def call(self, y_true, y_pred):
            return -tf.reshape(y_pred, [-1])

    with strategy.scope():
        model = keras.Sequential([keras.Input((), dtype="int64"),
                                  keras.layers.Embedding(args["rows"], 1, embeddings_initializer="zeros")])
        model.compile(keras.optimizers.SGD(learning_rate=float(strategy.num_replicas_in_sync)), MinusWeight())

    model.fit(ds, epochs=args["epochs"], verbose=0, callbacks=[ctx.progress_callback(), paced(keras, args, ctx, me)])
    if ctx.is_chief:
        np.save(o.path.join(args["dir"], "weights.npy"), model.layers[0].get_weights()[0][:, 0])


def executor_jvm(sc, executor_id: str) -> psutil.Process | None:
    driver_url = f"@{sc.getConf().get('spark.driver.host')}:{sc.getConf().get('spark.driver.port')}"
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and cmd[
                cmd.index("--executor-id") + 1] == executor_id and cmd[cmd.index("--driver-url") + 1].endswith(driver_url):
            return p
    return None


def audit_frame(spark, skew: bool):
    df = spark.range(0, ROWS, numPartitions=PARTITIONS).selectExpr("id", "cast(1.0 as float) as y")
    if skew:  # partitions of 400, 150, 400, 60, 400, 400 rows
        df = df.where("not (id between 400 and 649) and not (id between 1200 and 1539)")
    return df


def counts(weights: np.ndarray, ids: list[int], epochs: int) -> Counter:
    """Times each of ``ids`` was trained, from its weight (one training adds the same amount, measured)."""
    unit = float(np.median(weights[ids])) / epochs
    return Counter({i: int(round(float(weights[i]) / unit)) for i in ids})


class Killer:
    """Kills the executor JVM under ``target`` once a backup inside epoch ``epoch`` landed and the chief went
    ``extra`` steps past it (what the job does afterwards is the test's)."""

    def __init__(self, sc, folder_root: str, out: str, epoch: int, target: str, extra: int,
                 for_good: bool = False) -> None:
        self.sc, self.root, self.out, self.epoch, self.target, self.extra = sc, folder_root, out, epoch, target, extra
        self.for_good = for_good  # through Spark (sc.killExecutor): the application's size shrinks, no replacement
        self.killed_at: float | None = None
        self.backup: dict | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _backup_inside_epoch(self):
        for path in glob.glob(os.path.join(self.root, "tfos_nb-backup-*", "state-*.json")):
            try:
                with open(path) as f:
                    b = json.load(f)
            except (OSError, ValueError):
                continue
            if b["epoch"] == self.epoch and not b["epoch_end"] and b["attempt"] == 1:
                return b
        return None

    def _chief_step(self) -> int:
        try:
            with open(os.path.join(self.out, "steps-chief0.log")) as f:
                return max(int(line.split()[1]) for line in f if line.startswith("1 "))
        except (OSError, ValueError):
            return 0

    def _run(self) -> None:
        b = wait_until(self._backup_inside_epoch, 120)
        if not b:
            self.error = f"no backup inside epoch {self.epoch + 1} in 120 s"
            return
        self.backup = b
        if not wait_until(lambda: self._chief_step() >= b["global_step"] + self.extra, 60):
            self.error = f"the chief did not reach step {b['global_step'] + self.extra}"
            return
        with open(os.path.join(self.out, f"a1-{self.target}.json")) as f:
            executor = json.load(f)["executor"]
        if self.for_good:
            self.killed_at = time.time()
            self.sc._jsc.sc().killExecutor(executor)
            return
        jvm = executor_jvm(self.sc, executor)
        if jvm is None:
            self.error = f"no JVM for executor {executor}"
            return
        self.killed_at = time.time()
        jvm.kill()

    def join(self) -> None:
        self._thread.join(10)


def audit(out, ids: list[int], killer: Killer, epochs: int) -> dict:
    """The audit of one job's end: each row's count from the chief's final weights; where attempt 2 began."""
    seen = counts(np.load(out / "weights.npy"), ids, epochs)
    steps = [tuple(line.split()) for line in open(out / "steps-chief0.log")]
    # None: attempt 2 took no step — it resumed from a backup after the last epoch's last step (the worker's node
    # outlived its JVM to the end of training, its end lost with it: a slow machine's case)
    first = min((int(s) for a, s, _ in steps if a == "2"), default=None)
    return {"backup": killer.backup, "first_step": first,
            # steps the chief took after the backup it resumed from: computed again, their rows fed again
            "steps_repeated": max(int(s) for a, s, _ in steps if a == "1") - (first - 1) if first else 0,
            "kill_to_step_s": min(float(w) for a, _, w in steps if a == "2") - killer.killed_at if first else None,
            "duplicates": sum(1 for n in seen.values() if n > epochs),
            "missing": sum(1 for n in seen.values() if n < epochs), "rows": len(ids)}


# where a retry of a job killed inside epoch 2 of 2 resumes: inside it, or after its last step when the lost node
# lived on to it (ledger.plan: the next epoch, with no step left to take)
RESUMED_IN_EPOCH_2 = ("from the backup at epoch 2, step ", "from the backup after the last step of epoch 2 ")


def resumed_past(trial: dict, killer: Killer) -> bool:
    """Attempt 2 began after the backup the killer waited for (one inside epoch 2, past the first step), or took no
    step: it resumed after the last."""
    return trial["first_step"] is None or trial["first_step"] >= killer.backup["global_step"] + 1 > 1


def draw(seed: int, epochs: int) -> tuple[int, str, int, bool]:
    """A trial's kill epoch (0-based), node, steps past the backup, and whether its partitions are skewed."""
    rng = random.Random(seed)
    return rng.randrange(epochs), rng.choice(["chief0", "worker0"]), rng.randrange(0, 8), rng.random() < 0.5


def run_trial(spark, tmp_path, seed: int, epochs: int = EPOCHS) -> dict:
    """One trial through ``run_job``: kill step, node and skew drawn from ``seed``; returns the audit's figures
    (``benchmarks/recovery_audit.py``)."""
    epoch, target, extra, skew = draw(seed, epochs)
    out, root = tmp_path / f"out-{seed}", tmp_path / f"backups-{seed}"
    out.mkdir()
    df = audit_frame(spark, skew)
    ids = [r.id for r in df.select("id").collect()]
    sc = spark.sparkContext
    killer = Killer(sc, str(root), str(out), epoch, target, extra)
    args = {"dir": str(out), "rows": ROWS, "batch": BATCH, "epochs": epochs, "pause": PAUSE_S}
    outcome = TFCluster.run_job(sc, audit_fun, args, 2, master_node="chief", data=df, num_epochs=epochs,
                                env=NODE_ENV, retries=1, backup_dir=str(root))
    killer.join()
    assert killer.error is None, killer.error
    assert outcome.attempts == 2, outcome
    return {"seed": seed, "epoch": epoch + 1, "node": target, "skew": skew, "resumed": outcome.resumed[0],
            **audit(out, ids, killer, epochs), "folder_left": os.listdir(root)}


@pytest.fixture(scope="module")
def ip(spark):
    yield from global_shell_with(spark, "audited")


def test_a_retried_cell_resumes_from_the_last_backup_with_no_code_of_its_own(ip, spark, tmp_path, monkeypatch,
                                                                            no_leaks):
    """The same job as a ``%%tfos_cluster --retries 1`` cell, written with ``tf.keras`` (tf_keras on the nodes): the
    worker's executor killed inside epoch 2."""
    root, out = tmp_path / "backups", tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("TFOS_NB_BACKUP_ROOT", str(root))  # where the cell's job folder goes (default: the temp dir)
    df = audit_frame(spark, skew=True)
    ids = [r.id for r in df.select("id").collect()]
    ip.user_ns.update(audit_df=df, audit_fun=audit_fun, audit_args={"dir": str(out), "rows": ROWS, "batch": BATCH,
                                                                    "epochs": CI_EPOCHS, "pause": PAUSE_S,
                                                                    "flavour": "tf_keras"})
    killer = Killer(spark.sparkContext, str(root), str(out), 1, "worker0", 3)
    ip.run_cell_magic("tfos_cluster", f"--workers 2 --data audit_df --epochs {CI_EPOCHS} --args audit_args --retries 1 "
                                      "--name audited", "audit_fun(args, ctx)")
    killer.join()
    assert killer.error is None, killer.error
    handle = ip.user_ns["audited"]
    assert handle.result["state"] == "finished" and handle.result["attempts"] == 2, handle.result
    said = [line for line in handle.output if "attempt 2 resumes" in line]
    assert len(said) == 1 and any(f"resumes {w}" in said[0] for w in RESUMED_IN_EPOCH_2), handle.output[-30:]
    trial = audit(out, ids, killer, CI_EPOCHS)
    assert resumed_past(trial, killer), trial
    assert (trial["duplicates"], trial["missing"]) == (0, 0), trial
    assert os.listdir(root) == []
    # the panel's step went on from the backup's: the backup's global step plus the steps attempt 2 took
    restored = int(re.search(r"\(global step (\d+)\)", said[0]).group(1))
    taken = sum(1 for line in open(out / "steps-chief0.log") if line.startswith("2 "))
    assert handle.result["steps"]["chief:0"] == restored + taken, (handle.result, restored, taken)


def regression_fun(args, ctx):
    """A regression as a tutorial writes it (``Dense``, ``Dropout``, Adam, mean squared error) in Keras 3 or tf_keras
    (``args["flavour"]``) under MWMS, fed by Spark: its final weights depend on which rows each step trained on, in
    which order, and on dropout's draws — so they equal a clean run's only if none of that changed across the kill."""
    import os as o

    import numpy as np
    import tensorflow as tf

    if args["flavour"] == "tf_keras":
        keras = tf.keras  # tf_keras on the nodes (TF_USE_LEGACY_KERAS=1)
    else:
        import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    me = node_start(args, ctx)
    ds = ctx.get_data_feed().as_dataset(batch_size=args["batch"], columns=(0, 1))
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(16, activation="tanh"),
                                  keras.layers.Dropout(0.2), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(ds, epochs=args["epochs"], verbose=0, callbacks=[ctx.progress_callback(), paced(keras, args, ctx, me)])
    if ctx.is_chief:
        np.savez(o.path.join(args["dir"], "weights.npz"), *model.get_weights())


def regression_frame(spark):
    """Three features and a target from each row id, in skewed partitions (400, 150, 400, 60, 400, 400 rows)."""
    return audit_frame(spark, skew=True).selectExpr(
        "array(cast(sin(id) as float), cast(cos(id * 0.7) as float), cast((id % 13) / 13.0 as float)) as x",
        "cast(sin(id * 0.3) + 0.1 * (id % 7) as float) as y")


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_deterministic_mode_ends_a_job_that_lost_an_executor_with_a_clean_runs_weights(spark, tmp_path, no_leaks,
                                                                                       flavour):
    """``deterministic=True, seed=7``: a clean run, then the same job with the worker's executor JVM killed inside
    epoch 2 (after a backup); the resumed job's final weights are the clean run's, bit for bit — dropout's draws
    included (tf_keras': from the ``tf.random.Generator`` deterministic mode turns on, its state in the backup).  No
    memory for early partitions (``TFOS_NB_FEED_HOLD_MB=0``): every one that comes before its turn goes through the
    node's disk."""
    sc, df = spark.sparkContext, regression_frame(spark)
    weights = {}
    for run in ("clean", "killed"):
        out, root = tmp_path / f"out-{run}", tmp_path / f"backups-{run}"
        out.mkdir()
        killer = Killer(sc, str(root), str(out), 1, "worker0", 3) if run == "killed" else None
        args = {"dir": str(out), "batch": BATCH, "epochs": CI_EPOCHS, "pause": PAUSE_S, "flavour": flavour}
        outcome = TFCluster.run_job(sc, regression_fun, args, 2, master_node="chief", data=df, num_epochs=CI_EPOCHS,
                                    env={**NODE_ENV, "TFOS_NB_FEED_HOLD_MB": "0"}, keras=flavour, retries=1,
                                    backup_dir=str(root), deterministic=True, seed=7)
        if killer is not None:
            killer.join()
            assert killer.error is None, killer.error
            assert outcome.attempts == 2 and outcome.resumed[0].startswith(RESUMED_IN_EPOCH_2), outcome
        else:
            assert outcome.attempts == 1, outcome
        with np.load(out / "weights.npz") as saved:
            weights[run] = [saved[k] for k in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(weights["clean"], weights["killed"], strict=True))
    scale = max(float(np.max(np.abs(a))) for a in weights["clean"])
    print(f"\ndeterministic ({flavour}): largest weight difference, killed run vs clean run: {gap:.3g} "
          f"(weights up to {scale:.3g})")
    assert gap == 0.0, gap


def executor_ids(sc) -> list[str]:
    driver_url = f"@{sc.getConf().get('spark.driver.host')}:{sc.getConf().get('spark.driver.port')}"
    ids = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and cmd[
                cmd.index("--driver-url") + 1].endswith(driver_url):
            ids.append(cmd[cmd.index("--executor-id") + 1])
    return sorted(ids)


# last in the module: it takes two of the application's three executors away for good
def test_a_retry_shrinks_to_the_nodes_left_when_a_slot_does_not_come_back(spark, tmp_path, no_leaks):
    """``min_workers=1``: the application is down to one slot after the worker's executor is taken away (Spark's
    ``killExecutor``: no replacement), so the retry starts on the chief alone after ``shrink_after``."""
    from tfos_nb.runtime.driver.launch.slots import available_slots

    sc = spark.sparkContext
    spare = executor_ids(sc)[0]
    sc._jsc.sc().killExecutor(spare)  # two slots left: the job's two nodes take them
    assert wait_until(lambda: available_slots(sc)[0] == 2, 60), available_slots(sc)
    out, root = tmp_path / "out", tmp_path / "backups"
    out.mkdir()
    df = audit_frame(spark, skew=False)
    ids = [r.id for r in df.select("id").collect()]
    killer = Killer(sc, str(root), str(out), 1, "worker0", 2, for_good=True)
    args = {"dir": str(out), "rows": ROWS, "batch": BATCH, "epochs": CI_EPOCHS, "pause": PAUSE_S}
    outcome = TFCluster.run_job(sc, audit_fun, args, 2, master_node="chief", data=df, num_epochs=CI_EPOCHS,
                                env=NODE_ENV, retries=1, backup_dir=str(root), min_workers=1, shrink_after=5)
    killer.join()
    assert killer.error is None, killer.error
    assert outcome.attempts == 2, outcome
    assert [n.label for n in outcome.status.nodes] == ["chief:0"], outcome.status.nodes
    assert outcome.resumed[0].startswith(RESUMED_IN_EPOCH_2), outcome.resumed
    assert outcome.resumed[0].endswith(", on 1 of 2 training nodes (1 task slot(s) did not come back within 5 s)")
    trial = audit(out, ids, killer, CI_EPOCHS)
    assert resumed_past(trial, killer), trial
    assert (trial["duplicates"], trial["missing"]) == (0, 0), trial
