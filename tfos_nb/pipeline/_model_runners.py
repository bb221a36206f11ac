"""The three ways to run a model: what they accept (on the driver) and running them (in Python workers).

A :class:`ModelRef` names a model (style, path, tags, signature, checkpoint
builder) and is small enough to ship in a task closure.  ``describe(ref)``
returns its inputs and outputs (name → dtype, shape) for the driver's checks
and the result schema; ``runner(ref)`` loads it once per Python worker (Spark
reuses workers across tasks and jobs: ``spark.python.worker.reuse``) and keeps
it in a module-level cache.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..runtime.executor.collector import settle_gc

SIGNATURE = "signature"
TENSORS = "tensors"
CHECKPOINT = "checkpoint"
KERAS = "keras"  # a Keras 3 model file (model.save("....keras")), loaded with keras.models.load_model


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  #: numpy dtype name, or "string"
    shape: tuple[int, ...]  #: -1 for an unknown dimension (the batch dimension is first)


@dataclass(frozen=True)
class ModelRef:
    style: str
    path: str
    tags: tuple[str, ...] = ("serve",)
    signature: str | None = None
    model_fn_blob: bytes | None = field(default=None, repr=False)

    def key(self) -> tuple[Any, ...]:
        digest = hashlib.sha1(self.model_fn_blob, usedforsecurity=False).hexdigest() if self.model_fn_blob else None
        return (self.style, os.path.abspath(self.path) if "://" not in self.path else self.path,
                self.tags, self.signature, digest)


def _legacy_keras() -> None:
    # Nodes train with tf_keras; Python workers must rebuild/restore with the same Keras.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _np_dtype(tf_dtype: Any) -> str:
    return "string" if tf_dtype.name == "string" else np.dtype(tf_dtype.as_numpy_dtype).name


def _shape(tf_shape: Any) -> tuple[int, ...]:
    if tf_shape.rank is None:
        return ()
    return tuple(-1 if d is None else int(d) for d in tf_shape.as_list())


# -- SavedModel metadata (driver) -------------------------------------------------------------


def _meta_graph(path: str, tags: tuple[str, ...]) -> Any:
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    pb = os.path.join(path, "saved_model.pb")
    if not tf.io.gfile.exists(pb):
        msg = f"no SavedModel in {path!r} (no saved_model.pb there); set ExportDir to a SavedModel directory"
        raise ValueError(msg)
    sm = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(pb, "rb") as f:
        sm.ParseFromString(f.read())
    found = [tuple(mg.meta_info_def.tags) for mg in sm.meta_graphs]
    for mg in sm.meta_graphs:
        if set(mg.meta_info_def.tags) == set(tags):
            return mg
    msg = f"SavedModel {path!r} has no MetaGraph with tags {list(tags)}; tag sets there: {[list(t) for t in found]}"
    raise ValueError(msg)


def _describe_signature(ref: ModelRef) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    import tensorflow as tf

    mg = _meta_graph(ref.path, ref.tags)
    if ref.signature not in mg.signature_def:
        msg = (f"SavedModel {ref.path!r} has no signature {ref.signature!r}; signatures: "
               f"{sorted(mg.signature_def)} (or set SignatureDefKey=None to map tensor names)")
        raise ValueError(msg)
    sig = mg.signature_def[ref.signature]

    def info(alias: str, t: Any) -> TensorInfo:
        return TensorInfo(alias, _np_dtype(tf.dtypes.as_dtype(t.dtype)), _shape(tf.TensorShape(t.tensor_shape)))

    return ({a: info(a, t) for a, t in sig.inputs.items()}, {a: info(a, t) for a, t in sig.outputs.items()})


def _describe_tensors(ref: ModelRef) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    """Every tensor of the MetaGraph: the graph is imported (no variables restored)."""
    import tensorflow as tf

    mg = _meta_graph(ref.path, ref.tags)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(mg, clear_devices=True)
    tensors = {}
    for op in graph.get_operations():
        for t in op.outputs:
            tensors[t.name] = TensorInfo(t.name, _np_dtype(t.dtype) if t.dtype.name != "resource" else "resource",
                                         _shape(t.shape))
    return tensors, tensors


def _describe_checkpoint(ref: ModelRef) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    model = _build(ref)
    ins = {n: TensorInfo(n, _np_dtype(t.dtype), _shape(t.shape)) for n, t in zip(model.input_names, model.inputs)}
    outs = {n: TensorInfo(n, _np_dtype(t.dtype), _shape(t.shape)) for n, t in zip(model.output_names, model.outputs)}
    return ins, outs


def _load_keras(ref: ModelRef) -> Any:
    """The ``.keras`` file as a Keras 3 model (``import keras`` is Keras 3 whatever ``tf.keras`` is here)."""
    import keras
    import tensorflow as tf

    if not tf.io.gfile.exists(ref.path):
        msg = f"no Keras model file {ref.path!r}; set ExportDir to a file written by model.save('....keras')"
        raise ValueError(msg)
    local = ref.path
    if "://" in ref.path:  # keras.models.load_model reads local files: copy a remote one here first
        import tempfile

        local = os.path.join(tempfile.mkdtemp(prefix="tfos-keras-"), os.path.basename(ref.path))
        tf.io.gfile.copy(ref.path, local)
    return keras.models.load_model(local, compile=False)


def _keras_output_names(model: Any) -> list[str]:
    """A Keras 3 model's output names: a functional model's own (its dict keys), else its last layers' names."""
    names = getattr(model, "output_names", None)
    if names and len(names) == len(model.outputs):
        return [str(n) for n in names]
    if len(model.outputs) == 1:
        return [model.layers[-1].name]
    return [t.name for t in model.outputs]


