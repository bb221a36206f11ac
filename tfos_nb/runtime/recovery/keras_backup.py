"""The Keras backup ``ctx.progress_callback()`` keeps when the job has retries: the user writes no checkpoint code.

On every node of a job with retries the driver names a backup folder (:mod:`..recovery.ledger`).  The chief
saves the model's and optimizer's values there, inside epochs and at each epoch's end; when an attempt fails
the driver picks the newest backup it can resume from exactly, and every node of the next attempt restores it
before the first step and starts at its epoch (``fit``'s own ``initial_epoch`` mechanism) — the fed epoch
then holds only the rows that backup had not trained on.

When: a save costs the chief's training thread its duration (reading the values and writing them), so the
next one waits until :data:`BUDGET` of the time since the last cost as much — at least :data:`MIN_INTERVAL_S`
apart — and only at a step where every node had taken whole elements (a multiple of ``steps_per_element``).
The chief alone saves: reading a variable's local copy needs no collective, so no node has to take part.

A user's own ``BackupAndRestore`` in the same ``fit`` keeps working: this backup then stands down (one restore,
the user's).
"""

from __future__ import annotations

import os
import sys
import time
import zipfile
from typing import Any

import numpy as np

from ..determinism import ENV_DETERMINISTIC, seeding
from . import ledger
from .files import refused

_RESTORED: list[int] = []  # the backup this process restored (once: by the first fit)

BUDGET = 0.02  # a save's share of the time between saves, at most
MIN_INTERVAL_S = float(os.environ.get("TFOS_NB_BACKUP_MIN_S", "2.0"))


def _local_value(v: Any) -> np.ndarray:
    """A variable's value on this node, without a collective: a distributed variable's first local copy."""
    inner = v
    if not hasattr(v, "values") and hasattr(v, "_value"):  # a Keras 3 variable: its TensorFlow variable
        inner = v._value
    copies = getattr(inner, "values", None)
    if isinstance(copies, tuple) and copies:
        inner = copies[0]
    return np.asarray(inner.numpy())


def _user_backup(caller_locals: dict[str, Any]) -> bool:
    """Whether the ``fit`` calling us has a ``BackupAndRestore`` of its own (Keras gives a callback no view of
    the others: the calling ``CallbackList`` is read from the frame that called ``on_train_begin``)."""
    callbacks = getattr(caller_locals.get("self"), "callbacks", None) or []
    return any(cls.__name__ == "BackupAndRestore" for cb in callbacks for cls in type(cb).__mro__)


def steps_per_element(model: Any) -> int:
    """Steps a node takes per element of its dataset (see :mod:`..recovery.ledger`); 0 when not known."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None:
        return 1
    in_sync = int(strategy.num_replicas_in_sync)
    extended = strategy.extended
    if type(strategy).__name__.startswith("ParameterServerStrategy"):
        return 0  # a coordinator's datasets: not a node's stream
    multi = getattr(extended, "_in_multi_worker_mode", lambda: False)()
    local = len(getattr(extended, "worker_devices", ())) if multi else in_sync
    return in_sync // local if local else 0


def _variables(model: Any) -> tuple[list[Any], list[Any]]:
    """The model's variables — ``model.variables``: its weights and, in Keras 3, the state of its layers' seed
    generators (dropout's, the random layers'), without which a resumed run would draw other masks — and its
    optimizer's.  (tf_keras' random layers keep no state a resumed run needs: :func:`tfos_nb.runtime.determinism.seeding.step_keyed`.)"""
    optimizer = getattr(model, "optimizer", None)
    return list(model.variables), list(getattr(optimizer, "variables", ()) or ())


def _unrestorable_draws(model: Any) -> str | None:
    """Why a deterministic job's resumed run would draw other random numbers than its clean run; None when it
    would not.  A tf_keras layer on legacy stateful random ops (``tf.random.uniform`` and the like) keeps its
    draws' state in the process, where no backup reaches it; on a ``tf.random.Generator`` (deterministic mode turns
    it on) each step's draws follow from the step (:func:`tfos_nb.runtime.determinism.seeding.step_keyed`)."""
    for layer, gen in seeding.random_generators(model):
        if getattr(gen, "_rng_type", None) == "legacy_stateful":
            return (f"deterministic=True with retries cannot restore the random draws of layer {layer.name!r}: it "
                    "uses tf_keras' legacy stateful random ops, whose state no backup holds — keep tf_keras' "
                    "tf.random.Generator on (do not call tf.keras.backend.experimental.disable_tf_random_generator() "
                    "or pass rng_type='legacy_stateful'), or start the job with keras='keras3'")
    return None


