"""The Keras backup ``ctx.progress_callback()`` keeps in a job with retries, in one real Keras process per case (both
flavours): it saves at epoch ends, a later process restores it and starts at the next epoch with the saved
values, and a user's own ``BackupAndRestore`` makes it stand down.  (The whole of recovery on a real cluster:
``tests/test_recovery.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tfos_nb.runtime.recovery import ledger

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    from tfos_nb.runtime.executor.keras_progress import progress_callback

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
    folder.mkdir()
    first = run(tmp_path, "first", str(folder), flavour, EPOCHS="2")
    newest = ledger.backups(str(folder))[0]
    assert (newest.epoch, newest.epoch_end, newest.global_step) == (1, True, 8)  # 64 rows / 16 a step, 2 epochs
    # another process (a retry's node), a model initialised differently: the backup's values, epoch 3 only
    again = run(tmp_path, "again", str(folder), flavour, EPOCHS="3", SEED="1", TFOS_ATTEMPT="2",
                **{ledger.ENV_SEQ: str(newest.seq)})
    assert again["epochs"] == [2], again
    assert again["first"] == pytest.approx(first["last"], rel=1e-6), (again, first)
    assert again["iterations"] == 8  # the optimizer's state came back with the weights


def test_a_users_own_backup_and_restore_makes_it_stand_down(tmp_path):
    folder = tmp_path / "backups"
    folder.mkdir()
    run(tmp_path, "user_backup", str(folder), "keras3")
    assert ledger.backups(str(folder)) == []
