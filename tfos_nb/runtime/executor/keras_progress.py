"""The Keras progress callback (imports TensorFlow only when asked for).

Off the hot path: the callback takes Keras' batch logs as tensors
(``_supports_tf_logs``), so Keras does not turn them into numbers — which waits
for the step to finish — after every step; it keeps them and converts and
reports them at most ``FLUSH_S`` apart (every step still reported, in order).
"""

from __future__ import annotations

import time
from typing import Any

FLUSH_S = 0.1  # the Reporter writes at most 10 times a second anyway
PENDING_MAX = 1000  # steps kept between flushes, whatever the time


def _floats(logs: Any) -> dict[str, float]:
    out = {}
    for k, v in (logs or {}).items():
        if hasattr(v, "fetch"):  # a RemoteValue (ParameterServerStrategy's coordinator)
            v = v.fetch()
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def progress_callback(ctx: Any, every_n_steps: int = 1) -> Any:
    import tensorflow as tf

    class ProgressCallback(tf.keras.callbacks.Callback):
        """Reports step, epoch and metrics to the driver through ``ctx.report``."""

        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.epoch = 0
            self._supports_tf_logs = True  # logs stay tensors: no wait for each step's end
            self._pending: list[tuple[int, int, Any]] = []
            self._last = time.monotonic()

        def _flush(self) -> None:
            pending, self._pending = self._pending, []
            self._last = time.monotonic()
            for step, epoch, logs in pending:
                ctx.report(step=step, epoch=epoch, **_floats(logs))

        def on_train_begin(self, logs: Any = None) -> None:
            steps, epochs = self.params.get("steps"), self.params.get("epochs")
            total = steps * epochs if steps and epochs else None
            ctx.report(step=self.step, total_steps=total, total_epochs=epochs or None, epoch=self.epoch)

        def _implements_train_batch_hooks(self) -> bool:
            # ParameterServerStrategy refuses batch-level callbacks: report per epoch there.
            if getattr(tf.distribute.get_strategy(), "_should_use_with_coordinator", False):
                return False
            return True

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch
            if not self._implements_train_batch_hooks() and self.params.get("steps"):
                self.step = epoch * int(self.params["steps"])

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.step += 1
            if self.step % every_n_steps == 0:
                self._pending.append((self.step, self.epoch, logs))
                if time.monotonic() - self._last >= FLUSH_S or len(self._pending) >= PENDING_MAX:
                    self._flush()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if not self._implements_train_batch_hooks() and self.params.get("steps"):
                self.step = (epoch + 1) * int(self.params["steps"])
            self._flush()
            ctx.report(step=self.step, epoch=epoch + 1, **_floats(logs))

        def on_train_end(self, logs: Any = None) -> None:
            self._flush()

    return ProgressCallback()
