"""TFEstimator: train on a DataFrame with a tfos_nb cluster, as a Spark ML ``Estimator``."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from pyspark.ml import Estimator
from pyspark.ml.param import TypeConverters
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from ._model import TFModel
from ._params import (
    HasBatchSize,
    HasExportDir,
    HasInputMapping,
    HasModelDir,
    _accessors,
    _CallablesReader,
    _CallablesWriter,
    _param,
    _to_opt_str,
)

log = logging.getLogger(__name__)

_PROTOCOLS = ("grpc", "ring", "nccl")
_MODES = {"SPARK": 1, "TENSORFLOW": 0}


def _to_protocol(value: Any) -> str:
    value = TypeConverters.toString(value).lower()
    if value not in _PROTOCOLS:
        msg = (f"Protocol must be one of {list(_PROTOCOLS)}, got {value!r} (TensorFlow 2 has no RDMA verbs "
               "transport: 'grpc+verbs' and 'grpc+gdr' are gone)")
        raise ValueError(msg)
    return value


def _to_input_mode(value: Any) -> int:
    if isinstance(value, str) and value.upper() in _MODES:
        return _MODES[value.upper()]
    if value in (0, 1) and not isinstance(value, bool):
        return int(value)
    msg = f"InputMode must be InputMode.SPARK (1) or InputMode.TENSORFLOW (0), got {value!r}"
    raise ValueError(msg)


def communication_options(protocol: str) -> Any:
    """``tf.distribute.experimental.CommunicationOptions`` for ``args.protocol``.

    ``"grpc"`` lets TensorFlow pick (AUTO), ``"ring"`` is RING all-reduce over
    gRPC, ``"nccl"`` is NCCL on GPUs.  For a ``train_fn``:
    ``MultiWorkerMirroredStrategy(communication_options=communication_options(args.protocol))``.
    """
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    choice = {"grpc": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[_to_protocol(protocol)]
    return tf.distribute.experimental.CommunicationOptions(implementation=choice)


class _TrainThenExport:
    """The node function when ``export_fn`` is given: ``train_fn(args, ctx)``, then ``export_fn(args)`` on the chief.

    A module-level class, so cloudpickle ships it by reference and its two
    functions by value (or by reference) as they would travel alone.
    """

    def __init__(self, train_fn: Callable[[Any, Any], Any], export_fn: Callable[[Any], Any]) -> None:
        self.train_fn, self.export_fn = train_fn, export_fn

    def __call__(self, args: Any, ctx: Any) -> Any:
        result = self.train_fn(args, ctx)
        if ctx.is_chief:
            self.export_fn(args)
        return result


class TFArgs(dict):
    """``tf_args`` merged with the estimator's Params: read as ``args["epochs"]`` or ``args.epochs``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


_ARG_NAMES = {  # Param -> key in the train_fn's args (TensorFlowOnSpark's TFEstimator names)
    "batchSize": "batch_size", "clusterSize": "cluster_size", "epochs": "epochs", "exportDir": "export_dir",
    "graceSecs": "grace_secs", "inputMapping": "input_mapping", "inputMode": "input_mode",
    "masterNode": "master_node", "modelDir": "model_dir", "numPS": "num_ps", "protocol": "protocol",
    "readers": "readers", "steps": "steps", "tensorboard": "tensorboard",
}


