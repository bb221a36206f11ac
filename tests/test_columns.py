import numpy as np
import pyarrow as pa
import pytest

from tfos_nb.runtime.batches import columns, rowpack


def roundtrip(rows):
    batch = columns.decode_ipc(columns.encode_ipc(columns.rows_to_batch(rows)))
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
    assert columns.batch_to_rows(roundtrip(rows)) == [tuple(r) if isinstance(r, tuple) else r for r in rows]


def test_numpy_rows_become_one_2d_column():
    rows = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(4)]
    (col,) = columns.batch_to_columns(roundtrip(rows))
    assert col.shape == (4, 2, 3) and col.dtype == np.float32
    np.testing.assert_array_equal(col[2], rows[2])


def test_columns_of_feature_rows():
    rows = [(np.full(784, i, dtype=np.float32).tolist(), i) for i in range(10)]
    x, y = columns.batch_to_columns(roundtrip(rows))
    assert x.shape == (10, 784) and y.tolist() == list(range(10))


def test_spark_style_list_column_to_matrix():
    arr = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32())).slice(1)
    batch = pa.RecordBatch.from_arrays([arr], names=["f"])
    (col,) = columns.batch_to_columns(batch)
    np.testing.assert_array_equal(col, [[3.0, 4.0], [5.0, 6.0]])


def test_ragged_column_names_the_column():
    batch = pa.RecordBatch.from_arrays([pa.array([[1.0], [1.0, 2.0]])], names=["features"])
    with pytest.raises(columns.FeedDataError, match="column 'features' holds arrays of different lengths"):
        columns.batch_to_columns(batch)


def test_nulls_name_the_column():
    batch = pa.RecordBatch.from_arrays([pa.array([1.0, None])], names=["x"])
    with pytest.raises(columns.FeedDataError, match="column 'x' has 1 null"):
        columns.batch_to_columns(batch)


def test_rows_of_different_lengths_are_refused():
    with pytest.raises(columns.FeedDataError, match="rows of different lengths"):
        columns.rows_to_batch([(1, 2), (1, 2, 3)])


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
    (col,) = columns.batch_to_columns(pa.RecordBatch.from_arrays([struct], names=["v"]))
    np.testing.assert_array_equal(col, [[1.0, 2.0, 3.0], [7.0, 0.0, 9.0]])


def test_dataframe_rows_arrive_as_pyspark_rows():
    from pyspark.sql import Row

    fed = columns.batch_to_rows(columns.rows_to_batch([Row(x=1.5, label=3), Row(x=2.5, label=4)]))  # df.rdd rows
    plain = columns.batch_to_rows(pa.RecordBatch.from_pydict({"x": [1.5], "label": [3]}))  # a DataFrame's Arrow batch
    for rows in (fed, plain):
        row = rows[0]
        assert isinstance(row, Row) and row.label == row["label"] == row[1] == 3
        assert row.asDict() == {"x": 1.5, "label": 3} and row == (1.5, 3)
    assert fed[1].x == 2.5


def _list_batch(x, labels, fixed=False):
    n, width = x.shape
    flat = pa.array(x.ravel())
    if fixed:
        feats = pa.FixedSizeListArray.from_arrays(flat, width)
    else:
        feats = pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32)), flat)
    return pa.RecordBatch.from_arrays([feats, pa.array(labels)], names=["features", "label"])


@pytest.mark.parametrize("fixed", [False, True])
def test_numpy_array_rows_are_views_of_a_dataframes_batch(fixed):
    from pyspark.sql import Row

    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    batch = _list_batch(x, np.arange(10, dtype=np.int32), fixed).slice(3, 5)  # next_batch hands out slices
    rows = columns.batch_to_rows(batch, numpy_arrays=True)
    assert len(rows) == 5 and all(isinstance(r, Row) for r in rows)
    first = rows[0]
    assert isinstance(first.features, np.ndarray) and first.features.dtype == np.float32
    np.testing.assert_array_equal(first.features, x[3])
    assert first[0] is not None and type(first.label) is int and first.label == first[1] == 3
    feats, label = first  # tuple unpacking, len, names: still a Row
    assert len(first) == 2 and label == 3 and feats.shape == (4,)
    assert not feats.flags.writeable  # a read-only view of the received Arrow buffer
    assert rows[0].features.base is rows[4].features.base is not None  # views of one array, no per-row copy
    np.testing.assert_array_equal(np.array([r[0] for r in rows]), x[3:8])
    np.testing.assert_array_equal(np.array([r.features for r in rows], dtype=np.float64), x[3:8])


def test_numpy_array_rows_keep_shapes_and_the_row_kinds():
    tuples = columns.batch_to_rows(roundtrip([(np.ones((2, 3)) * i, i) for i in range(3)]), numpy_arrays=True)
    assert type(tuples[2]) is tuple and tuples[2][0].shape == (2, 3) and tuples[2][0][1, 2] == 2.0
    vectors = columns.batch_to_rows(roundtrip([[1.0, 2.0], [3.0, 4.0]]), numpy_arrays=True)
    np.testing.assert_array_equal(np.array(vectors), [[1.0, 2.0], [3.0, 4.0]])  # np.array(batch) of vector rows
    dicts = columns.batch_to_rows(roundtrip([{"a": 1, "b": [1.0, 2.0]}]), numpy_arrays=True)
    assert dicts[0]["a"] == 1 and dicts[0]["b"].tolist() == [1.0, 2.0]
    lists = columns.batch_to_rows(roundtrip([[1, [1.0, 2.0]]]), numpy_arrays=True)
    assert type(lists[0]) is list and lists[0][1].tolist() == [1.0, 2.0]


