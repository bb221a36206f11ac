"""The Keras progress callback (imports TensorFlow only when asked for).

Off the hot path: the callback takes Keras' batch logs as tensors
(``_supports_tf_logs``), so Keras does not turn them into numbers — which waits
for the step to finish — after every step; it keeps them and converts and
reports them at most ``FLUSH_S`` apart (every step still reported, in order).

The numbers reported are the model's: under ``MultiWorkerMirroredStrategy`` across
workers, ``tf_keras`` (Keras 2) sums the per-step logs over the replicas (its "auto"
reduction is "sum"; each replica already holds the synchronised value), so a 2-worker
run's batch logs read twice the loss and accuracy that the epoch's logs and
``model.fit(...).history`` report.  The callback divides those per-step values by the
number of replicas (:func:`replica_scale`); Keras 3 ("mean") needs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ... import step_time

FLUSH_S = 0.1  # the Reporter writes at most 10 times a second anyway
PENDING_MAX = 1000  # steps kept between flushes, whatever the time


def _floats(logs: Any, scale: float = 1.0) -> dict[str, float]:
    out = {}
    for k, v in (logs or {}).items():
        if hasattr(v, "fetch"):  # a RemoteValue (ParameterServerStrategy's coordinator)
            v = v.fetch()
        try:
            out[k] = float(v) * scale
        except (TypeError, ValueError):
            continue
    return out


def _resolved_reduction(model: Any, strategy: Any, tf: Any) -> str:
    """The reduction Keras applies to a train step's logs across replicas ("sum", "mean", "first", ...)."""
    method = getattr(model, "distribute_reduction_method", None) or "auto"
    if method != "auto":
        return str(method)
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "first"
    legacy = any(cls.__module__.startswith("tf_keras") for cls in type(model).__mro__)
    return "sum" if legacy else "mean"  # tf_keras' "auto" is "sum", Keras 3's is "mean"


def replica_scale(model: Any, tf: Any) -> float:
    """The factor that turns a train step's logs into the model's values (1.0 but for summed replicas)."""
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)())
    if multi_worker and _resolved_reduction(model, strategy, tf) == "sum":
        # the collective sum of one already-synchronised value per replica
        return 1.0 / max(1, int(strategy.num_replicas_in_sync))
    return 1.0


def progress_callback(ctx: Any, every_n_steps: int = 1) -> Any:
    import tensorflow as tf

    from ...determinism import seeding
    from ...recovery import keras_backup

    class ProgressCallback(tf.keras.callbacks.Callback):  # type: ignore[misc]  # tensorflow: no type information
        """Reports step, epoch and metrics to the driver through ``ctx.report``."""

        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.epoch = 0
            self._supports_tf_logs = True  # logs stay tensors: no wait for each step's end
            self._pending: list[tuple[int, int, Any]] = []
            self._last = time.monotonic()
            self._scale = 1.0  # per-step logs -> the model's values (set at the start of training)
            self._backup = keras_backup.for_node(ctx)  # the job has retries: back up, and restore on a retry
            self._keyed: Callable[[int], None] | None = None  # deterministic tf_keras: draws keyed to the step

        def _flush(self) -> None:
            pending, self._pending = self._pending, []
            self._last = time.monotonic()
            for step, epoch, logs in pending:
                ctx.report(step=step, epoch=epoch, **_floats(logs, self._scale))

        def on_train_begin(self, logs: Any = None) -> None:
            self._scale = replica_scale(self.model, tf)
            if self._backup is not None:
                restored = self._backup.begin(self.model, keras_backup.caller_locals())
                if restored is not None:  # the panel goes on from the backup's step, not from 0
                    self.step = restored.global_step
                    self.epoch = restored.epoch + 1 if restored.epoch_end else restored.epoch
            self._keyed = seeding.step_keyed(self.model)
            steps, epochs = self.params.get("steps"), self.params.get("epochs")
            total = steps * epochs if steps and epochs else None
            ctx.report(step=self.step, total_steps=total, total_epochs=epochs or None, epoch=self.epoch)

        def _implements_train_batch_hooks(self) -> bool:
            # ParameterServerStrategy refuses batch-level callbacks: report per epoch there.
            return not getattr(tf.distribute.get_strategy(), "_should_use_with_coordinator", False)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch
            if not self._implements_train_batch_hooks() and self.params.get("steps"):
                self.step = epoch * int(self.params["steps"])

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            step_time.CLOCK.begin()  # where the step's time goes (the panel's time column)
            if self._keyed is not None:
                self._keyed(self.step)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step_time.CLOCK.end()
            self.step += 1
            if self.step % every_n_steps == 0:
                # epoch k of n, counted from 1 as Keras' own "Epoch k/n" (and the epoch-end report) count it
                self._pending.append((self.step, self.epoch + 1, logs))
                if time.monotonic() - self._last >= FLUSH_S or len(self._pending) >= PENDING_MAX:
                    self._flush()
            if self._backup is not None:
                self._backup.batch_end(self.model, self.epoch, batch, self.step)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if not self._implements_train_batch_hooks() and self.params.get("steps"):
                self.step = (epoch + 1) * int(self.params["steps"])
            self._flush()
            ctx.report(step=self.step, epoch=epoch + 1, **_floats(logs))
            if self._backup is not None:
                self._backup.epoch_end(self.model, epoch, self.step)

        def on_train_end(self, logs: Any = None) -> None:
            step_time.CLOCK.pause()  # an export after fit is not training time
            self._flush()
            if self._backup is not None:
                self._backup.end(self.model)

    return ProgressCallback()
