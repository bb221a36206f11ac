import numpy as np
import pyarrow as pa
import pytest

from tfos_nb.runtime import columns as C


def roundtrip(rows):
    batch = C.decode_ipc(C.encode_ipc(C.rows_to_batch(rows)))
    return batch


@pytest.mark.parametrize(
    "rows",
    [
        [([1.0, 2.0, 3.0], 1), ([4.0, 5.0, 6.0], 2)],
        [(1, "a"), (2, "b")],
        [[1, "x"], [2, "y"]],
        [{"a": 1, "b": [1.0, 2.0]}, {"a": 2, "b": [3.0, 4.0]}],
        [3, 4, 5],
        ["s", "t"],
        [[1.0, 2.0], [3.0, 4.0]],
    ],
)
def test_rows_roundtrip(rows):
    assert C.batch_to_rows(roundtrip(rows)) == [tuple(r) if isinstance(r, tuple) else r for r in rows]


def test_numpy_rows_become_one_2d_column():
    rows = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(4)]
    (col,) = C.batch_to_columns(roundtrip(rows))
    assert col.shape == (4, 2, 3) and col.dtype == np.float32
    np.testing.assert_array_equal(col[2], rows[2])


def test_columns_of_feature_rows():
    rows = [(np.full(784, i, dtype=np.float32).tolist(), i) for i in range(10)]
    x, y = C.batch_to_columns(roundtrip(rows))
    assert x.shape == (10, 784) and y.tolist() == list(range(10))


def test_spark_style_list_column_to_matrix():
    arr = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32())).slice(1)
    batch = pa.RecordBatch.from_arrays([arr], names=["f"])
    (col,) = C.batch_to_columns(batch)
    np.testing.assert_array_equal(col, [[3.0, 4.0], [5.0, 6.0]])


def test_ragged_column_names_the_column():
    batch = pa.RecordBatch.from_arrays([pa.array([[1.0], [1.0, 2.0]])], names=["features"])
    with pytest.raises(C.FeedDataError, match="column 'features' holds arrays of different lengths"):
        C.batch_to_columns(batch)


def test_nulls_name_the_column():
    batch = pa.RecordBatch.from_arrays([pa.array([1.0, None])], names=["x"])
    with pytest.raises(C.FeedDataError, match="column 'x' has 1 null"):
        C.batch_to_columns(batch)


def test_rows_of_different_lengths_are_refused():
    with pytest.raises(C.FeedDataError, match="rows of different lengths"):
        C.rows_to_batch([(1, 2), (1, 2, 3)])


def test_vector_udt_struct_dense_and_sparse():
    struct = pa.StructArray.from_arrays(
        [
            pa.array([1, 0], pa.int8()),
            pa.array([None, 3], pa.int32()),
            pa.array([None, [0, 2]], pa.list_(pa.int32())),
            pa.array([[1.0, 2.0, 3.0], [7.0, 9.0]], pa.list_(pa.float64())),
        ],
        names=["type", "size", "indices", "values"],
    )
    (col,) = C.batch_to_columns(pa.RecordBatch.from_arrays([struct], names=["v"]))
    np.testing.assert_array_equal(col, [[1.0, 2.0, 3.0], [7.0, 0.0, 9.0]])


def test_dataframe_rows_arrive_as_pyspark_rows():
    from pyspark.sql import Row

    fed = C.batch_to_rows(C.rows_to_batch([Row(x=1.5, label=3), Row(x=2.5, label=4)]))  # df.rdd rows
    plain = C.batch_to_rows(pa.RecordBatch.from_pydict({"x": [1.5], "label": [3]}))  # a DataFrame's Arrow batch
    for rows in (fed, plain):
        row = rows[0]
        assert isinstance(row, Row) and row.label == row["label"] == row[1] == 3
        assert row.asDict() == {"x": 1.5, "label": 3} and row == (1.5, 3)
    assert fed[1].x == 2.5
