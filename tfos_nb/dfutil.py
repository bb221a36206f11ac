"""DataFrame <-> TFRecord files (TensorFlowOnSpark's ``dfutil``), without a Hadoop jar.

Each partition is written by its Spark task with TensorFlow's own
``TFRecordWriter`` as ``part-r-NNNNN`` files of ``tf.train.Example`` records;
``loadTFRecords`` reads them back with TensorFlow, inferring the schema from
the first record (as TensorFlowOnSpark does).  Paths are anything TensorFlow's
file system layer can write: local paths, ``file://``, ``hdfs://``, ``gs://``…
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

__all__ = ["isLoadedDF", "loadTFRecords", "saveAsTFRecords"]

_loaded: dict[int, str] = {}


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
    for field in schema.fields:  # fail on the driver, before any task runs
        from pyspark.sql import types as T

        t = field.dataType.elementType if isinstance(field.dataType, T.ArrayType) else field.dataType
        ok = (T.IntegerType, T.LongType, T.ShortType, T.ByteType, T.BooleanType, T.FloatType, T.DoubleType,
              T.DecimalType, T.BinaryType, T.StringType)
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

    df.rdd.mapPartitionsWithIndex(write).collect()


def _infer_schema(example: Any, binary_features: list[str]) -> Any:
    from pyspark.sql import types as T

    fields = []
    for name in sorted(example.features.feature):
        feat = example.features.feature[name]
        kind = feat.WhichOneof("kind")
        n = len(getattr(feat, kind).value)
        if kind == "int64_list":
            base: Any = T.LongType()
        elif kind == "float_list":
            base = T.FloatType()
        else:
            base = T.BinaryType() if name in binary_features else T.StringType()
        fields.append(T.StructField(name, base if n == 1 else T.ArrayType(base)))
    return T.StructType(fields)


def loadTFRecords(sc: Any, input_dir: str, binary_features: list[str] | None = None) -> Any:  # noqa: N802
    """Read TFRecord files of ``tf.train.Example`` into a DataFrame (schema from the first record)."""
    import tensorflow as tf
    from pyspark.sql import SparkSession

    binary_features = list(binary_features or [])
    files = sorted(f for f in tf.io.gfile.glob(os.path.join(input_dir, "part-*")))
    if not files:
        msg = f"no TFRecord files (part-*) in {input_dir}"
        raise FileNotFoundError(msg)
    first = next(iter(tf.data.TFRecordDataset(files[0]).take(1)), None)
    if first is None:
        msg = f"{files[0]} holds no record"
        raise ValueError(msg)
    schema = _infer_schema(tf.train.Example.FromString(first.numpy()), binary_features)
    names = [(f.name, f.dataType) for f in schema.fields]

    def read(paths: Iterator[str]) -> Iterator[tuple]:
        import tensorflow as tf
        from pyspark.sql import types as T

        for path in paths:
            for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
                ex = tf.train.Example.FromString(raw)
                row = []
                for name, dtype in names:
                    feat = ex.features.feature[name]
                    vals = list(getattr(feat, feat.WhichOneof("kind")).value) if feat.WhichOneof("kind") else []
                    base = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
                    if isinstance(base, T.StringType):
                        vals = [v.decode() for v in vals]
                    elif isinstance(base, T.BinaryType):
                        vals = [bytearray(v) for v in vals]
                    row.append(vals if isinstance(dtype, T.ArrayType) else (vals[0] if vals else None))
                yield tuple(row)

    spark = SparkSession.builder.getOrCreate()
    df = spark.createDataFrame(sc.parallelize(files, len(files)).mapPartitions(read), schema)
    _loaded[id(df)] = input_dir
    return df


def isLoadedDF(df: Any) -> bool:  # noqa: N802
    """Whether ``df`` came from :func:`loadTFRecords` (so it can be re-read from its files)."""
    return id(df) in _loaded
