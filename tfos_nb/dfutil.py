"""DataFrame <-> TFRecord files (TensorFlowOnSpark's ``dfutil``), without a Hadoop jar.

Each partition is written by its Spark task with TensorFlow's own
``TFRecordWriter`` as ``part-r-NNNNN`` files of ``tf.train.Example`` records;
``loadTFRecords`` reads every TFRecord file of a directory back with TensorFlow,
inferring the schema from the first record (as TensorFlowOnSpark does).
``toTFExample`` / ``fromTFExample`` / ``infer_schema`` are TensorFlowOnSpark's
conversion helpers.  Paths are anything TensorFlow's
file system layer can write: local paths, ``file://``, ``hdfs://``, ``gs://``…

On a Spark Connect session (no RDDs) both run through ``mapInArrow`` instead:
``saveAsTFRecords(df, dir)`` as it is, ``loadTFRecords(spark, dir)`` given the session.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import Any

from .runtime.sessions import is_connect

__all__ = ["fromTFExample", "infer_schema", "isLoadedDF", "loadTFRecords", "loadedDF", "saveAsTFRecords",
           "toTFExample"]

loadedDF: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # noqa: N816
"""DataFrames read by :func:`loadTFRecords` → their directory (TensorFlowOnSpark's ``dfutil.loadedDF``)."""


def _feature(tf: Any, value: Any, dtype: Any) -> Any:
    from pyspark.sql import types as T

    base = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
    values = list(value) if isinstance(dtype, T.ArrayType) else [value]
    if hasattr(value, "toArray"):  # an ML vector
        values, base = value.toArray().tolist(), T.DoubleType()
    if isinstance(base, (T.IntegerType, T.LongType, T.ShortType, T.ByteType, T.BooleanType)):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
    if isinstance(base, (T.FloatType, T.DoubleType, T.DecimalType)) or hasattr(value, "toArray"):
        return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))
    if isinstance(base, T.BinaryType):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(v) for v in values]))
    if isinstance(base, T.StringType):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(v).encode() for v in values]))
    msg = f"cannot write a column of type {dtype.simpleString()} to a TFRecord"
    raise TypeError(msg)


