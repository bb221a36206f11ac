"""TFEstimator: train on a DataFrame with a tfos_nb cluster, as a Spark ML ``Estimator``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pyspark.ml import Estimator
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from ..runtime.args import Namespace
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
    HasProtocol,
    HasReaders,
    HasSteps,
    HasTensorboard,
    HasTFRecordDir,
    TFParams,
    _CallablesReader,
    _CallablesWriter,
    _to_protocol,
)
from ._retries import HasRetries
from ._validation import HasValidation, last_values, split

log = logging.getLogger(__name__)

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


class TFEstimator(Estimator["TFModel"], TFParams, HasInputMapping, HasClusterSize, HasNumPS, HasInputMode, HasMasterNode,
                  HasProtocol, HasGraceSecs, HasTensorboard, HasModelDir, HasExportDir, HasTFRecordDir, HasBatchSize,
                  HasEpochs, HasReaders, HasSteps, HasValidation, HasRetries, DefaultParamsReadable["TFEstimator"],
                  DefaultParamsWritable):
    """Train ``train_fn(args, ctx)`` on a tfos_nb cluster from a DataFrame; ``fit`` returns a :class:`TFModel`.

    ``fit(df)`` selects the ``InputMapping`` columns (in the mapping's order;
    vectors become arrays), starts ``ClusterSize`` nodes (``NumPS`` of them
    parameter servers, the first trainer named ``MasterNode``), feeds the
    columns ``Epochs`` times (``InputMode.SPARK``; with ``InputMode.TENSORFLOW``
    the nodes read their own data and the DataFrame is not fed), and shuts the
    cluster down, waiting ``GraceSecs`` after the nodes finish.  ``train_fn``
    gets ``tf_args`` (a dict, an ``argparse.Namespace`` or None) merged with the
    Params as a :class:`~tfos_nb.pipeline.Namespace` (``args.batch_size`` or
    ``args["batch_size"]``, ``vars(args)``; ``epochs``, ``steps``, ``model_dir``,
    ``export_dir``, ``input_mapping``, ``cluster_size``, ``num_ps``, ``readers``,
    ``protocol``, ``tensorboard``, ...); a Param wins over a ``tf_args`` key of the
    same name even when only defaulted (``Steps`` is 1000 unless set), as in
    TensorFlowOnSpark.  An argv list as ``tf_args`` reaches ``train_fn`` as that
    list (and ``sys.argv``), for the program's own argparse, as in TensorFlowOnSpark.
    ``DriverPSNodes`` runs the parameter servers on the driver.  With
    ``InputMode.TENSORFLOW`` and ``TFRecordDir``, ``fit`` first writes the
    DataFrame's ``InputMapping`` columns there as TFRecords (a DataFrame from
    ``dfutil.loadTFRecords`` is not rewritten: its directory is used) and
    ``train_fn`` finds the directory in ``args.tfrecord_dir``.  ``export_fn(args)``, when given, runs
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
    ``env`` adds environment variables to the nodes (e.g. thread counts).  ``Retries`` (tfos_nb's own Param,
    0 by default) starts the cluster again after a node failure, resuming from the last backup
    ``ctx.progress_callback()`` keeps, as ``run_job(retries=…)`` does.
    ``mlflow`` tracks each ``fit`` as one MLflow run (``True``, an experiment name or a dict, as
    ``TFCluster.run(mlflow=…)``); ``None`` (the default) only inside an active MLflow run
    (``with mlflow.start_run(): est.fit(df)``), ``False`` never; ``ExportDir``'s SavedModel is the
    run's model.  ``train_fn``, ``tf_args``, ``export_fn``, ``model_fn`` and ``env`` are
    cloudpickled into the save directory by ``save`` and restored by ``load``:
    functions from ``__main__`` or a notebook travel by value, functions from an
    importable module by reference (that module must be importable where it is loaded).
    """

    def __init__(self, train_fn: Callable[[Any, Any], Any] | None = None, tf_args: Any = None,
                 export_fn: Callable[[Any], Any] | None = None, *, model_fn: Callable[[], Any] | None = None,
                 env: dict[str, str] | None = None, mlflow: Any = None, **params: Any) -> None:
        super().__init__()
        self._setDefault(clusterSize=1, numPS=0, driverPSNodes=False, readers=1, tensorboard=False, steps=1000,
                         epochs=1, protocol="grpc", inputMode=1, masterNode="chief", graceSecs=0.0, retries=0)
        self.args = Namespace(tf_args)  # TypeError for anything but a dict, a namespace or an argv list
        self.train_fn, self.tf_args, self.export_fn = train_fn, tf_args, export_fn
        self.model_fn, self.env, self.mlflow = model_fn, env, mlflow
        if params:
            self._set(**params)

    def _callables(self) -> dict[str, Any]:
        return {"train_fn": self.train_fn, "tf_args": self.tf_args, "export_fn": self.export_fn,
                "model_fn": self.model_fn, "env": self.env}

    def _set_callables(self, fns: dict[str, Any]) -> None:
        for k in ("train_fn", "tf_args", "export_fn", "model_fn", "env"):
            setattr(self, k, fns.get(k))
        self.args = Namespace(self.tf_args)

    def write(self) -> Any:
        return _CallablesWriter(self)

    @classmethod
    def read(cls) -> Any:
        return _CallablesReader(cls)

    def merged_args(self) -> Namespace:
        """The ``args`` that ``train_fn`` receives: ``tf_args`` updated with the Params that are set or defaulted.

        (``merge_args_params()``, TensorFlowOnSpark's name.)  With an argv list as ``tf_args``
        ``train_fn`` gets that list instead (TensorFlowOnSpark's rule: the program parses it).
        """
        return self.merge_args_params()

    def _fit(self, dataset: Any) -> TFModel:
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import functions as F

        from .. import TFCluster  # run_job() and InputMode, as users see them

        if self.train_fn is None:
            msg = "TFEstimator needs train_fn(args, ctx) (TFEstimator(train_fn, tf_args))"
            raise ValueError(msg)
        args = self.merged_args()
        tf_args: Any = args.argv if args.argv is not None else args  # an argv list goes to train_fn as it was
        mode = self.getOrDefault(self.inputMode)
        num_ps, master = self.getOrDefault(self.numPS), self.getOrDefault(self.masterNode)
        if mode == TFCluster.InputMode.SPARK and num_ps > 0 and master:
            msg = (f"TFEstimator with NumPS={num_ps} and MasterNode={master!r} runs ParameterServerStrategy: the "
                   f"{master} coordinates and the workers only serve, so no node would read the DataFrame; use "
                   "setInputMode('TENSORFLOW') and read the data in train_fn (e.g. the coordinator's dataset_fn)")
            raise ValueError(msg)
        source = val_source = None
        validation = self.getOrDefault(self.validation) if self.isDefined(self.validation) else None
        if validation is not None and mode != TFCluster.InputMode.SPARK:
            msg = ("TFEstimator's Validation rows are fed (InputMode.SPARK); with InputMode.TENSORFLOW train_fn "
                   "reads its own validation data")
            raise ValueError(msg)
        if mode == TFCluster.InputMode.SPARK:
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
            if validation is not None:  # fed once as the named set "validation" (see _validation.py)
                train_rows, val_rows = split(dataset, validation)
                source, val_source = train_rows.select(*cols), val_rows.select(*cols)
            else:
                source = dataset.select(*cols)
        elif self.isDefined(self.tfrecordDir) and self.getOrDefault(self.tfrecordDir) and tf_args is args:
            args.tfrecord_dir = self._export_tfrecords(dataset)
        sc = dataset.sparkSession  # classic or Spark Connect: run() takes either
        node_fn = self.train_fn if self.export_fn is None else _TrainThenExport(self.train_fn, self.export_fn)
        # start → train → shutdown, started again on a node failure up to Retries times (from the last backup)
        outcome = TFCluster.run_job(sc, node_fn, tf_args, self.getOrDefault(self.clusterSize),
                    retries=self.getOrDefault(self.retries),
                    data=source, validation=val_source, num_epochs=self.getOrDefault(self.epochs),
                    batch_rows=self.getBatchSize(),
                    grace_secs=self.getOrDefault(self.graceSecs),
                    num_ps=num_ps, tensorboard=self.getOrDefault(self.tensorboard),
                    input_mode=mode, master_node=master, env=self.env,
                    driver_ps_nodes=self.getOrDefault(self.driverPSNodes),
                    log_dir=args.get("model_dir"), name=f"{self.uid}.fit", mlflow=self.mlflow)
        model = self._model_for(args, dataset)
        values = last_values(outcome.status) if val_source is not None else {}
        if values:
            model._set(validationMetrics=values)
        return model

    def _export_tfrecords(self, dataset: Any) -> str:
        """InputMode.TENSORFLOW with TFRecordDir: where ``train_fn`` reads the DataFrame (``args.tfrecord_dir``)."""
        from .. import dfutil

        if dfutil.isLoadedDF(dataset):
            return dfutil.loadedDF[dataset]  # read from TFRecords already: point at them
        target: str = self.getOrDefault(self.tfrecordDir)
        cols = list(self.getInputMapping()) if self.isDefined(self.inputMapping) else dataset.columns
        missing = [c for c in cols if c not in dataset.columns]
        if missing:
            msg = f"InputMapping columns {missing} are not in the DataFrame; its columns: {dataset.columns}"
            raise ValueError(msg)
        dfutil.saveAsTFRecords(dataset.select(*cols), target)
        return target

    def _model_for(self, args: Namespace, dataset: Any) -> TFModel:
        """The fitted model; its InputMapping keeps the entries that name an input of the model (not the label)."""
        model = TFModel(model_fn=self.model_fn)
        for pname in ("exportDir", "modelDir", "inputMapping", "batchSize"):
            param = getattr(self, pname)
            if self.isDefined(param):
                model._set(**{pname: self.getOrDefault(param)})
        if self.isDefined(self.inputMapping):
            try:
                inputs = model._describe(model._ref(), dataset)[0]
            except Exception as exc:  # noqa: BLE001 - no model to inspect (yet): keep the mapping as it is
                log.info("tfos_nb: could not inspect the fitted model (%s); InputMapping copied as is", exc)
            else:
                kept = {c: t for c, t in self.getInputMapping().items() if t in inputs}
                if kept:
                    model._set(inputMapping=kept)
        return model

