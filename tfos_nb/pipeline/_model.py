"""TFModel: batch inference over Arrow (a scalar Arrow UDF) with a SavedModel or a checkpoint, as a Spark ML Model."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from pyspark.ml import Model
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from ..runtime.args import Namespace
from . import _model_runners as model_runners
from ._arrow import spark_type, to_arrow, to_numpy
from ._params import (
    HasBatchSize,
    HasExportDir,
    HasInputMapping,
    HasModelDir,
    HasOutputMapping,
    HasSignatureDefKey,
    HasTagSet,
    TFParams,
    _CallablesReader,
    _CallablesWriter,
)
from ._validation import HasValidationMetrics


class _Scorer:
    """The Arrow UDF's body: model loaded once per Python worker, slices of ``batch_size`` rows."""

    def __init__(self, ref: model_runners.ModelRef, feeds: list[tuple[str, model_runners.TensorInfo]],
                 fetches: list[tuple[str, model_runners.TensorInfo]], batch_size: int) -> None:
        self.ref, self.feeds, self.fetches, self.batch_size = ref, feeds, fetches, batch_size

    def __call__(self, *cols: Any) -> Any:
        import numpy as np
        import pyarrow as pa

        n = len(cols[0])
        if n == 0:
            outs = [to_arrow(np.zeros((0, *[max(d, 0) for d in t.shape[1:]]), dtype=_empty_dtype(t)), 0)
                    for _, t in self.fetches]
        else:
            run = model_runners.runner(self.ref, [t.name for _, t in self.feeds], [t.name for _, t in self.fetches])
            tensors = {t.name: to_numpy(c, t, col) for c, (col, t) in zip(cols, self.feeds)}
            parts = [run({k: v[i:i + self.batch_size] for k, v in tensors.items()}) for i in range(0, n, self.batch_size)]
            outs = []
            for _, t in self.fetches:
                vals = parts[0][t.name] if len(parts) == 1 else np.concatenate([p[t.name] for p in parts])
                outs.append(to_arrow(vals, n))
        if len(outs) == 1:  # one output: its own column, no struct to take apart on the JVM's side
            return outs[0]
        return pa.StructArray.from_arrays(outs, names=[f"o{i}" for i in range(len(outs))])


def _empty_dtype(t: model_runners.TensorInfo) -> str:
    return "object" if t.dtype == "string" else t.dtype