def saveAsTFRecords(df: Any, output_dir: str) -> None:  # noqa: N802 - TensorFlowOnSpark's name
    """Write ``df`` as TFRecord files of ``tf.train.Example``, one file per partition."""
    schema = df.schema
    connect = is_connect(df)
    for field in schema.fields:  # fail on the driver, before any task runs
        from pyspark.sql import types as T

        t = field.dataType.elementType if isinstance(field.dataType, T.ArrayType) else field.dataType
        ok = (T.IntegerType, T.LongType, T.ShortType, T.ByteType, T.BooleanType, T.FloatType, T.DoubleType,
              T.DecimalType, T.BinaryType, T.StringType)
        if type(t).__name__ == "VectorUDT" and connect:
            msg = (f"column {field.name!r}: an ML vector column cannot be written to TFRecords on Spark Connect; "
                   f"convert it first: df.withColumn({field.name!r}, pyspark.ml.functions.vector_to_array("
                   f"{field.name!r}))")
            raise TypeError(msg)
        if not isinstance(t, ok) and type(t).__name__ != "VectorUDT":
            msg = f"column {field.name!r}: cannot write type {field.dataType.simpleString()} to a TFRecord"
            raise TypeError(msg)

    def write(index: int, rows: Iterator[Any]) -> Iterator[int]:
        import tensorflow as tf

        tf.io.gfile.makedirs(output_dir)
        path = f"{output_dir.rstrip('/')}/part-r-{index:05d}"
        n = 0
        with tf.io.TFRecordWriter(path) as writer:
            for row in rows:
                feats = {
                    f.name: _feature(tf, row[f.name], f.dataType) for f in schema.fields if row[f.name] is not None
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
                n += 1
        yield n

    if not connect:
        df.rdd.mapPartitionsWithIndex(write).collect()
        return

    def write_batches(batches: Iterator[Any]) -> Iterator[Any]:  # Spark Connect: no RDDs, the same writer
        import pyarrow as pa
        from pyspark import TaskContext

        rows = (row for batch in batches for row in batch.to_pylist())
        task = TaskContext.get()
        written = next(write(task.partitionId() if task is not None else 0, rows))
        yield pa.RecordBatch.from_pydict({"records": [written]})

    df.mapInArrow(write_batches, "records long").collect()


def infer_schema(example: Any, binary_features: list[str] | None = None) -> Any:
    """The DataFrame schema of a ``tf.train.Example`` (TensorFlowOnSpark's rule).

    int64 features are ``LongType``, float features ``DoubleType``, bytes features
    ``StringType`` (``BinaryType`` when named in ``binary_features``); a feature of
    more than one value is an ``ArrayType`` of those, an empty one is ``StringType``.
    Columns are sorted by name.
    """
    from pyspark.sql import types as T

    binary = set(binary_features or [])
    fields = []
    for name in sorted(example.features.feature):
        feat = example.features.feature[name]
        kind = feat.WhichOneof("kind")
        values = getattr(feat, kind).value if kind else []
        if name in binary:
            base: Any = T.BinaryType()
        elif kind == "int64_list" and len(values):
            base = T.LongType()
        elif kind == "float_list" and len(values):
            base = T.DoubleType()
        else:
            base = T.StringType()
        fields.append(T.StructField(name, T.ArrayType(base) if len(values) > 1 else base, True))
    return T.StructType(fields)


def _value(name: str, feat: Any, binary: set[str]) -> Any:
    """A feature as a Python value: scalars for one value, lists for more, None for none."""
    kind = feat.WhichOneof("kind")
    values = list(getattr(feat, kind).value) if kind else []
    if kind == "bytes_list":
        values = [bytearray(v) if name in binary else v.decode("utf-8") for v in values]
    if len(values) > 1:
        return values
    return values[0] if values else None


def toTFExample(dtypes: list[tuple[str, str]]) -> Any:  # noqa: N802 - TensorFlowOnSpark's name
    """A ``mapPartitions`` function: rows of a DataFrame with ``dtypes`` → ``(serialized tf.train.Example, None)``.

    ``df.rdd.mapPartitions(toTFExample(df.dtypes))``, as in TensorFlowOnSpark (pairs for a
    Hadoop output format); numbers, booleans, strings, binary and arrays of them.
    """
    floats = {"float", "double"}
    ints = {"boolean", "tinyint", "smallint", "int", "bigint", "long"}
    texts = {"string", "binary"}
    for name, dtype in dtypes:
        base = dtype[6:-1] if dtype.startswith("array<") and dtype.endswith(">") else dtype
        if base not in floats | ints | texts or (base == "binary" and base != dtype):
            msg = f"toTFExample: column {name!r} has type {dtype}, which has no tf.train.Feature"
            raise TypeError(msg)

    def to_examples(rows: Iterator[Any]) -> Iterator[tuple[bytearray, None]]:
        import tensorflow as tf

        for row in rows:
            feats = {}
            for name, dtype in dtypes:
                value = row[name]
                is_array = dtype.startswith("array<")
                base = dtype[6:-1] if is_array else dtype
                values = [] if value is None else (list(value) if is_array else [value])
                if base in floats:
                    feats[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))
                elif base in ints:
                    feats[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
                else:
                    raw = [bytes(v) if base == "binary" else str(v).encode("utf-8") for v in values]
                    feats[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=raw))
            example = tf.train.Example(features=tf.train.Features(feature=feats))
            yield bytearray(example.SerializeToString()), None

    return to_examples


def fromTFExample(iter: Iterator[Any], binary_features: list[str] | None = None) -> list[Any]:  # noqa: N802
    """A ``mapPartitions`` function: serialized ``tf.train.Example`` records → ``pyspark.sql.Row`` objects.

    Records are ``(bytes, None)`` pairs (TensorFlowOnSpark's Hadoop input format) or plain
    bytes.  Bytes features become str, or bytearray when named in ``binary_features``;
    one value is a scalar, more a list, none ``None``.
    """
    import tensorflow as tf
    from pyspark.sql import Row

    binary = set(binary_features or [])
    rows = []
    for record in iter:
        raw = record[0] if isinstance(record, (tuple, list)) else record
        example = tf.train.Example.FromString(bytes(raw))
        rows.append(Row(**{k: _value(k, v, binary) for k, v in sorted(example.features.feature.items())}))
    return rows


