"""Spark ML pipeline API: :class:`TFEstimator` (``fit``) and :class:`TFModel` (``transform``).

The API proposed in SPARK-22658 ("TensorFlowOnSpark as a scalable deep
learning library of Apache Spark"), on tfos_nb's runtime.  Both classes are
real ``pyspark.ml`` stages: they take Params, drop into a ``Pipeline`` next
to ``VectorAssembler`` or ``StandardScaler``, and persist with ``save`` /
``load``.

``TFModel.transform`` has the SPIP's three styles:

* **SavedModel + named signature** (``ExportDir`` + ``SignatureDefKey``, the
  default ``"serving_default"``): mappings use the signature's input/output
  aliases.
* **SavedModel, no signature** (``ExportDir`` + ``SignatureDefKey=None``): the
  SavedModel is loaded into a ``tf.compat.v1`` graph; mappings use tensor names
  (``"serving_default_features:0"``) which are fed and fetched in a session.
* **Checkpoint** (``ModelDir`` only): ``model_fn()`` rebuilds the Keras model,
  ``tf.train.latest_checkpoint(ModelDir)`` restores its weights; mappings use
  the model's input and output names.

TensorFlowOnSpark's other public names are here too: ``Namespace`` (the
``args`` object: attributes and mapping), ``TFParams`` (``merge_args_params``),
``TFTypeConverters``, the ``Has…`` Param mixins (``HasBatchSize``, ``HasSteps``,
…: ``setX``/``getX`` as there; the Params themselves carry Spark ML's camelCase
names, ``args`` gets the snake_case ones), ``single_node_env(args)`` and
``yield_batch``.
"""

import sys
from collections.abc import Iterable, Iterator
from typing import Any

from ..runtime.args import Namespace
from ._estimator import TFEstimator, communication_options
from ._model import TFModel
from ._params import (
    HasBatchSize,
    HasClusterSize,
    HasEpochs,
    HasExportDir,
    HasGraceSecs,
    HasInputMapping,
    HasInputMode,
    HasMasterNode,
    HasModelDir,
    HasNumPS,
    HasOutputMapping,
    HasProtocol,
    HasReaders,
    HasSignatureDefKey,
    HasSteps,
    HasTagSet,
    HasTensorboard,
    HasTFRecordDir,
    TFParams,
    TFTypeConverters,
)

__all__ = [
    "HasBatchSize", "HasClusterSize", "HasEpochs", "HasExportDir", "HasGraceSecs", "HasInputMapping", "HasInputMode",
    "HasMasterNode", "HasModelDir", "HasNumPS", "HasOutputMapping", "HasProtocol", "HasReaders", "HasSignatureDefKey",
    "HasSteps", "HasTFRecordDir", "HasTagSet", "HasTensorboard", "Namespace", "TFEstimator", "TFModel", "TFParams",
    "TFTypeConverters", "communication_options", "single_node_env", "yield_batch",
]


def single_node_env(args: Any) -> None:
    """TensorFlowOnSpark's ``pipeline.single_node_env``: ``sys.argv`` from an argv list, then ``util.single_node_env``.

    ``args`` is an argv list or arguments with an optional ``argv`` and ``num_gpus`` (default 1).
    """
    from ..runtime.util import single_node_env as _env

    if isinstance(args, list):
        sys.argv = list(args)
        num_gpus = 1
    else:
        if getattr(args, "argv", None):
            sys.argv = list(args.argv)
        num_gpus = int(getattr(args, "num_gpus", 1) if not isinstance(args, dict) else args.get("num_gpus", 1))
    _env(num_gpus)


def yield_batch(iterable: Iterable[Any], batch_size: int, num_tensors: int = 1) -> Iterator[list[list[Any]]]:
    """Batches of rows as ``num_tensors`` column lists of up to ``batch_size`` items (TensorFlowOnSpark's helper)."""
    tensors: list[list[Any]] = [[] for _ in range(num_tensors)]
    for item in iterable:
        if item is None:
            break
        for i in range(num_tensors):
            tensors[i].append(str(item[i]) if isinstance(item[i], bytearray) else item[i])
        if len(tensors[0]) >= batch_size:
            yield tensors
            tensors = [[] for _ in range(num_tensors)]
    if tensors[0]:
        yield tensors
