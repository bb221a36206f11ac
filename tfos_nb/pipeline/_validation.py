"""A validation set for ``TFEstimator.fit``: the ``Validation`` Param, the split, and the fitted model's values.

``Validation`` is a fraction of the input rows (``0.2``: a seeded ``randomSplit``) or the name of a boolean
column marking them (Horovod's ``KerasEstimator`` takes the same two).  ``fit`` feeds the rest for training and
those rows once, before the first epoch, as the named set ``validation`` (``train(..., validation=...)``):
``train_fn`` reads them with ``ctx.get_data_feed(qname_in="validation")``.  The fitted :class:`TFModel` keeps
the chief's last Keras ``val_*`` values in its ``ValidationMetrics`` Param, saved with the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.ml.param import Params

from ._params import TFTypeConverters, _accessors, _param

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+; only annotations use it

SPLIT_SEED = 20170101  # the fraction's randomSplit seed: the same rows validate at every fit of the same data


def _to_validation(value: Any) -> float | str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < float(value) < 1:
        return float(value)
    raise ValueError(f"Validation is a fraction of the rows (0 < f < 1) or the name of a boolean column marking "
                     f"them, got {value!r}")


class HasValidation(Params):
    """The ``Validation`` Param (``setValidation``/``getValidation``)."""
    validation = _param("validation", "validation rows: a fraction of the input (0 < f < 1) or a boolean column's name",
                        _to_validation)

    if TYPE_CHECKING:  # added by _accessors() below
        def getValidation(self) -> float | str: ...
        def setValidation(self, value: Any) -> Self: ...


class HasValidationMetrics(Params):
    """The ``ValidationMetrics`` Param of a fitted model: the chief's last ``val_*`` values."""
    validationMetrics = _param("validationMetrics", "the last val_* values Keras reported on the fit's chief",
                               TFTypeConverters.toDict)

    if TYPE_CHECKING:  # added by _accessors() below
        def getValidationMetrics(self) -> dict[str, float]: ...
        def setValidationMetrics(self, value: Any) -> Self: ...


_accessors(HasValidation, "validation")
_accessors(HasValidationMetrics, "validationMetrics")


def split(dataset: Any, validation: float | str) -> tuple[Any, Any]:
    """``(train, validation)`` rows of ``dataset``; ValueError naming the column when it is not boolean."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    if isinstance(validation, float):
        train, val = dataset.randomSplit([1.0 - validation, validation], seed=SPLIT_SEED)
        return train, val
    fields = {f.name: f.dataType for f in dataset.schema.fields}
    if validation not in fields:
        raise ValueError(f"Validation column {validation!r} is not in the DataFrame; its columns: {list(fields)}")
    if not isinstance(fields[validation], BooleanType):
        raise ValueError(f"Validation column {validation!r} is {fields[validation].simpleString()}; it must be boolean "
                         "(true: a validation row)")
    marked = F.col(validation).eqNullSafe(True)
    return dataset.filter(~marked), dataset.filter(marked)


def last_values(view: Any) -> dict[str, float]:
    """The chief's (or first worker's) last reported ``val_*`` values in a finished cluster's view."""
    from ..runtime.executor.tracking.node import chief_index

    found = chief_index([(n.job_name, n.task_index) for n in view.nodes])
    if found is None:
        return {}
    metrics = view.nodes[found].metrics
    return {k: float(v) for k, v in metrics.items()
            if k.startswith("val_") and isinstance(v, (int, float)) and not isinstance(v, bool)}