class TFModel(Model, TFParams, HasInputMapping, HasOutputMapping, HasBatchSize, HasModelDir, HasExportDir,
              HasSignatureDefKey, HasTagSet, HasValidationMetrics, DefaultParamsReadable["TFModel"],
              DefaultParamsWritable):
    """Batch inference with a TensorFlow model as a Spark ML ``Model``.

    ``transform(df)`` adds one column per ``OutputMapping`` entry, keeping every
    input column (Spark ML's convention; TensorFlowOnSpark returned only the
    outputs: ``select`` them).  ``TFModel(tf_args)`` takes TensorFlowOnSpark's
    ``tf_args`` (a dict, an ``argparse.Namespace`` or an argv list; kept as
    ``args``, merged with the Params by ``merge_args_params()``); ``TFModel(model_fn)``
    or ``model_fn=`` gives the checkpoint style's model builder; anything else is a
    ``TypeError``.  Which model runs (see the package docs):

    * ``ExportDir`` and ``SignatureDefKey`` (default ``"serving_default"``): the
      SavedModel's signature; mappings use its input/output aliases.  Without
      ``OutputMapping`` every signature output becomes a column of its alias.
    * ``ExportDir`` and ``SignatureDefKey=None``: the SavedModel in a
      ``tf.compat.v1`` graph/session; mappings use tensor names
      (``{"features": "serving_default_features:0"}``); ``OutputMapping`` is required.
    * ``ModelDir`` only: ``model_fn()`` (a callable returning the Keras model,
      given to the constructor or :meth:`setModelFn`) rebuilds the model and the
      latest checkpoint there restores it (``tf.train.Checkpoint(model=model)``
      or ``model.save_weights`` layouts); mappings use the model's input/output names.
    * ``ExportDir`` naming a ``.keras`` file (Keras 3's ``model.save("model.keras")``):
      the file loaded with ``keras.models.load_model``; mappings use the model's
      input names (its ``keras.Input(name=...)``) and output names (a functional
      model's output names, or the last layer's name for one output).

    Array columns and ``VectorUDT`` columns feed tensors (vectors go through
    ``vector_to_array``; a flat array feeds a tensor of higher rank, e.g.
    ``[-1, 4, 4, 1]``, reshaped row by row as TensorFlowOnSpark does); output columns are typed from the model: a scalar per
    row for a ``(batch,)`` output, nested arrays beyond.  Mistakes in the
    mappings raise ``ValueError`` on the driver before any Spark job.
    Inference is a scalar Arrow UDF (``arrow_udf``; a pandas UDF before pyspark 4.1) over the mapped columns
    returning one struct, expanded into the output columns, so Spark prunes
    what is not selected; each Arrow batch is cut into ``BatchSize`` slices.
    The model is loaded once per Python worker (a module-level cache keyed by
    path, tags, signature and ``model_fn``) and reused across batches,
    partitions and ``transform`` calls.
    """

    def __init__(self, tf_args: Any = None, *, model_fn: Callable[[], Any] | None = None, **params: Any) -> None:
        super().__init__()
        if callable(tf_args) and not isinstance(tf_args, type):
            if model_fn is not None:
                msg = "TFModel(model_fn, model_fn=...): give the model builder once"
                raise TypeError(msg)
            tf_args, model_fn = None, tf_args  # TFModel(model_fn)
        if model_fn is not None and not callable(model_fn):
            msg = f"TFModel model_fn must be a function returning a Keras model, got {type(model_fn).__name__}"
            raise TypeError(msg)
        try:
            self.args = Namespace(tf_args)
        except TypeError:
            msg = (f"TFModel(tf_args) takes a dict, an argparse.Namespace or an argv list (or model_fn, a function), "
                   f"got {type(tf_args).__name__}: {tf_args!r:.80}")
            raise TypeError(msg) from None
        self.tf_args = tf_args
        self._setDefault(signatureDefKey="serving_default", tagSet="serve")
        self._model_fn = model_fn
        self._described: dict[tuple[Any, ...], Any] = {}
        if params:
            self._set(**params)

    # -- callables (persisted next to the Params) ---------------------------------------------
    def setModelFn(self, model_fn: Callable[[], Any] | None) -> TFModel:  # noqa: N802 - Spark ML accessor style
        """The checkpoint style's model builder: ``model_fn()`` returns an (uncompiled) Keras model."""
        self._model_fn = model_fn
        return self

    def getModelFn(self) -> Callable[[], Any] | None:  # noqa: N802 - Spark ML accessor style
        return self._model_fn

    def _callables(self) -> dict[str, Any]:
        return {"model_fn": self._model_fn, "tf_args": self.tf_args}

    def _set_callables(self, fns: dict[str, Any]) -> None:
        self._model_fn = fns.get("model_fn")
        self.tf_args = fns.get("tf_args")
        self.args = Namespace(self.tf_args)

    def write(self) -> Any:
        return _CallablesWriter(self)

    @classmethod
    def read(cls) -> Any:
        return _CallablesReader(cls)

    # -- which model --------------------------------------------------------------------------
    def _ref(self) -> model_runners.ModelRef:
        tags = tuple(t.strip() for t in self.getTagSet().split(",") if t.strip())
        if self.isDefined(self.exportDir):
            if self.getExportDir().rstrip("/").endswith(".keras"):  # a Keras 3 model file
                return model_runners.ModelRef(model_runners.KERAS, self.getExportDir(), tags, None)
            sig = self.getSignatureDefKey()
            return model_runners.ModelRef(model_runners.SIGNATURE if sig else model_runners.TENSORS, self.getExportDir(), tags, sig)
        if self.isDefined(self.modelDir):
            if self._model_fn is None:
                msg = ("TFModel with ModelDir but no ExportDir runs the latest checkpoint and needs model_fn "
                       "(TFModel(model_fn=...) or setModelFn) to rebuild the model; or set ExportDir to a SavedModel")
                raise ValueError(msg)
            import cloudpickle

            return model_runners.ModelRef(model_runners.CHECKPOINT, self.getModelDir(), tags, None, cloudpickle.dumps(self._model_fn))
        msg = "TFModel needs ExportDir (a SavedModel) or ModelDir (checkpoints + model_fn)"
        raise ValueError(msg)

    def _describe(self, ref: model_runners.ModelRef, dataset: Any) -> Any:
        key = ref.key()
        if key not in self._described:
            if ref.style == model_runners.KERAS or (
                    ref.style == model_runners.CHECKPOINT and model_runners.keras_is_not_the_nodes()):
                # Loaded where the rows will be scored, in a Python worker: a .keras file needs Keras 3 and
                # TensorFlow, whose start-up lines would land in the notebook; and a notebook whose tf.keras is
                # Keras 3 for good rebuilds a checkpoint's model with the nodes' tf_keras there.
                self._described[key] = _describe_in_a_worker(dataset.sparkSession, ref)
            else:
                self._described[key] = model_runners.describe(ref)
        return self._described[key]

    # -- transform ------------------------------------------------------------------------------
    def _plan(self, dataset: Any) -> tuple[list[Any], _Scorer, Any, list[Any]]:
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        ref = self._ref()
        ins, outs = self._describe(ref, dataset)
        what = {model_runners.SIGNATURE: f"signature {ref.signature!r} input aliases", model_runners.CHECKPOINT: "model inputs",
                model_runners.KERAS: "model inputs", model_runners.TENSORS: "placeholders"}[ref.style]
        if not self.isDefined(self.inputMapping):
            msg = f"TFModel needs InputMapping (DataFrame column -> tensor); {what}: {_names(ins, ref)}"
            raise ValueError(msg)
        in_map = self.getInputMapping()
        fields = {f.name: f for f in dataset.schema.fields}
        for col, tensor in in_map.items():
            if col not in fields:
                msg = f"InputMapping column {col!r} is not in the DataFrame; its columns: {list(fields)}"
                raise ValueError(msg)
            if tensor not in ins:
                msg = f"InputMapping maps column {col!r} to unknown tensor {tensor!r}; {what}: {_names(ins, ref)}"
                raise ValueError(msg)
        if ref.style != model_runners.TENSORS:
            missing = sorted(set(ins) - set(in_map.values()))
            if missing:
                msg = f"InputMapping feeds no column to {missing}; the model needs every one of {sorted(ins)}"
                raise ValueError(msg)
        if self.isDefined(self.outputMapping):
            out_map = self.getOutputMapping()
        elif ref.style == model_runners.TENSORS:
            msg = ("TFModel with SignatureDefKey=None needs OutputMapping (tensor name -> column), e.g. "
                   f"{_signature_tensors(ref)}")
            raise ValueError(msg)
        else:
            out_map = {k: k for k in sorted(outs)}
        out_what = {model_runners.SIGNATURE: f"signature {ref.signature!r} output aliases", model_runners.CHECKPOINT: "model outputs",
                    model_runners.KERAS: "model outputs", model_runners.TENSORS: "tensors"}[ref.style]
        for tensor, col in out_map.items():
            if tensor not in outs:
                names = _signature_tensors(ref) if ref.style == model_runners.TENSORS else sorted(outs)
                msg = f"OutputMapping names unknown tensor {tensor!r}; {out_what}: {names}"
                raise ValueError(msg)
            if col in fields:
                msg = f"OutputMapping column {col!r} is already a column of the DataFrame; pick another name"
                raise ValueError(msg)

        feeds, args = [], []
        for col, tensor in in_map.items():
            info = ins[tensor]
            dtype = fields[col].dataType
            depth = 1 if isinstance(dtype, VectorUDT) else 0
            while isinstance(dtype, T.ArrayType):
                depth, dtype = depth + 1, dtype.elementType
            if info.shape and len(info.shape) != depth + 1 and not (depth == 1 and len(info.shape) > 2):
                kind = "a scalar" if depth == 0 else f"{depth}-level array"
                msg = (f"column {col!r} ({kind} per row) cannot feed tensor {tensor!r} of shape {list(info.shape)}: "
                       f"it takes rank-{len(info.shape) - 1} values per row")
                raise ValueError(msg)
            c = F.col(col)
            if isinstance(fields[col].dataType, VectorUDT):
                c = vector_to_array(c, "float64" if info.dtype == "float64" else "float32")
            feeds.append((col, info))
            args.append(c)
        fetches = [(col, outs[tensor]) for tensor, col in out_map.items()]
        rtype = spark_type(fetches[0][1]) if len(fetches) == 1 else \
            T.StructType([T.StructField(f"o{i}", spark_type(info), True) for i, (_, info) in enumerate(fetches)])
        scorer = _Scorer(ref, feeds, fetches, self.getBatchSize())
        return args, scorer, rtype, fetches

    def _transform(self, dataset: Any) -> Any:
        from pyspark.sql import functions as F

        args, scorer, rtype, fetches = self._plan(dataset)
        udf = _scalar_udf(scorer, rtype)
        tmp = "__tfos_nb_out"
        # One UDF call per row; Spark does not inline a Python UDF into each field it is read from.
        scored = dataset.withColumn(tmp, udf(*args))
        outputs = [F.col(tmp).alias(fetches[0][0])] if len(fetches) == 1 else \
            [F.col(f"{tmp}.o{i}").alias(col) for i, (col, _) in enumerate(fetches)]
        return scored.select(*[F.col(f"`{c}`") for c in dataset.columns], *outputs)

