"""TFEstimator's ``Retries`` Param: tfos_nb's own (TensorFlowOnSpark has none), in ``args`` only when set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.ml.param import Params, TypeConverters

from ._params import _accessors, _param

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+; only annotations use it


class HasRetries(Params):
    """tfos_nb's Param mixin: the ``Retries`` Param (``setRetries``/``getRetries``)."""
    retries = _param("retries", "start the fit's cluster again up to this many times when a node fails, resuming from "
                     "the last backup ctx.progress_callback() keeps", TypeConverters.toInt)

    if TYPE_CHECKING:  # added by _accessors() below
        def getRetries(self) -> int: ...
        def setRetries(self, value: Any) -> Self: ...


_accessors(HasRetries, "retries")
