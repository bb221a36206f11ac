"""Inference results: the node's forms, back as rows (RDD) or onto a schema's columns (DataFrame)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tfos_nb.runtime.batches import columns
from tfos_nb.runtime.batches import results as inference_results


def wire(results):
    """What the feeding task gets: the node's encoding, through Arrow IPC."""
    return columns.decode_ipc(columns.encode_ipc(inference_results.results_to_batch(results)))


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        ([1, 2, 3], [1, 2, 3]),
        (["a", "b"], ["a", "b"]),
        ([(1, "x"), (2, "y")], [(1, "x"), (2, "y")]),
        ([[1, 2], [3, 4]], [[1, 2], [3, 4]]),
        ([{"p": 1, "q": "x"}], [{"p": 1, "q": "x"}]),
        ({"p": np.array([1, 2]), "q": ["x", "y"]}, [{"p": 1, "q": "x"}, {"p": 2, "q": "y"}]),
    ],
)
def test_rdd_results_come_back_as_the_node_returned_them(results, expected):
    rows = inference_results.result_rows(wire(results))
    assert rows == expected
    assert [type(r) for r in rows] == [type(e) for e in expected]


@pytest.mark.parametrize(
    "results",
    [[], np.empty(0), np.empty((0, 3), np.float32), np.array([], dtype=object), {"y": []}, {"y": np.empty((0, 2))}],
    ids=["list", "array", "2-D array", "object array", "dict of lists", "dict of arrays"],
)
def test_empty_results_encode_as_no_rows(results):
    # an empty column went through columns._flat_lists, which read values[0]: IndexError on the node
    assert inference_results.num_rows(results) == 0
    assert wire(results).num_rows == 0 and inference_results.result_rows(wire(results)) == []


def test_numpy_results_stay_numpy():
    # TensorFlowOnSpark's test_inputmode_spark: nodes answer tf.math.square(batch).numpy() for [[x], ...]
    rows = inference_results.result_rows(wire(np.array([[0], [1], [4]], dtype=np.int32)))
    assert all(isinstance(r, np.ndarray) and r.shape == (1,) and r.dtype == np.int32 for r in rows)
    assert int(sum(rows)[0]) == 5
    flat = inference_results.result_rows(wire(np.array([0.5, 1.5], dtype=np.float32)))
    assert all(isinstance(v, np.float32) for v in flat) and sum(flat) == 2.0
    rows = inference_results.result_rows(wire([np.array([1.0, 2.0]), np.array([3.0, 4.0])]))
    assert all(isinstance(r, np.ndarray) for r in rows)
    np.testing.assert_array_equal(np.stack(rows), [[1.0, 2.0], [3.0, 4.0]])


TARGET = pa.schema([("id", pa.int64()), ("y", pa.int64())])


@pytest.mark.parametrize(
    "results",
    [
        [(7, 1), (8, 0)],  # per-row tuples (TensorFlowOnSpark's form)
        [[7, 1], [8, 0]],  # per-row lists
        [{"y": 1, "id": 7}, {"y": 0, "id": 8}],  # per-row dicts, by name
        {"id": [7, 8], "y": np.array([1, 0])},  # columns by name
        np.array([[7, 1], [8, 0]], dtype=np.int32),  # a 2-D array: one column per field
        [np.array([7, 1]), np.array([8, 0])],  # numpy rows
    ],
)
def test_results_map_onto_the_schema(results):
    out = inference_results.to_schema(wire(results), TARGET, "worker:1")
    assert out.schema == TARGET
    assert out.to_pydict() == {"id": [7, 8], "y": [1, 0]}


def test_scalars_and_arrays_map_onto_one_column():
    one = pa.schema([("p", pa.float32())])
    assert inference_results.to_schema(wire([0.5, 1.5]), one, "w").to_pydict() == {"p": [0.5, 1.5]}
    assert inference_results.to_schema(wire(np.array([[0.5], [1.5]])), one, "w").to_pydict() == {"p": [0.5, 1.5]}
    vec = pa.schema([("v", pa.list_(pa.float64()))])
    out = inference_results.to_schema(wire(np.array([[1.0, 2.0], [3.0, 4.0]])), vec, "w")
    assert out.to_pydict() == {"v": [[1.0, 2.0], [3.0, 4.0]]}


@pytest.mark.parametrize(
    ("results", "match"),
    [
        ([(1, 2, 3)], r"worker:1's batch_results\(\) rows have 3 value\(s\) but the schema has 2 column\(s\) "
                      r"\(id int64, y int64\); first row returned: \(1, 2, 3\)"),
        ([{"id": 1}], r"worker:1's batch_results\(\) returned no column 'y' of the schema"),
        ([(1, "cat")], r"column 'y' of the schema is int64, but the node returned 'cat' \(string\)"),
        ([1, 2], r"results have 1 value\(s\) but the schema has 2 column"),
    ],
)
def test_mismatch_is_one_clear_error_naming_node_column_and_value(results, match):
    with pytest.raises(inference_results.ResultSchemaError, match=match):
        inference_results.to_schema(wire(results), TARGET, "worker:1")