def _describe_in_a_worker(spark: Any, ref: model_runners.ModelRef) -> Any:
    """:func:`model_runners.describe` run in a Python worker by a one-task Spark job (classic or Connect)."""
    from ..runtime.sessions import in_one_task

    return model_runners.describe_from_json(in_one_task(spark, lambda: model_runners.describe_json(ref)))


def _use_arrow_udf() -> bool:
    """pyspark >= 4.1 has scalar Arrow UDFs (Arrow arrays in and out, no pandas on the way)."""
    from pyspark.sql import functions as F

    return hasattr(F, "arrow_udf")


def _scalar_udf(scorer: _Scorer, rtype: Any) -> Any:
    """The scoring UDF: an Arrow UDF where pyspark has them, else a pandas UDF around the same scorer."""
    from pyspark.sql.pandas import functions as udfs  # where pyspark.sql.functions re-exports them from

    with warnings.catch_warnings():  # "prefer type hints": these would have to be pyarrow at import time
        warnings.simplefilter("ignore", UserWarning)
        if _use_arrow_udf():
            def tfmodel_predict(*cols: Any) -> Any:
                return scorer(*cols)

            return udfs.arrow_udf(tfmodel_predict, rtype, udfs.ArrowUDFType.SCALAR)

        def tfmodel_predict_pandas(*series: Any) -> Any:  # pyspark < 4.1
            import pandas as pd
            import pyarrow as pa

            out = scorer(*[pa.array(s, from_pandas=True) for s in series])
            if not pa.types.is_struct(out.type):  # one output: a Series
                return out.to_pandas()
            names = [out.type.field(i).name for i in range(out.type.num_fields)]
            return pd.DataFrame({name: out.field(i).to_pandas() for i, name in enumerate(names)})

        return udfs.pandas_udf(tfmodel_predict_pandas, rtype, udfs.PandasUDFType.SCALAR)


def _names(infos: dict[str, model_runners.TensorInfo], ref: model_runners.ModelRef) -> list[str]:
    if ref.style != model_runners.TENSORS:
        return sorted(infos)
    return _signature_tensors(ref, inputs=True)


def _signature_tensors(ref: model_runners.ModelRef, inputs: bool = False) -> list[str]:
    """Tensor names the SavedModel's signatures use (the useful subset of a graph's tensors)."""
    mg = model_runners._meta_graph(ref.path, ref.tags)
    names = set()
    for sig in mg.signature_def.values():
        for t in (sig.inputs if inputs else sig.outputs).values():
            names.add(t.name)
    return sorted(names)