def _describe_keras(ref: ModelRef) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    model = _load_keras(ref)

    def info(name: str, t: Any) -> TensorInfo:
        shape = tuple(-1 if d is None else int(d) for d in t.shape)
        return TensorInfo(name, "string" if str(t.dtype) == "string" else np.dtype(str(t.dtype)).name, shape)

    ins = {t.name: info(t.name, t) for t in model.inputs}
    outs = {n: info(n, t) for n, t in zip(_keras_output_names(model), model.outputs)}
    return ins, outs


def describe(ref: ModelRef) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    """(inputs, outputs) of the model, by the names the mappings use in this style."""
    _legacy_keras()
    return {SIGNATURE: _describe_signature, TENSORS: _describe_tensors, CHECKPOINT: _describe_checkpoint,
            KERAS: _describe_keras}[ref.style](ref)


def keras_is_not_the_nodes() -> bool:
    """True when this process's ``tf.keras`` is Keras 3 although the nodes train with tf_keras.

    TensorFlow picks ``tf.keras`` at its first use in a process: a notebook that used ``tf.keras``
    before tfos_nb asked for tf_keras has Keras 3 for good, and a ``model_fn`` run here builds a
    model that the nodes' checkpoints do not restore into.
    """
    _legacy_keras()
    import tensorflow as tf

    return not str(getattr(tf.keras, "__version__", "2")).startswith("2.")


def describe_json(ref: ModelRef) -> str:
    """:func:`describe` as JSON (what a Python worker sends back to the driver)."""
    import json

    ins, outs = describe(ref)
    return json.dumps([[[i.name, i.dtype, list(i.shape)] for i in side.values()] for side in (ins, outs)])


def describe_from_json(text: str) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    import json

    ins, outs = ([TensorInfo(str(n), str(d), tuple(int(x) for x in shape)) for n, d, shape in side]
                 for side in json.loads(text))
    return {i.name: i for i in ins}, {o.name: o for o in outs}


# -- running (Python workers) ------------------------------------------------------------------