class TFEstimator(Estimator, HasInputMapping, HasModelDir, HasExportDir, HasBatchSize, DefaultParamsReadable,
                  DefaultParamsWritable):
    """Train ``train_fn(args, ctx)`` on a tfos_nb cluster from a DataFrame; ``fit`` returns a :class:`TFModel`.

    ``fit(df)`` selects the ``InputMapping`` columns (in the mapping's order;
    vectors become arrays), starts ``ClusterSize`` nodes (``NumPS`` of them
    parameter servers, the first trainer named ``MasterNode``), feeds the
    columns ``Epochs`` times (``InputMode.SPARK``; with ``InputMode.TENSORFLOW``
    the nodes read their own data and the DataFrame is not fed), and shuts the
    cluster down, waiting ``GraceSecs`` after the nodes finish.  ``train_fn``
    gets ``tf_args`` (a dict or an ``argparse.Namespace``) merged with the Params
    as a :class:`TFArgs` (``args.batch_size``, ``epochs``, ``steps``, ``model_dir``,
    ``export_dir``, ``input_mapping``, ``cluster_size``, ``num_ps``, ``readers``,
    ``protocol``, ``tensorboard``, ...); a Param wins over a ``tf_args`` key of the
    same name even when only defaulted (``Steps`` is 1000 unless set), as in
    TensorFlowOnSpark.  ``export_fn(args)``, when given, runs
    after training on the chief (in its node process, once ``train_fn`` has
    returned there; TensorFlowOnSpark's semantics), e.g. to rebuild the model,
    restore the checkpoint in ``args.model_dir`` and write a SavedModel to
    ``args.export_dir``; its failure fails ``fit`` like any node error.
    The returned model gets ``ExportDir``/``ModelDir``/``InputMapping`` (mapping
    each column to the same name: name the model's inputs like the mapping's
    values) and ``model_fn`` for the checkpoint style.

    ``NumPS`` > 0 with a ``MasterNode`` runs ParameterServerStrategy: the chief
    is the coordinator and the workers only serve, so nothing reads a fed
    DataFrame; ``fit`` then needs ``InputMode.TENSORFLOW`` (``train_fn`` reads
    its data, e.g. in the coordinator's ``dataset_fn``).  ``Tensorboard=True``
    starts TensorBoard on the chief for the fit, on ``ModelDir`` when set (the
    chief's ``ctx.log_dir``: point a Keras ``TensorBoard`` callback there); its
    URL is the fit cluster's ``tensorboard_url`` (the notebook panel links it).

    ``Protocol`` picks the collective implementation (``grpc`` = AUTO,
    ``ring``, ``nccl``) that ``train_fn`` passes to its strategy, e.g. with
    :func:`communication_options`; TensorFlow 2 has no RDMA verbs transport.
    ``env`` adds environment variables to the nodes (e.g. thread counts).
    ``train_fn``, ``tf_args``, ``export_fn``, ``model_fn`` and ``env`` are
    cloudpickled into the save directory by ``save`` and restored by ``load``:
    functions from ``__main__`` or a notebook travel by value, functions from an
    importable module by reference (that module must be importable where it is loaded).
    """

    clusterSize = _param("clusterSize", "number of TensorFlow nodes", TypeConverters.toInt)
    numPS = _param("numPS", "number of parameter servers among them", TypeConverters.toInt)
    readers = _param("readers", "number of reader threads (passed to train_fn as args.readers)",
                     TypeConverters.toInt)
    tensorboard = _param("tensorboard", "start TensorBoard on the chief", TypeConverters.toBoolean)
    steps = _param("steps", "maximum training steps (passed to train_fn as args.steps)", TypeConverters.toInt)
    epochs = _param("epochs", "passes over the DataFrame (InputMode.SPARK)", TypeConverters.toInt)
    protocol = _param("protocol", "collective implementation: grpc (AUTO), ring or nccl; TF2 has no RDMA verbs",
                      _to_protocol)
    inputMode = _param("inputMode", "InputMode.SPARK (feed the DataFrame) or InputMode.TENSORFLOW", _to_input_mode)
    masterNode = _param("masterNode", "role name of the first trainer ('chief'), or None", _to_opt_str)
    graceSecs = _param("graceSecs", "seconds to wait after the nodes finish before teardown", TypeConverters.toFloat)

    def __init__(self, train_fn: Callable[[Any, Any], Any] | None = None, tf_args: Any = None,
                 export_fn: Callable[[Any], Any] | None = None, *, model_fn: Callable[[], Any] | None = None,
                 env: dict[str, str] | None = None, **params: Any) -> None:
        super().__init__()
        self._setDefault(clusterSize=1, numPS=0, readers=1, tensorboard=False, steps=1000, epochs=1,
                         protocol="grpc", inputMode=1, masterNode="chief", graceSecs=0.0)
        self.train_fn, self.tf_args, self.export_fn = train_fn, tf_args, export_fn
        self.model_fn, self.env = model_fn, env
        if params:
            self._set(**params)

    def _callables(self) -> dict[str, Any]:
        return {"train_fn": self.train_fn, "tf_args": self.tf_args, "export_fn": self.export_fn,
                "model_fn": self.model_fn, "env": self.env}

    def _set_callables(self, fns: dict[str, Any]) -> None:
        for k in ("train_fn", "tf_args", "export_fn", "model_fn", "env"):
            setattr(self, k, fns.get(k))

    def write(self) -> Any:
        return _CallablesWriter(self)

    @classmethod
    def read(cls) -> Any:
        return _CallablesReader(cls)

    def merged_args(self) -> TFArgs:
        """The ``args`` that ``train_fn`` receives: ``tf_args`` updated with the Params that are set or defaulted."""
        base = self.tf_args
        if base is None:
            args = TFArgs()
        elif isinstance(base, argparse.Namespace):
            args = TFArgs(vars(base))
        elif isinstance(base, dict):
            args = TFArgs(base)
        else:
            msg = f"tf_args must be a dict or an argparse.Namespace, got {type(base).__name__}"
            raise TypeError(msg)
        for pname, key in _ARG_NAMES.items():
            param = getattr(self, pname)
            if self.isDefined(param):
                args[key] = self.getOrDefault(param)
        return args

    def _fit(self, dataset: Any) -> TFModel:
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import functions as F

        from .. import TFCluster as tfc  # run() and InputMode, as users see them

        if self.train_fn is None:
            msg = "TFEstimator needs train_fn(args, ctx) (TFEstimator(train_fn, tf_args))"
            raise ValueError(msg)
        args = self.merged_args()
        mode = self.getOrDefault(self.inputMode)
        num_ps, master = self.getOrDefault(self.numPS), self.getOrDefault(self.masterNode)
        if mode == tfc.InputMode.SPARK and num_ps > 0 and master:
            msg = (f"TFEstimator with NumPS={num_ps} and MasterNode={master!r} runs ParameterServerStrategy: the "
                   f"{master} coordinates and the workers only serve, so no node would read the DataFrame; use "
                   "setInputMode('TENSORFLOW') and read the data in train_fn (e.g. the coordinator's dataset_fn)")
            raise ValueError(msg)
        source = None
        if mode == tfc.InputMode.SPARK:
            if not self.isDefined(self.inputMapping):
                msg = f"TFEstimator with InputMode.SPARK needs InputMapping; DataFrame columns: {dataset.columns}"
                raise ValueError(msg)
            fields = {f.name: f.dataType for f in dataset.schema.fields}
            cols = []
            for col in self.getInputMapping():
                if col not in fields:
                    msg = f"InputMapping column {col!r} is not in the DataFrame; its columns: {list(fields)}"
                    raise ValueError(msg)
                c = F.col(col)
                cols.append(vector_to_array(c, "float32").alias(col) if isinstance(fields[col], VectorUDT) else c)
            source = dataset.select(*cols)
        sc = dataset.sparkSession.sparkContext
        node_fn = self.train_fn if self.export_fn is None else _TrainThenExport(self.train_fn, self.export_fn)
        cluster = tfc.run(sc, node_fn, args, self.getOrDefault(self.clusterSize),
                          num_ps=num_ps, tensorboard=self.getOrDefault(self.tensorboard),
                          input_mode=mode, master_node=master, env=self.env,
                          log_dir=args.get("model_dir"), name=f"{self.uid}.fit")
        try:
            if source is not None:
                cluster.train(source, num_epochs=self.getOrDefault(self.epochs), batch_rows=self.getBatchSize())
        except BaseException:
            cluster._teardown()
            raise
        cluster.shutdown(grace_secs=self.getOrDefault(self.graceSecs))
        return self._model_for(args)

    def _model_for(self, args: TFArgs) -> TFModel:
        """The fitted model; its InputMapping keeps the entries that name an input of the model (not the label)."""
        model = TFModel(model_fn=self.model_fn)
        for pname in ("exportDir", "modelDir", "inputMapping", "batchSize"):
            param = getattr(self, pname)
            if self.isDefined(param):
                model._set(**{pname: self.getOrDefault(param)})
        if self.isDefined(self.inputMapping):
            try:
                inputs = model._describe(model._ref())[0]
            except Exception as exc:  # noqa: BLE001 - no model to inspect (yet): keep the mapping as it is
                log.info("tfos_nb: could not inspect the fitted model (%s); InputMapping copied as is", exc)
            else:
                kept = {c: t for c, t in self.getInputMapping().items() if t in inputs}
                if kept:
                    model._set(inputMapping=kept)
        return model

_accessors(TFEstimator, "clusterSize", "numPS", "readers", "tensorboard", "steps", "epochs", "protocol",
           "inputMode", "masterNode", "graceSecs")