class KerasBackup:
    """The backup of one node's ``model.fit`` (see the module's docstring)."""

    def __init__(self, ctx: Any, folder: str) -> None:
        self.ctx = ctx
        self.folder = folder
        self.chief = bool(ctx.is_chief)
        self.attempt = int(ctx.attempt)
        self.active = True
        self.spe = 1
        self.seq = max((b.seq for b in ledger.backups(folder)), default=0)
        self._last = time.monotonic()
        self._interval = MIN_INTERVAL_S

    # -- restore --------------------------------------------------------------
    def begin(self, model: Any, caller_locals: dict[str, Any]) -> ledger.Backup | None:
        """At ``on_train_begin``: stand down for a user's own backup, else restore the backup the driver chose;
        returns it (None: training starts afresh)."""
        if _user_backup(caller_locals):
            self.active = False
            return None
        self.spe = steps_per_element(model)
        if os.environ.get(ENV_DETERMINISTIC) == "1":  # refused before training: a resumed run would differ
            problem = _unrestorable_draws(model)
            if problem is not None:
                raise ValueError(problem)
        seq = int(os.environ.get(ledger.ENV_SEQ, "0") or 0)
        if not seq or _RESTORED:  # a second fit() in the same node function continues; it restores nothing
            return None
        _RESTORED.append(seq)
        b = ledger.backup(self.folder, seq)
        self._restore(model, b)
        model._initial_epoch = ledger.resume_epoch(self.folder, self.attempt, b)  # Keras 3's fit starts there
        training_state = _InitialEpoch(model._initial_epoch)
        if hasattr(model, "_training_state"):  # tf_keras' fit asks its worker-training state after on_train_begin
            model._training_state = training_state
        self._last = time.monotonic()
        return b

    def _restore(self, model: Any, b: ledger.Backup) -> None:
        weights, opt = _variables(model)
        optimizer = getattr(model, "optimizer", None)
        with ledger.open_weights(self.folder, b.seq) as f:
            try:
                with np.load(f, allow_pickle=False) as saved:
                    n_w = int(saved["n_weights"])
                    values = [saved[f"v{i}"] for i in range(int(saved["n"]))]
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # not what _save wrote
                raise refused(self.folder, f"holds the weights of backup {b.seq}, which are not a backup's "
                                           f"({type(exc).__name__}: {exc})") from None
        if optimizer is not None and len(values) - n_w > len(opt):  # not built yet (tf_keras builds at the 1st step)
            with model.distribute_strategy.scope():
                optimizer.build(model.trainable_variables)
            weights, opt = _variables(model)
        targets = weights + opt[: len(values) - n_w]
        if n_w != len(weights) or len(targets) != len(values) or any(
                tuple(t.shape) != v.shape for t, v in zip(targets, values)):
            msg = (f"the backup at {b.where} holds {n_w} model and {len(values) - n_w} optimizer values that do not "
                   f"fit this model ({len(weights)} and {len(opt)}): was the node function changed between attempts?")
            raise ValueError(msg)
        for target, value in zip(targets, values):
            target.assign(value)

    def end(self, model: Any) -> None:
        """At ``on_train_end``: a later ``fit`` of the same model starts where it asks, not at the restored epoch."""
        if getattr(model, "_initial_epoch", None) is not None:
            model._initial_epoch = None
        if isinstance(getattr(model, "_training_state", None), _InitialEpoch):
            model._training_state = None

    # -- save -----------------------------------------------------------------
    def batch_end(self, model: Any, epoch: int, batch: int, global_step: int) -> None:
        steps = batch + 1
        if not (self.active and self.chief and self.spe) or steps % self.spe:
            return
        if time.monotonic() - self._last >= self._interval:
            self._save(model, epoch, steps, global_step, epoch_end=False)

    def epoch_end(self, model: Any, epoch: int, global_step: int) -> None:
        if self.active and self.chief:
            self._save(model, epoch, 0, global_step, epoch_end=True)

    def _save(self, model: Any, epoch: int, steps: int, global_step: int, epoch_end: bool) -> None:
        t0 = time.monotonic()
        weights, opt = _variables(model)
        arrays: dict[str, Any] = {f"v{i}": _local_value(v) for i, v in enumerate(weights + opt)}
        arrays.update(n=np.int64(len(arrays)), n_weights=np.int64(len(weights)))
        self.seq += 1
        ledger.save_weights(self.folder, self.seq, lambda f: np.savez(f, **arrays))
        took = time.monotonic() - t0
        ledger.commit(self.folder, ledger.Backup(self.seq, self.attempt, epoch, steps, global_step, epoch_end,
                                                 self.spe, round(took, 4)))
        now = time.monotonic()
        self._interval = max(MIN_INTERVAL_S, (now - t0) / BUDGET)
        self._last = now


class _InitialEpoch:
    """tf_keras' worker-training state, as its ``fit`` asks it: the epoch (and step 0) to start at."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: Any, initial_epoch: int, mode: Any = None) -> Any:
        return self.epoch, 0

    def back_up(self, *args: Any, **kwargs: Any) -> None:
        pass

    def delete_backup(self, *args: Any, **kwargs: Any) -> None:
        pass


def for_node(ctx: Any) -> KerasBackup | None:
    """The node's backup, when its job has retries (the driver named a folder); else None."""
    folder = os.environ.get(ledger.ENV_DIR)
    return KerasBackup(ctx, folder) if folder else None


def caller_locals() -> dict[str, Any]:
    """The locals of the frame that called our caller (``on_train_begin``'s caller: Keras' ``CallbackList``)."""
    return sys._getframe(2).f_locals
