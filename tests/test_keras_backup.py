"""The Keras backup ``ctx.progress_callback()`` keeps in a job with retries, in one real Keras process per case (both
flavours): it saves at epoch ends, a later process restores it and starts at the next epoch with the saved
values, and a user's own ``BackupAndRestore`` makes it stand down; in deterministic mode a run resumed from it
draws the clean run's dropout masks in both flavours, and a tf_keras layer on legacy random ops is refused.  (The
whole of recovery on a real cluster: ``tests/test_recovery.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tfos_nb.runtime import determinism
from tfos_nb.runtime.recovery import ledger

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    from tfos_nb.runtime.executor.keras_node.progress import progress_callback

    class Ctx:
        is_chief, attempt = True, int(os.environ.get("TFOS_ATTEMPT", "1"))
        def report(self, **kw):
            pass

    mode, out = sys.argv[1], sys.argv[2]
    keras = tf.keras
    tf.keras.utils.set_random_seed(int(os.environ.get("SEED", "0")))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    x = np.random.default_rng(0).random((64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    seen = {"epochs": [], "first": None}

    class Record(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen["epochs"].append(epoch)
            if seen["first"] is None:  # the values training starts from (after any restore)
                seen["first"] = [float(np.sum(w)) for w in self.model.get_weights()]
                seen["iterations"] = int(self.model.optimizer.iterations.numpy())

    callbacks = [progress_callback(Ctx()), Record()]
    if mode == "user_backup":
        callbacks.insert(0, keras.callbacks.BackupAndRestore(os.path.join(out, "user")))
    model.fit(x, y, batch_size=16, epochs=int(os.environ.get("EPOCHS", "2")), verbose=0, callbacks=callbacks)
    seen["last"] = [float(np.sum(w)) for w in model.get_weights()]
    json.dump(seen, open(os.path.join(out, mode + ".json"), "w"))
''')


def run(tmp_path, mode: str, folder: str, flavour: str, **env: str) -> dict:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", **{ledger.ENV_DIR: folder}, **env)
    full["TF_USE_LEGACY_KERAS"] = "1" if flavour == "tf_keras" else "0"
    proc = subprocess.run([sys.executable, str(script), mode, str(tmp_path)], env=full, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"{mode}.json").read_text())


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_a_backup_at_an_epoch_end_is_restored_and_training_starts_at_the_next_epoch(tmp_path, flavour):
    folder = tmp_path / "backups"
    folder.mkdir(mode=0o700)
    first = run(tmp_path, "first", str(folder), flavour, EPOCHS="2")
    newest = ledger.backups(str(folder))[0]
    assert (newest.epoch, newest.epoch_end, newest.global_step) == (1, True, 8)  # 64 rows / 16 a step, 2 epochs
    # another process (a retry's node), a model initialised differently: the backup's values, epoch 3 only
    again = run(tmp_path, "again", str(folder), flavour, EPOCHS="3", SEED="1", TFOS_ATTEMPT="2",
                **{ledger.ENV_SEQ: str(newest.seq)})
    assert again["epochs"] == [2], again
    assert again["first"] == pytest.approx(first["last"], rel=1e-6), (again, first)
    assert again["iterations"] == 8  # the optimizer's state came back with the weights


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_a_node_starts_at_the_epoch_the_driver_planned_from_a_backup_after_an_epochs_last_step(tmp_path, flavour):
    """The chief backed up after epoch 1's last step and was lost before its end: the driver plans the retry at
    epoch 2 (``ledger.plan``: all of epoch 1 was trained) and feeds that; a node restoring the backup starts there
    too, not at epoch 1 again — which it would train a second time on the next epoch's rows."""
    folder = tmp_path / "backups"
    folder.mkdir(mode=0o700)
    first = run(tmp_path, "first", str(folder), flavour, EPOCHS="1")
    end = ledger.backups(str(folder))[0]
    assert (end.epoch, end.epoch_end, end.global_step) == (0, True, 4)
    # the same values as a backup at the epoch's last step, not at its end
    with ledger.open_weights(str(folder), end.seq) as f:
        saved = f.read()
    seq = end.seq + 1
    ledger.save_weights(str(folder), seq, lambda f: f.write(saved))
    ledger.commit(str(folder), ledger.Backup(seq, 1, 0, 4, 4, False, 1, 0.01))
    ledger.Start(2, 1, {}, seq=seq).save(str(folder))  # what the driver planned for attempt 2
    again = run(tmp_path, "again", str(folder), flavour, EPOCHS="2", TFOS_ATTEMPT="2", **{ledger.ENV_SEQ: str(seq)})
    assert again["epochs"] == [1], again
    assert again["first"] == pytest.approx(first["last"], rel=1e-6), (again, first)


