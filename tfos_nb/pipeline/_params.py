"""Params shared by TFEstimator and TFModel, and persistence of their Python callables."""

from __future__ import annotations

import os
from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter

_FNS_DIR = "tfos_nb_callables"


def _to_mapping(value: Any) -> dict[str, str]:
    """A column→tensor (or tensor→column) mapping: a dict, or a list meaning identity."""
    if isinstance(value, (list, tuple)):
        value = {str(v): str(v) for v in value}
    if not isinstance(value, dict) or not value:
        msg = f"a mapping must be a non-empty dict of str to str, got {value!r}"
        raise TypeError(msg)
    return {str(k): str(v) for k, v in value.items()}


def _to_opt_str(value: Any) -> str | None:
    return None if value is None or value == "" else TypeConverters.toString(value)


def _param(name: str, doc: str, conv: Any) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=conv)


def _accessors(cls: type, *names: str) -> type:
    """Add ``setX`` / ``getX`` for each Param name (Spark ML's naming)."""
    for name in names:
        cap = name[0].upper() + name[1:]

        def setter(self: Any, value: Any, _n: str = name) -> Any:
            return self._set(**{_n: value})

        def getter(self: Any, _n: str = name) -> Any:
            return self.getOrDefault(getattr(self, _n))

        setter.__doc__ = f"Set ``{name}``: {getattr(cls, name).doc}"
        getter.__doc__ = f"``{name}``: {getattr(cls, name).doc}"
        setattr(cls, f"set{cap}", setter)
        setattr(cls, f"get{cap}", getter)
    return cls


class HasInputMapping(Params):
    inputMapping = _param(
        "inputMapping", "DataFrame column -> input tensor name, signature alias or feature name", _to_mapping
    )


class HasModelDir(Params):
    modelDir = _param("modelDir", "directory of the training checkpoints", TypeConverters.toString)


class HasExportDir(Params):
    exportDir = _param("exportDir", "directory of the exported SavedModel", TypeConverters.toString)


class HasBatchSize(Params):
    batchSize = _param("batchSize", "rows per batch (training feed / inference)", TypeConverters.toInt)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(batchSize=100)


_accessors(HasInputMapping, "inputMapping")
_accessors(HasModelDir, "modelDir")
_accessors(HasExportDir, "exportDir")
_accessors(HasBatchSize, "batchSize")


class _CallablesWriter(DefaultParamsWriter):
    """Params as Spark ML JSON metadata, plus the stage's Python callables, cloudpickled."""

    def saveImpl(self, path: str) -> None:
        super().saveImpl(path)
        import cloudpickle

        blob = cloudpickle.dumps(self.instance._callables())
        # Through Spark, so that any Hadoop file system (HDFS, S3…) works like a local path.
        self.sparkSession.sparkContext.parallelize([blob], 1).saveAsPickleFile(os.path.join(path, _FNS_DIR))


class _CallablesReader(DefaultParamsReader):
    def load(self, path: str) -> Any:
        import cloudpickle

        instance = super().load(path)
        blobs = self.sparkSession.sparkContext.pickleFile(os.path.join(path, _FNS_DIR)).collect()
        if blobs:
            instance._set_callables(cloudpickle.loads(blobs[0]))
        return instance