def _build(ref: ModelRef) -> Any:
    import cloudpickle
    import tensorflow as tf

    model_fn = cloudpickle.loads(ref.model_fn_blob)
    model = model_fn()
    latest = tf.train.latest_checkpoint(ref.path)
    if latest is None:
        msg = f"no checkpoint in ModelDir {ref.path!r} (tf.train.latest_checkpoint found none)"
        raise ValueError(msg)
    status = tf.train.Checkpoint(model=model).restore(latest)
    try:
        status.assert_existing_objects_matched()
    except AssertionError:
        # Written by model.save_weights / ModelCheckpoint: the model is the checkpoint's root.
        model.load_weights(latest).expect_partial()
    else:
        status.expect_partial()
    return model


class _SignatureRunner:
    def __init__(self, ref: ModelRef, inputs: list[str], outputs: list[str]) -> None:
        import tensorflow as tf

        self._tf = tf
        self._loaded = tf.saved_model.load(ref.path, tags=list(ref.tags))  # keeps the signature's variables alive
        self._fn = self._loaded.signatures[ref.signature]
        self._outputs = outputs

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self._fn(**{k: self._tf.constant(v) for k, v in feeds.items()})
        return {k: out[k].numpy() for k in self._outputs}


class _TensorRunner:
    def __init__(self, ref: ModelRef, inputs: list[str], outputs: list[str]) -> None:
        import tensorflow as tf

        self._graph = tf.Graph()
        self._sess = tf.compat.v1.Session(graph=self._graph)
        with self._graph.as_default():
            tf.compat.v1.saved_model.loader.load(self._sess, list(ref.tags), ref.path)
        self._outputs = outputs

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._sess.run(self._outputs, feed_dict=feeds)
        return dict(zip(self._outputs, values))


class _CheckpointRunner:
    """A Keras model rebuilt by ``model_fn`` and restored from the latest checkpoint, scored with its own call."""

    def __init__(self, ref: ModelRef, inputs: list[str], outputs: list[str]) -> None:
        model = self._load(ref)
        self._names, self._out_names = self._input_output_names(model)
        self._outputs = outputs

        def predict(xs: Any) -> Any:
            return model(xs if len(xs) > 1 else xs[0], training=False)

        import tensorflow as tf

        self._model = model
        self._predict = tf.function(predict, reduce_retracing=True)

    def _load(self, ref: ModelRef) -> Any:
        return _build(ref)

    def _input_output_names(self, model: Any) -> tuple[list[str], list[str]]:
        return list(model.input_names), list(model.output_names)

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self._predict([feeds[n] for n in self._names])
        if isinstance(out, dict):
            got = {k: np.asarray(v) for k, v in out.items()}
        else:
            outs = out if isinstance(out, (list, tuple)) else [out]
            got = {n: np.asarray(v) for n, v in zip(self._out_names, outs)}
        return {k: got[k] for k in self._outputs}


class _KerasRunner(_CheckpointRunner):
    """A Keras 3 ``.keras`` file, scored as the checkpoint style scores its model."""

    def _load(self, ref: ModelRef) -> Any:
        return _load_keras(ref)

    def _input_output_names(self, model: Any) -> tuple[list[str], list[str]]:
        return [t.name for t in model.inputs], _keras_output_names(model)


_RUNNERS: dict[str, Callable[..., Any]] = {SIGNATURE: _SignatureRunner, TENSORS: _TensorRunner,
                                           CHECKPOINT: _CheckpointRunner, KERAS: _KerasRunner}
_CACHE: dict[tuple[Any, ...], Any] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_MAX = 4


def runner(ref: ModelRef, inputs: list[str], outputs: list[str]) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """The loaded model for ``ref``, loaded at most once per Python worker process."""
    key = (ref.key(), tuple(inputs), tuple(outputs))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            _legacy_keras()
            hit = _RUNNERS[ref.style](ref, inputs, outputs)
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = hit
            settle_gc(again=True)  # the loaded model (TensorFlow's objects) out of the collector's full passes
    loaded: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = hit
    return loaded
