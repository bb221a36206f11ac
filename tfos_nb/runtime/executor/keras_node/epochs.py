"""Every epoch of a feed as long as its data: Keras must not take the first epoch's step count for the others.

With a dataset of unknown length, both Kerases count the steps of the first epoch and run exactly that many in
every later epoch (tf_keras: ``DataHandler._inferred_steps``; Keras 3: ``EpochIterator._num_batches``).  A node's
share of a fed epoch varies from epoch to epoch (partitions go to the least busy node), and under
``MultiWorkerMirroredStrategy`` an epoch lasts as long as the largest share.  So a later epoch with fewer steps
ended tf_keras' ``fit`` early ("Your input ran out of data; interrupting training", the remaining epochs
untrained), and one with more steps left its last rows queued: the next epoch's dataset read them, that node
lagged one epoch behind its peers, and the job ended in a hang or in reading the next ``train()`` call's rows
(found by the feed stress run).  On the nodes, for a dataset built on a feed's stream (``as_dataset``, also
under ``map``, ``cache``...) and no ``steps_per_epoch`` given, each epoch runs until its data ends, as the first
does, and Keras 3 does not warn at its end that it "ran out of data; interrupting training" (it warned at every
epoch's end of such a dataset).  Any other dataset keeps Keras' own behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..import_patches import replace_once
from ..tracking.datasets import is_stream_fed

TF_KERAS = "tf_keras.src.engine.data_adapter"
KERAS3 = "keras.src.trainers.epoch_iterator"


def patch_tf_keras(module: Any) -> bool:
    """tf_keras' ``DataHandler.enumerate_epochs``: a stream-fed epoch's step count is not carried to the next."""

    def repair(original: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def enumerate_epochs(self: Any) -> Iterator[Any]:
            fed = self._steps_per_epoch is None and is_stream_fed(getattr(self._adapter, "_dataset", None))
            for epoch, iterator in original(self):
                if fed:
                    self._inferred_steps = None  # until this epoch's data ends (catch_stop_iteration)
                yield epoch, iterator

        return enumerate_epochs

    cls = getattr(module, "DataHandler", None)
    return cls is not None and replace_once(cls, "enumerate_epochs", repair)


def patch_keras3(module: Any) -> bool:
    """Keras 3's ``EpochIterator._enumerate_iterator``: likewise, ``_num_batches`` forgotten at each epoch."""

    def fed(iterator: Any) -> bool:
        adapter = getattr(iterator, "data_adapter", None)
        return iterator.steps_per_epoch is None and is_stream_fed(getattr(adapter, "_dataset", None))

    def repair(original: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def _enumerate_iterator(self: Any) -> Iterator[Any]:
            if fed(self):
                self._num_batches = None  # until this epoch's data ends
                self._current_iterator = None
            yield from original(self)

        return _enumerate_iterator

    def quiet(original: Callable[..., None]) -> Callable[..., None]:
        def _interrupted_warning(self: Any) -> None:
            if not fed(self):  # a fed epoch ends with its data: "ran out of data; interrupting training" is untrue
                original(self)

        return _interrupted_warning

    cls = getattr(module, "EpochIterator", None)
    return cls is not None and replace_once(cls, "_enumerate_iterator", repair) and replace_once(
        cls, "_interrupted_warning", quiet)


def install() -> None:
    """Repair both Kerases' epoch counting in this process as they are imported (now, for one already imported)."""
    from ..import_patches import patch_modules

    patch_modules(lambda name: name == TF_KERAS, patch_tf_keras)
    patch_modules(lambda name: name == KERAS3, patch_keras3)