def test_a_users_own_backup_and_restore_makes_it_stand_down(tmp_path):
    folder = tmp_path / "backups"
    folder.mkdir(mode=0o700)
    run(tmp_path, "user_backup", str(folder), "keras3")
    assert ledger.backups(str(folder)) == []


DROPOUT_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    from tfos_nb.runtime.determinism import seeding
    seeding.apply()  # the job's seed and deterministic mode, before the function (as on a node)
    import tensorflow as tf
    from tfos_nb.runtime.executor.keras_node.progress import progress_callback

    class Ctx:
        is_chief, attempt = True, int(os.environ.get("TFOS_ATTEMPT", "1"))
        def report(self, **kw):
            pass

    mode, out = sys.argv[1], sys.argv[2]
    keras = tf.keras  # tf_keras or Keras 3, as TF_USE_LEGACY_KERAS says
    if mode == "legacy":  # the user turned tf_keras' tf.random.Generator off again
        keras.backend.experimental.disable_tf_random_generator()
    # two replicas, as two nodes: each epoch's last batch (5 rows) splits 3 + 2, so their dropout draws differ in size
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="tanh"),
                                  keras.layers.Dropout(0.3), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
    x = np.random.default_rng(0).random((69, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    epochs = []

    class Record(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs.append(epoch)

    model.fit(x, y, batch_size=16, epochs=int(os.environ["EPOCHS"]), shuffle=False, verbose=0,
              callbacks=[progress_callback(Ctx()), Record()])
    np.savez(os.path.join(out, mode + ".npz"), *model.get_weights())
    json.dump(epochs, open(os.path.join(out, mode + ".json"), "w"))
''')


def run_dropout(tmp_path, mode: str, folder, flavour: str, **env: str) -> subprocess.CompletedProcess:
    """``DROPOUT_SCRIPT`` as a deterministic job's node runs it (``seed=11``), backing up into ``folder``."""
    script = tmp_path / "dropout.py"
    script.write_text(DROPOUT_SCRIPT)
    folder.mkdir(mode=0o700, exist_ok=True)  # as the driver makes it
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", **{ledger.ENV_DIR: str(folder)},
                **determinism.node_env(True, 11), **env)
    full["TF_USE_LEGACY_KERAS"] = "1" if flavour == "tf_keras" else "0"
    return subprocess.run([sys.executable, str(script), mode, str(tmp_path)], env=full, capture_output=True,
                          text=True, timeout=300)


def final_weights(tmp_path, mode: str) -> list:
    with np.load(tmp_path / f"{mode}.npz") as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_a_deterministic_run_resumed_from_an_epoch_end_draws_the_clean_runs_dropout_masks(tmp_path, flavour):
    """Deterministic mode, ``Dropout(0.3)``, two replicas whose last batch of an epoch differs in size: two epochs
    in one process, against one epoch, then a fresh process (a retry's node) that restores its backup and trains
    the second — the same final weights, bit for bit, only if each replica's dropout draws in the second epoch are
    the clean run's."""
    for mode, epochs in (("clean", "2"), ("first", "1")):
        proc = run_dropout(tmp_path, mode, tmp_path / f"backups-{mode}", flavour, EPOCHS=epochs)
        assert proc.returncode == 0, proc.stderr[-3000:]
    newest = ledger.backups(str(tmp_path / "backups-first"))[0]
    assert (newest.epoch, newest.epoch_end) == (0, True)
    proc = run_dropout(tmp_path, "again", tmp_path / "backups-first", flavour, EPOCHS="2", TFOS_ATTEMPT="2",
                       **{ledger.ENV_SEQ: str(newest.seq)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "again.json").read_text()) == [1]
    clean, again = final_weights(tmp_path, "clean"), final_weights(tmp_path, "again")
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(clean, again, strict=True))
    assert gap == 0.0, f"{flavour}: the resumed run ended {gap:.3g} away from the clean run"


def test_a_deterministic_job_refuses_tf_keras_legacy_random_ops_before_training(tmp_path):
    """A tf_keras ``Dropout`` on legacy stateful random ops (the user turned the generator off): one sentence at
    ``fit``'s start, since no backup could restore its draws."""
    proc = run_dropout(tmp_path, "legacy", tmp_path / "backups", "tf_keras", EPOCHS="1")
    assert proc.returncode != 0
    assert ("ValueError: deterministic=True with retries cannot restore the random draws of layer 'dropout': it uses "
            "tf_keras' legacy stateful random ops") in proc.stderr, proc.stderr[-3000:]
    assert ledger.backups(str(tmp_path / "backups")) == []  # refused before training: not a step, not a backup