def _record_files(input_dir: str) -> list[str]:
    """The TFRecord files of ``input_dir`` (every file but Hadoop's hidden ``_*``/``.*`` ones), or a glob's matches."""
    import tensorflow as tf

    if any(c in input_dir for c in "*?["):
        paths = tf.io.gfile.glob(input_dir)
    elif tf.io.gfile.exists(input_dir) and not tf.io.gfile.isdir(input_dir):
        paths = [input_dir]
    elif tf.io.gfile.isdir(input_dir):
        paths = [f"{input_dir.rstrip('/')}/{name}" for name in tf.io.gfile.listdir(input_dir)]
    else:
        msg = f"loadTFRecords: {input_dir} does not exist"
        raise FileNotFoundError(msg)
    return sorted(p for p in paths if not os.path.basename(p.rstrip("/")).startswith(("_", "."))
                  and not tf.io.gfile.isdir(p))


def loadTFRecords(sc: Any, input_dir: str, binary_features: list[str] | None = None) -> Any:  # noqa: N802
    """Read the TFRecord files of ``tf.train.Example`` in ``input_dir`` into a DataFrame.

    ``sc``: the SparkContext, as in TensorFlowOnSpark, or a SparkSession (on Spark Connect,
    which has no SparkContext, the session: ``loadTFRecords(spark, dir)``).

    Every file of the directory is read (not only ``part-*``; Hadoop's hidden ``_*`` and
    ``.*`` files are skipped; a glob pattern works too); empty files are fine.  The
    schema is inferred from the first record (:func:`infer_schema`: floats are
    ``DoubleType``, as in TensorFlowOnSpark).
    """
    import tensorflow as tf
    from pyspark.sql import SparkSession

    binary_features = list(binary_features or [])
    files = _record_files(input_dir)
    if not files:
        msg = f"no TFRecord files in {input_dir}"
        raise FileNotFoundError(msg)
    first = None
    for path in files:
        first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
        if first is not None:
            break
    if first is None:
        msg = f"no record in any of the {len(files)} TFRecord file(s) of {input_dir}: the schema cannot be inferred"
        raise ValueError(msg)
    schema = infer_schema(tf.train.Example.FromString(first.numpy()), binary_features)
    names = [(f.name, f.dataType) for f in schema.fields]
    binary = set(binary_features)

    def read(paths: Iterator[str]) -> Iterator[tuple[Any, ...]]:
        import tensorflow as tf
        from pyspark.sql import types as T

        for path in paths:
            for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
                ex = tf.train.Example.FromString(raw)
                row = []
                for name, dtype in names:
                    value = _value(name, ex.features.feature[name], binary) if name in ex.features.feature else None
                    if isinstance(dtype, T.ArrayType) and value is not None and not isinstance(value, list):
                        value = [value]
                    elif not isinstance(dtype, T.ArrayType) and isinstance(value, list):
                        msg = (f"{path}: feature {name!r} has {len(value)} values in one record and 1 in the "
                               "first record: its column type is a scalar")
                        raise ValueError(msg)
                    row.append(value)
                yield tuple(row)

    if is_connect(sc):
        df = _load_with_arrow(sc, files, schema, read)
    else:
        spark = sc if hasattr(sc, "createDataFrame") else SparkSession.builder.getOrCreate()
        sc = spark.sparkContext
        df = spark.createDataFrame(sc.parallelize(files, len(files)).mapPartitions(read), schema)
    loadedDF[df] = input_dir
    return df


def _load_with_arrow(spark: Any, files: list[str], schema: Any, read: Any) -> Any:
    """``loadTFRecords`` without RDDs (Spark Connect): one task per file, rows back as Arrow batches."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema)
    names = schema.names

    def read_batches(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            for index in batch.column(0).to_pylist():
                chunk: list[dict[str, Any]] = []
                for row in read(iter([files[index]])):
                    chunk.append(dict(zip(names, row)))
                    if len(chunk) == 4096:
                        yield pa.RecordBatch.from_pylist(chunk, schema=arrow_schema)
                        chunk = []
                yield pa.RecordBatch.from_pylist(chunk, schema=arrow_schema)

    return spark.range(0, len(files), 1, len(files)).mapInArrow(read_batches, schema)


def isLoadedDF(df: Any) -> bool:  # noqa: N802
    """Whether ``df`` came from :func:`loadTFRecords` (so it can be re-read from its files)."""
    try:
        return df in loadedDF
    except TypeError:  # not weak-referenceable: not one of ours
        return False
