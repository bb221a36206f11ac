"""Params shared by TFEstimator and TFModel, and persistence of their Python callables."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Protocol, cast

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter

from ..runtime.args import Namespace
from ..runtime.sessions import is_connect

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+; only annotations use it

_FNS_DIR = "tfos_nb_callables"  # the older saveAsPickleFile format: read on classic sessions only
_FNS_TABLE = "tfos_nb_fns"  # one-row parquet table, binary column ``fns``


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


def _param(name: str, doc: str, conv: Any) -> Param[Any]:
    return Param(Params._dummy(), name, doc, typeConverter=conv)


def _accessors(cls: type, *names: str | tuple[str, str]) -> type:
    """Add ``setX`` / ``getX`` for each Param name (Spark ML's naming); ``(name, "X")`` names X explicitly."""
    for entry in names:
        name, cap = entry if isinstance(entry, tuple) else (entry, entry[0].upper() + entry[1:])

        def setter(self: Any, value: Any, _n: str = name) -> Any:
            return self._set(**{_n: value})

        def getter(self: Any, _n: str = name) -> Any:
            return self.getOrDefault(getattr(self, _n))

        setter.__doc__ = f"Set ``{name}``: {getattr(cls, name).doc}"
        getter.__doc__ = f"``{name}``: {getattr(cls, name).doc}"
        setattr(cls, f"set{cap}", setter)
        setattr(cls, f"get{cap}", getter)
    return cls


_PROTOCOLS = ("grpc", "ring", "nccl")
_MODES = {"SPARK": 1, "TENSORFLOW": 0}


def _to_protocol(value: Any) -> str:
    protocol: str = TypeConverters.toString(value).lower()
    if protocol not in _PROTOCOLS:
        msg = (f"Protocol must be one of {list(_PROTOCOLS)}, got {protocol!r} (TensorFlow 2 has no RDMA verbs "
               "transport: 'grpc+verbs' and 'grpc+gdr' are gone)")
        raise ValueError(msg)
    return protocol


def _to_input_mode(value: Any) -> int:
    if isinstance(value, str) and value.upper() in _MODES:
        return _MODES[value.upper()]
    if value in (0, 1) and not isinstance(value, bool):
        return int(value)
    msg = f"InputMode must be InputMode.SPARK (1) or InputMode.TENSORFLOW (0), got {value!r}"
    raise ValueError(msg)


class TFTypeConverters:
    """TensorFlowOnSpark's extra Param type converter (dicts, which Spark's ``TypeConverters`` lack)."""

    @staticmethod
    def toDict(value: Any) -> dict[Any, Any]:  # TensorFlowOnSpark's name
        if isinstance(value, dict):
            return value
        msg = f"Could not convert {value!r} to a dict"
        raise TypeError(msg)


# -- TensorFlowOnSpark's Param mixins: setX/getX as there; Param names are Spark ML's camelCase ---------------
class HasBatchSize(Params):
    """TensorFlowOnSpark's Param mixin: the ``BatchSize`` Param (``setBatchSize``/``getBatchSize``)."""
    batchSize = _param("batchSize", "rows per batch (training feed / inference)", TypeConverters.toInt)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(batchSize=100)

    if TYPE_CHECKING:  # added by _accessors() below
        def getBatchSize(self) -> int: ...
        def setBatchSize(self, value: Any) -> Self: ...


class HasClusterSize(Params):
    """TensorFlowOnSpark's Param mixin: the ``ClusterSize`` Param (``setClusterSize``/``getClusterSize``)."""
    clusterSize = _param("clusterSize", "number of TensorFlow nodes", TypeConverters.toInt)

    if TYPE_CHECKING:  # added by _accessors() below
        def getClusterSize(self) -> int: ...
        def setClusterSize(self, value: Any) -> Self: ...


class HasEpochs(Params):
    """TensorFlowOnSpark's Param mixin: the ``Epochs`` Param (``setEpochs``/``getEpochs``)."""
    epochs = _param("epochs", "passes over the DataFrame (InputMode.SPARK)", TypeConverters.toInt)

    if TYPE_CHECKING:  # added by _accessors() below
        def getEpochs(self) -> int: ...
        def setEpochs(self, value: Any) -> Self: ...


class HasGraceSecs(Params):
    """TensorFlowOnSpark's Param mixin: the ``GraceSecs`` Param (``setGraceSecs``/``getGraceSecs``)."""
    graceSecs = _param("graceSecs", "seconds to wait after the nodes finish before teardown", TypeConverters.toFloat)

    if TYPE_CHECKING:  # added by _accessors() below
        def getGraceSecs(self) -> float: ...
        def setGraceSecs(self, value: Any) -> Self: ...


class HasInputMapping(Params):
    """TensorFlowOnSpark's Param mixin: the ``InputMapping`` Param (``setInputMapping``/``getInputMapping``)."""
    inputMapping = _param(
        "inputMapping", "DataFrame column -> input tensor name, signature alias or feature name", _to_mapping
    )

    if TYPE_CHECKING:  # added by _accessors() below
        def getInputMapping(self) -> dict[str, str]: ...
        def setInputMapping(self, value: Any) -> Self: ...


class HasInputMode(Params):
    """TensorFlowOnSpark's Param mixin: the ``InputMode`` Param (``setInputMode``/``getInputMode``)."""
    inputMode = _param("inputMode", "InputMode.SPARK (feed the DataFrame) or InputMode.TENSORFLOW", _to_input_mode)

    if TYPE_CHECKING:  # added by _accessors() below
        def getInputMode(self) -> int: ...
        def setInputMode(self, value: Any) -> Self: ...


class HasMasterNode(Params):
    """TensorFlowOnSpark's Param mixin: the ``MasterNode`` Param (``setMasterNode``/``getMasterNode``)."""
    masterNode = _param("masterNode", "role name of the first trainer ('chief'), or None", _to_opt_str)

    if TYPE_CHECKING:  # added by _accessors() below
        def getMasterNode(self) -> str | None: ...
        def setMasterNode(self, value: Any) -> Self: ...


class HasModelDir(Params):
    """TensorFlowOnSpark's Param mixin: the ``ModelDir`` Param (``setModelDir``/``getModelDir``)."""
    modelDir = _param("modelDir", "directory of the training checkpoints", TypeConverters.toString)

    if TYPE_CHECKING:  # added by _accessors() below
        def getModelDir(self) -> str: ...
        def setModelDir(self, value: Any) -> Self: ...


class HasNumPS(Params):
    """TensorFlowOnSpark's Param mixin: the ``NumPS`` and ``DriverPSNodes`` Params (``setX``/``getX`` for each)."""
    numPS = _param("numPS", "number of parameter servers among the nodes", TypeConverters.toInt)
    driverPSNodes = _param("driverPSNodes", "run the parameter servers on the driver", TypeConverters.toBoolean)

    if TYPE_CHECKING:  # added by _accessors() below
        def getNumPS(self) -> int: ...
        def setNumPS(self, value: Any) -> Self: ...
        def getDriverPSNodes(self) -> bool: ...
        def setDriverPSNodes(self, value: Any) -> Self: ...


class HasOutputMapping(Params):
    """TensorFlowOnSpark's Param mixin: the ``OutputMapping`` Param (``setOutputMapping``/``getOutputMapping``)."""
    outputMapping = _param("outputMapping", "output tensor name / signature alias -> output column", _to_mapping)

    if TYPE_CHECKING:  # added by _accessors() below
        def getOutputMapping(self) -> dict[str, str]: ...
        def setOutputMapping(self, value: Any) -> Self: ...


class HasProtocol(Params):
    """TensorFlowOnSpark's Param mixin: the ``Protocol`` Param (``setProtocol``/``getProtocol``)."""
    protocol = _param("protocol", "collective implementation: grpc (AUTO), ring or nccl; TF2 has no RDMA verbs",
                      _to_protocol)

    if TYPE_CHECKING:  # added by _accessors() below
        def getProtocol(self) -> str: ...
        def setProtocol(self, value: Any) -> Self: ...


class HasReaders(Params):
    """TensorFlowOnSpark's Param mixin: the ``Readers`` Param (``setReaders``/``getReaders``)."""
    readers = _param("readers", "number of reader threads (passed to train_fn as args.readers)",
                     TypeConverters.toInt)

    if TYPE_CHECKING:  # added by _accessors() below
        def getReaders(self) -> int: ...
        def setReaders(self, value: Any) -> Self: ...


class HasSteps(Params):
    """TensorFlowOnSpark's Param mixin: the ``Steps`` Param (``setSteps``/``getSteps``)."""
    steps = _param("steps", "maximum training steps (passed to train_fn as args.steps)", TypeConverters.toInt)

    if TYPE_CHECKING:  # added by _accessors() below
        def getSteps(self) -> int: ...
        def setSteps(self, value: Any) -> Self: ...


class HasTensorboard(Params):
    """TensorFlowOnSpark's Param mixin: the ``Tensorboard`` Param (``setTensorboard``/``getTensorboard``)."""
    tensorboard = _param("tensorboard", "start TensorBoard on the chief", TypeConverters.toBoolean)

    if TYPE_CHECKING:  # added by _accessors() below
        def getTensorboard(self) -> bool: ...
        def setTensorboard(self, value: Any) -> Self: ...


class HasTFRecordDir(Params):
    """TensorFlowOnSpark's Param mixin: the ``TFRecordDir`` Param (``setTFRecordDir``/``getTFRecordDir``)."""
    tfrecordDir = _param("tfrecordDir", "InputMode.TENSORFLOW: write the DataFrame's InputMapping columns here as "
                         "TFRecords before training (args.tfrecord_dir)", _to_opt_str)

    if TYPE_CHECKING:  # added by _accessors() below
        def getTFRecordDir(self) -> str | None: ...
        def setTFRecordDir(self, value: Any) -> Self: ...


class HasExportDir(Params):
    """TensorFlowOnSpark's Param mixin: the ``ExportDir`` Param (``setExportDir``/``getExportDir``)."""
    exportDir = _param("exportDir", "directory of the exported SavedModel", TypeConverters.toString)

    if TYPE_CHECKING:  # added by _accessors() below
        def getExportDir(self) -> str: ...
        def setExportDir(self, value: Any) -> Self: ...


class HasSignatureDefKey(Params):
    """TensorFlowOnSpark's Param mixin: the ``SignatureDefKey`` Param (``setSignatureDefKey``/``getSignatureDefKey``)."""
    signatureDefKey = _param(
        "signatureDefKey", "signature of the SavedModel to run; None runs the SavedModel's graph by tensor names",
        _to_opt_str)

    if TYPE_CHECKING:  # added by _accessors() below
        def getSignatureDefKey(self) -> str | None: ...
        def setSignatureDefKey(self, value: Any) -> Self: ...


class HasTagSet(Params):
    """TensorFlowOnSpark's Param mixin: the ``TagSet`` Param (``setTagSet``/``getTagSet``)."""
    tagSet = _param("tagSet", "comma-separated tags of the SavedModel's MetaGraph", TypeConverters.toString)

    if TYPE_CHECKING:  # added by _accessors() below
        def getTagSet(self) -> str: ...
        def setTagSet(self, value: Any) -> Self: ...


for _cls, _names in (
    (HasBatchSize, ("batchSize",)), (HasClusterSize, ("clusterSize",)), (HasEpochs, ("epochs",)),
    (HasGraceSecs, ("graceSecs",)), (HasInputMapping, ("inputMapping",)), (HasInputMode, ("inputMode",)),
    (HasMasterNode, ("masterNode",)), (HasModelDir, ("modelDir",)),
    (HasNumPS, (("numPS", "NumPS"), ("driverPSNodes", "DriverPSNodes"))), (HasOutputMapping, ("outputMapping",)),
    (HasProtocol, ("protocol",)), (HasReaders, ("readers",)), (HasSteps, ("steps",)),
    (HasTensorboard, ("tensorboard",)), (HasTFRecordDir, (("tfrecordDir", "TFRecordDir"),)),
    (HasExportDir, ("exportDir",)), (HasSignatureDefKey, ("signatureDefKey",)), (HasTagSet, ("tagSet",)),
):
    _accessors(_cls, *_names)

#: Param → the key it has in the function's ``args`` (TensorFlowOnSpark's names)
ARG_NAMES = {
    "batchSize": "batch_size", "clusterSize": "cluster_size", "driverPSNodes": "driver_ps_nodes",
    "epochs": "epochs", "exportDir": "export_dir", "graceSecs": "grace_secs", "inputMapping": "input_mapping",
    "inputMode": "input_mode", "masterNode": "master_node", "modelDir": "model_dir", "numPS": "num_ps",
    "outputMapping": "output_mapping", "protocol": "protocol", "readers": "readers",
    "signatureDefKey": "signature_def_key", "steps": "steps", "tagSet": "tag_set", "tensorboard": "tensorboard",
    "tfrecordDir": "tfrecord_dir",
}


#: tfos_nb's own Params (TensorFlowOnSpark has none of them): in ``args`` only when set, so that ``args`` has
#: TensorFlowOnSpark's keys for a program that does not use them
OWN_PARAMS = frozenset({"validation", "validationMetrics", "retries"})


def arg_name(param: str) -> str:
    """The ``args`` key of a Param: TensorFlowOnSpark's snake_case name."""
    return ARG_NAMES.get(param) or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", param).lower()


class TFParams(Params):
    """TensorFlowOnSpark's mix-in: ``args`` (the user's arguments) merged with the stage's Params."""

    args: Namespace | None = None

    def merge_args_params(self) -> Namespace:
        """A copy of ``args`` updated with every Param that is set or has a default, by its snake_case name.

        A Param wins over an ``args`` key of its name even when only defaulted (TensorFlowOnSpark's rule); one with
        neither value nor default (``ModelDir``, ``ExportDir``, ``InputMapping`` …) is ``None`` unless in ``args``.
        """
        merged = Namespace(self.args)
        for param in self.params:
            key = arg_name(param.name)
            if param.name in OWN_PARAMS and not self.isSet(param):
                continue  # tfos_nb's own, defaulted (Retries: 0): args keeps TensorFlowOnSpark's keys
            if self.isDefined(param):
                merged[key] = self.getOrDefault(param)
            elif key not in merged and param.name not in OWN_PARAMS:
                merged[key] = None  # TensorFlowOnSpark's default for an unset path or mapping
        return merged


class _HasCallables(Protocol):
    """A stage whose Python callables travel beside its Params (TFEstimator, TFModel)."""

    def _callables(self) -> dict[str, Any]: ...
    def _set_callables(self, fns: dict[str, Any]) -> None: ...


def _check_connect_ml(spark: Any) -> None:
    """Spark ML's own metadata reader/writer needs a SparkContext before pyspark 4.0: say so on Spark Connect."""
    import pyspark

    if is_connect(spark) and int(pyspark.__version__.split(".")[0]) < 4:
        msg = (f"saving or loading a TFEstimator/TFModel on Spark Connect needs pyspark >= 4.0 (this is "
               f"{pyspark.__version__}): pip install 'pyspark[connect]>=4.0', or use a classic session")
        raise RuntimeError(msg)


class _CallablesWriter(DefaultParamsWriter):
    """Params as Spark ML JSON metadata, plus the stage's Python callables, cloudpickled.

    The callables are one ``binary`` cell of a one-row parquet table in ``<path>/tfos_nb_fns``,
    written with the DataFrame API only, so that it works on a classic and on a Spark Connect
    session alike and ``path`` can be anywhere Spark writes (local, HDFS, S3, ``dbfs:/``,
    ``/Volumes/...``).  As with any Spark ML stage holding Python functions, loading it runs
    code: load only what you (or someone you trust) saved.
    """

    def save(self, path: str) -> None:
        _check_connect_ml(self.sparkSession)
        super().save(path)

    def _handleOverwrite(self, path: str) -> None:
        if is_connect(self.sparkSession):  # the classic one reaches the JVM through py4j
            from pyspark.ml.connect.readwrite import RemoteMLWriter

            RemoteMLWriter.handleOverwrite(path, True)
        else:
            super()._handleOverwrite(path)

    def saveImpl(self, path: str) -> None:
        super().saveImpl(path)
        import cloudpickle
        from pyspark.sql import types as T

        blob = cloudpickle.dumps(cast(_HasCallables, self.instance)._callables())
        schema = T.StructType([T.StructField("fns", T.BinaryType(), False)])
        frame = self.sparkSession.createDataFrame([(blob,)], schema)
        frame.coalesce(1).write.parquet(os.path.join(path, _FNS_TABLE))


class _CallablesReader(DefaultParamsReader[Any]):
    """Loads what :class:`_CallablesWriter` saved (and the ``saveAsPickleFile`` format before it, on classic)."""

    def load(self, path: str) -> Any:
        import cloudpickle
        from pyspark.errors import AnalysisException

        spark = self.sparkSession
        _check_connect_ml(spark)
        instance = super().load(path)
        try:
            rows = spark.read.parquet(os.path.join(path, _FNS_TABLE)).collect()
        except AnalysisException as exc:
            if "PATH_NOT_FOUND" not in str(exc):
                raise
            # no table: saved by tfos_nb before the parquet format
            old = os.path.join(path, _FNS_DIR)
            if is_connect(spark):
                msg = (f"{path} has no {_FNS_TABLE} table: it was saved by an older tfos_nb (as a pickle file, "
                       "which needs a SparkContext); load it once on a classic session and save it again")
                raise ValueError(msg) from None
            blobs = spark.sparkContext.pickleFile(old).collect()
            if blobs:
                instance._set_callables(cloudpickle.loads(blobs[0]))
            return instance
        if rows:
            instance._set_callables(cloudpickle.loads(bytes(rows[0][0])))
        return instance
