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
"""

from ._estimator import TFEstimator, communication_options
from ._model import TFModel

__all__ = ["TFEstimator", "TFModel", "communication_options"]