def test_numpy_array_rows_leave_nulls_ragged_strings_and_scalars_as_python():
    batch = pa.RecordBatch.from_pydict({
        "nulls": [[1.0, None], [2.0, 3.0]], "ragged": [[1.0], [2.0, 3.0]], "missing": [[1, 2], None],
        "s": ["x", "y"], "n": [1, None], "f": [0.5, 1.5],
    })
    rows = columns.batch_to_rows(batch, numpy_arrays=True)
    assert rows == columns.batch_to_rows(batch)  # all Python values, as without numpy_arrays
    assert rows[0] == ([1.0, None], [1.0], [1, 2], "x", 1, 0.5) and rows[1][2] is None and rows[1][4] is None
    assert type(rows[1][5]) is float


def _chunks(rows, n):
    return [rows[i : i + n] for i in range(0, len(rows), n)]


@pytest.mark.parametrize(
    "rows",
    [
        [([0.5 * i, 1.0, 2.0], i) for i in range(10)],  # TensorFlowOnSpark's (features, label) tuples
        [[[0.5 * i, 1.0], "x%d" % i, 1.5 * i] for i in range(7)],  # list rows: a vector, a string, a float
        [([float(i)] * 4, [1.0 * i, 2.0], i) for i in range(9)],  # two vectors
        [([0.5, 1, True], 3)] * 5,  # ints and bools in a float vector become floats, as with np.fromiter
    ],
)
def test_rows_to_batches_gives_rows_to_batch_of_each_slice(rows):
    got = list(rowpack.rows_to_batches(rows, 4))
    want = [columns.rows_to_batch(chunk) for chunk in _chunks(rows, 4)]
    assert [b.schema for b in got] == [b.schema for b in want]
    assert all(g.schema.metadata == w.schema.metadata for g, w in zip(got, want))
    assert [b.to_pydict() for b in got] == [b.to_pydict() for b in want]


def test_rows_to_batches_packs_spark_rows_under_their_field_names():
    from pyspark.sql import Row

    rows = [Row(features=[1.0 * i, 2.0], label=i) for i in range(5)]
    (batch,) = rowpack.rows_to_batches(rows, 8)
    assert batch.schema == columns.rows_to_batch(rows).schema
    assert columns.batch_to_rows(batch) == [Row(features=[1.0 * i, 2.0], label=i) for i in range(5)]


@pytest.mark.parametrize(
    "odd",
    [
        ([1.0, 2.0], 7),  # a shorter vector
        ([1.0, "a", 3.0], 7),  # not a number
        ([1.0, None, 3.0], 7),  # a null
        ([1.0, 10**400, 3.0], 7),  # an int no float holds
        [[1.0, 2.0, 3.0], 7],  # a list, not a tuple
        ((1.0, 2.0, 3.0), 7, 8),  # a wider row
    ],
)
def test_rows_to_batches_after_a_row_of_another_shape_keeps_every_row_in_order(odd):
    rows = [([1.0 * i, 2.0, 3.0], i) for i in range(6)] + [odd] + [([9.0, 9.0, 9.0], 9)] * 3
    try:
        want = [columns.rows_to_batch(chunk) for chunk in _chunks(rows, 4)]
    except columns.FeedDataError:  # rows of different widths: refused either way
        with pytest.raises(columns.FeedDataError):
            list(rowpack.rows_to_batches(rows, 4))
        return
    got = list(rowpack.rows_to_batches(rows, 4))
    assert sum(b.num_rows for b in got) == len(rows)
    flat = [r for b in got for r in columns.batch_to_rows(b)]
    assert flat[:6] == [([1.0 * i, 2.0, 3.0], i) for i in range(6)]
    # A batch's first row decides whether its rows come back as tuples or lists (the odd list row starts one here)
    assert [repr(tuple(r)) for r in flat[6:]] == [repr(tuple(r)) for b in want for r in columns.batch_to_rows(b)][6:]


def test_rows_to_batches_leaves_rows_without_a_float_vector_to_rows_to_batch():
    rows = [(i, "s%d" % i, [i, 2]) for i in range(7)]  # no float vector: ints, strings, int lists
    got = list(rowpack.rows_to_batches(rows, 3))
    assert [b.num_rows for b in got] == [3, 3, 1]
    assert [r for b in got for r in columns.batch_to_rows(b)] == rows


def test_feeding_and_reading_numbers_do_not_import_pandas():
    """pyarrow's own numpy conversions import pandas on first use: ~0.6 s of every feeding worker's first task and
    of every node's first batch, which is why columns.py and rowpack.py wrap and read numeric buffers directly."""
    import subprocess
    import sys

    code = """if True:
        import sys
        import numpy as np
        from tfos_nb.runtime.batches import columns as C, rowpack as RP
        rows = [([0.5 * i] * 6, i, float(i)) for i in range(50)] + [(np.ones(6), 1, 2.0)]
        batches = [C.decode_ipc(C.encode_ipc(b)) for b in RP.rows_to_batches(rows, 16)]
        cols = [C.batch_to_columns(b) for b in batches]
        got = [r for b in batches for r in C.batch_to_rows(b, numpy_arrays=True)]
        assert len(got) == 51 and cols[0][0].shape == (16, 6), (len(got), cols[0][0].shape)
        print("pandas" in sys.modules)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
