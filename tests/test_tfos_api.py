"""TensorFlowOnSpark's public API on tfos_nb, behaviour by behaviour, where no Spark job is needed.

The ``args`` object (one implementation for every entry point), ``TFNode.hdfs_path``'s table,
``util``, ``pipeline``'s public names and Params, ``dfutil``'s conversions, ``TFModel``'s
reshape of flat arrays.  The Spark side is in test_tfos_parity.py.
"""

from __future__ import annotations

import argparse
import copy
import getpass
import os
import pickle
import types

import cloudpickle
import numpy as np
import pyarrow as pa
import pytest

from tests import fake_nvidia_smi
from tfos_nb import TFNode, dfutil, util
from tfos_nb.pipeline import (
    HasBatchSize,
    HasSteps,
    Namespace,
    TFEstimator,
    TFModel,
    TFParams,
    TFTypeConverters,
    yield_batch,
)
from tfos_nb.pipeline._arrow import to_numpy
from tfos_nb.pipeline._model_runners import TensorInfo


def _train(args, ctx):
    return None


# -- the args object ------------------------------------------------------------------------------------
def test_namespace_reads_every_way_a_tfos_program_does():
    args = Namespace({"batch_size": 32, "lr": 0.1})
    assert args.batch_size == 32 and args["batch_size"] == 32
    assert "lr" in args and "epochs" not in args
    assert args.get("epochs", 5) == 5 and args.get("lr") == 0.1
    assert dict(args) == {"batch_size": 32, "lr": 0.1} == vars(args)
    assert list(args) == ["batch_size", "lr"] and list(args.keys()) == ["batch_size", "lr"]
    assert list(args.items()) == [("batch_size", 32), ("lr", 0.1)] and list(args.values()) == [32, 0.1]
    assert len(args) == 2 and {**args} == {"batch_size": 32, "lr": 0.1}
    args.epochs = 3
    args["steps"] = 10
    assert args["epochs"] == 3 and args.steps == 10 and vars(args)["steps"] == 10
    with pytest.raises(KeyError, match="'nope'.*batch_size, epochs, lr, steps"):
        args["nope"]
    with pytest.raises(AttributeError):
        args.nope  # noqa: B018


def test_namespace_from_every_form_users_pass():
    parsed = argparse.ArgumentParser().parse_args([])
    parsed.batch_size = 8
    assert Namespace(parsed).batch_size == 8 and Namespace(parsed) == parsed
    assert Namespace(types.SimpleNamespace(a=1))["a"] == 1
    assert Namespace(Namespace({"a": 1})) == {"a": 1}
    assert Namespace(a=1, b=2) == Namespace({"a": 1, "b": 2})
    assert Namespace() == {} and Namespace(None) == {}
    with pytest.raises(TypeError, match="dict, an argparse.Namespace or an argv list"):
        Namespace(42)
    with pytest.raises(TypeError, match="keys must be str"):
        Namespace({1: "a"})


def test_namespace_as_in_tensorflowonspark_test_namespace():
    d = {"string": "foo", "integer": 1, "float": 3.14, "array": [1, 2, 3], "map": {"a": 1, "b": 2}}
    for n in (Namespace(d), Namespace(Namespace(d))):
        assert (n.string, n.integer, n.float, n.array, n.map) == ("foo", 1, 3.14, [1, 2, 3], {"a": 1, "b": 2})
        assert "string" in n and "extra" not in n
    argv = ["--foo", "1", "--bar", "test", "--baz", "3.14"]
    n3 = Namespace(argv)
    assert n3.argv == argv and list(n3) == argv and n3 == argv
    assert Namespace({"a": 1}).argv is None


def test_namespace_methods_survive_keys_of_their_name():
    args = Namespace({"keys": 3, "items": [1], "get": "g"})
    assert args["keys"] == 3 and args["items"] == [1] and args["get"] == "g"
    assert dict(args) == {"keys": 3, "items": [1], "get": "g"}
    args.keys = 4  # assigning a method's name stores a key
    assert args["keys"] == 4 and list(args.keys()) == ["keys", "items", "get"]


def test_namespace_copies_and_pickles_as_a_value():
    args = Namespace({"a": [1], "b": 2})
    for clone in (copy.copy(args), pickle.loads(pickle.dumps(args)), cloudpickle.loads(cloudpickle.dumps(args))):
        assert type(clone) is Namespace and clone == args and clone is not args
    c = copy.copy(args)
    c.b = 3
    assert args.b == 2  # TFParams.merge_args_params mutates a copy
    with pytest.raises(TypeError, match="unhashable"):
        hash(args)


def test_magic_args_are_built_with_the_shared_namespace():
    """%%tfos_cluster's --args/--epochs and %%tfos_parallel's grid use this one class (end to end: test_magics)."""
    from tfos_nb.magics import _cell_options, _magics

    assert _magics.Namespace is Namespace and _cell_options.Namespace is Namespace


# -- pipeline: TensorFlowOnSpark's public names, TFParams, constructor forms, every Param -------------
def test_tfparams_merge_as_in_tensorflowonspark_test_tfparams():
    class Foo(TFParams, HasBatchSize, HasSteps):
        def __init__(self, args):
            super().__init__()
            self.args = args

    f = Foo(Namespace({"a": 1, "b": 2})).setBatchSize(10).setSteps(100)
    merged = f.merge_args_params()
    assert merged == Namespace({"a": 1, "b": 2, "batch_size": 10, "steps": 100})
    assert f.args == {"a": 1, "b": 2}  # a copy was merged


def test_type_converter_to_dict():
    assert TFTypeConverters.toDict({"a": "b"}) == {"a": "b"}
    with pytest.raises(TypeError):
        TFTypeConverters.toDict(["a"])


def test_every_tensorflowonspark_pipeline_name_is_there():
    from tfos_nb import pipeline

    names = ["Namespace", "TFParams", "TFTypeConverters", "TFEstimator", "TFModel", "HasBatchSize", "HasClusterSize",
             "HasEpochs", "HasGraceSecs", "HasInputMapping", "HasInputMode", "HasMasterNode", "HasModelDir",
             "HasNumPS", "HasOutputMapping", "HasProtocol", "HasReaders", "HasSteps", "HasTensorboard",
             "HasTFRecordDir", "HasExportDir", "HasSignatureDefKey", "HasTagSet", "single_node_env", "yield_batch"]
    assert [n for n in names if not hasattr(pipeline, n)] == []
    assert set(names) <= set(pipeline.__all__)


ESTIMATOR_SETTERS = {  # TensorFlowOnSpark's TFEstimator: setter -> (value, args key)
    "setBatchSize": (10, "batch_size"), "setClusterSize": (3, "cluster_size"), "setEpochs": (2, "epochs"),
    "setGraceSecs": (5, "grace_secs"), "setInputMapping": ({"c": "t"}, "input_mapping"),
    "setInputMode": (0, "input_mode"), "setMasterNode": ("chief", "master_node"), "setModelDir": ("/m", "model_dir"),
    "setNumPS": (1, "num_ps"), "setDriverPSNodes": (True, "driver_ps_nodes"), "setProtocol": ("grpc", "protocol"),
    "setReaders": (2, "readers"), "setSteps": (7, "steps"), "setTensorboard": (True, "tensorboard"),
    "setTFRecordDir": ("/t", "tfrecord_dir"), "setExportDir": ("/e", "export_dir"),
}
MODEL_SETTERS = {
    "setBatchSize": (10, "batch_size"), "setInputMapping": ({"c": "t"}, "input_mapping"),
    "setOutputMapping": ({"t": "c"}, "output_mapping"), "setModelDir": ("/m", "model_dir"),
    "setExportDir": ("/e", "export_dir"), "setSignatureDefKey": ("sig", "signature_def_key"),
    "setTagSet": ("serve", "tag_set"),
}


@pytest.mark.parametrize(("cls", "setters"), [(TFEstimator, ESTIMATOR_SETTERS), (TFModel, MODEL_SETTERS)],
                         ids=["TFEstimator", "TFModel"])
def test_every_tensorflowonspark_setter_reaches_args(cls, setters):
    stage = cls(_train, {"own": 1}) if cls is TFEstimator else cls({"own": 1})
    for setter, (value, _) in setters.items():
        assert getattr(stage, setter)(value) is stage, setter
        assert getattr(stage, "g" + setter[1:])() == value, setter
    merged = stage.merge_args_params()
    assert merged.own == 1
    assert {key: merged[key] for _, key in setters.values()} == {key: v for v, key in setters.values()}


def test_tfestimator_takes_every_tf_args_form():
    parsed = argparse.Namespace(learning_rate=0.5)
    for given in ({"learning_rate": 0.5}, parsed, Namespace(learning_rate=0.5)):
        args = TFEstimator(_train, given).setBatchSize(16).merged_args()
        assert vars(args)["learning_rate"] == 0.5 and vars(args)["batch_size"] == 16
        assert args["learning_rate"] == args.learning_rate == 0.5 and dict(args)["epochs"] == 1
    argv = ["--learning_rate", "0.5"]
    merged = TFEstimator(_train, argv).merged_args()
    assert merged.argv == argv and merged.batch_size == 100  # train_fn gets the list itself (test_tfos_parity)
    defaults = TFEstimator(_train).merged_args()
    assert defaults.steps == 1000 and defaults.model_dir is None and defaults.tfrecord_dir is None
    assert TFEstimator(_train, {"model_dir": "/mine"}).merged_args().model_dir == "/mine"  # unset Param: kept
    with pytest.raises(TypeError, match="argparse.Namespace or an argv list"):
        TFEstimator(_train, 3)


def test_tfmodel_validates_its_constructor_arguments():
    def build():
        return None

    m = TFModel({"num_gpus": 0})
    assert m.args == {"num_gpus": 0} and m.getModelFn() is None
    assert TFModel(argparse.Namespace(a=1)).args.a == 1 and TFModel(["--a", "1"]).args.argv == ["--a", "1"]
    assert TFModel(build).getModelFn() is build and TFModel(model_fn=build).args == {}
    with pytest.raises(TypeError, match=r"TFModel\(tf_args\) takes a dict"):
        TFModel(42)
    with pytest.raises(TypeError, match="give the model builder once"):
        TFModel(build, model_fn=build)
    with pytest.raises(TypeError, match="model_fn must be a function"):
        TFModel(model_fn="not callable")


def test_yield_batch_as_in_tensorflowonspark():
    rows = [(i, bytearray(b"x"), i * 2) for i in range(5)]
    batches = list(yield_batch(iter(rows), 2, num_tensors=2))
    assert [len(b[0]) for b in batches] == [2, 2, 1]
    assert batches[0] == [[0, 1], ["bytearray(b'x')", "bytearray(b'x')"]]
    assert list(yield_batch(iter([(1,), None, (2,)]), 10)) == [[[1]]]  # None ends the partition


# -- TFModel: a flat array feeds a tensor of higher rank (TensorFlowOnSpark reshapes it) ---------------
def test_flat_array_rows_reshape_to_the_tensor_shape():
    rows = [list(range(i, i + 16)) for i in range(3)]
    col = pa.array(rows, pa.list_(pa.float32()))
    out = to_numpy(col, TensorInfo("conv_input", "float32", (-1, 4, 4, 1)), "pixels")
    assert out.shape == (3, 4, 4, 1) and out.dtype == np.float32
    assert np.array_equal(out[1].reshape(-1), np.arange(1, 17, dtype=np.float32))
    assert to_numpy(col, TensorInfo("t", "float32", (-1, -1, 4)), "pixels").shape == (3, 4, 4)
    with pytest.raises(ValueError, match=r"column 'pixels' has 16 values per row, which do not reshape"):
        to_numpy(col, TensorInfo("t", "float32", (-1, 5, 5, 1)), "pixels")


# -- TFNode.hdfs_path: TensorFlowOnSpark's test_hdfs_path table, for any object ------------------------
def test_hdfs_path_table_for_any_context_object():
    cwd, user = os.getcwd(), getpass.getuser()
    fs = ["file://", "hdfs://", "viewfs://"]
    table = {  # TensorFlowOnSpark's expected results, per default FS
        "hdfs://foo/bar": ["hdfs://foo/bar"] * 3,
        "viewfs://foo/bar": ["viewfs://foo/bar"] * 3,
        "file://foo/bar": ["file://foo/bar"] * 3,
        "/foo/bar": ["file:///foo/bar", "hdfs:///foo/bar", "viewfs:///foo/bar"],
        "foo/bar": [f"file://{cwd}/foo/bar", f"hdfs:///user/{user}/foo/bar", f"viewfs:///user/{user}/foo/bar"],
    }
    for i, default_fs in enumerate(fs):
        ctx = type("MockContext", (), {"defaultFS": default_fs, "working_dir": cwd})
        for path, expected in table.items():
            got = TFNode.hdfs_path(ctx, path)
            if default_fs == "file://" and "://" not in path:
                # tfos_nb's one deliberate difference: a plain local path on a local default FS
                assert "file://" + got == expected[i], (default_fs, path, got)
            else:
                assert got == expected[i], (default_fs, path, got)


def test_hdfs_path_with_a_namenode_and_other_schemes():
    ctx = types.SimpleNamespace(defaultFS="hdfs://nn:8020/", working_dir="/w")
    assert TFNode.hdfs_path(ctx, "/data") == "hdfs://nn:8020/data"
    assert TFNode.hdfs_path(ctx, "data") == f"hdfs://nn:8020/user/{getpass.getuser()}/data"
    assert TFNode.hdfs_path(ctx, "gs://b/x") == "gs://b/x"
    other = types.SimpleNamespace(defaultFS="s3a://bucket", working_dir="/w")
    assert TFNode.hdfs_path(other, "x") == "s3a://bucket/x"


def test_databricks_paths_are_local_paths_tensorflow_opens():
    """dbfs:/x is mounted at /dbfs/x on Databricks nodes; /Volumes/... is a FUSE path: never under the default FS."""
    from tfos_nb.runtime.executor.context import NodeContext

    for default_fs in ("dbfs:/", "hdfs://nn:8020/", "file://", "abfss://c@a.dfs.core.windows.net/"):
        ctx = types.SimpleNamespace(defaultFS=default_fs, working_dir="/w")
        table = {
            "dbfs:/models/m1": "/dbfs/models/m1",
            "dbfs:///models/m1": "/dbfs/models/m1",
            "dbfs:/": "/dbfs/",
            "/dbfs/models/m1": "/dbfs/models/m1",
            "/Volumes/main/default/vol/ckpt": "/Volumes/main/default/vol/ckpt",
            "/Workspace/Users/me/run": "/Workspace/Users/me/run",
        }
        for path, expected in table.items():
            assert TFNode.hdfs_path(ctx, path) == expected, (default_fs, path)
    info = {"job_name": "chief", "task_index": 0, "node": 0, "cluster_spec": {"chief": ["h:1"]}, "default_fs": "dbfs:/"}
    node = NodeContext(info, None, None)
    assert node.absolute_path("dbfs:/export") == node.tf_path("dbfs:/export") == "/dbfs/export"
    assert node.absolute_path("/Volumes/c/s/v/x") == "/Volumes/c/s/v/x"


# -- util ----------------------------------------------------------------------------------------------
def test_util_helpers(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool").write_text("")
    assert util.find_in_path(f"/nonexistent{os.pathsep}{tmp_path / 'bin'}", "tool") == str(tmp_path / "bin" / "tool")
    assert util.find_in_path(str(tmp_path), "tool") is False
    monkeypatch.chdir(tmp_path)
    util.write_executor_id(3)
    assert util.read_executor_id() == 3
    ip = util.get_ip_address()
    assert ip.count(".") == 3 or ":" in ip


def test_single_node_env_picks_gpus_or_none(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unset")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: CPU
    assert util.single_node_env() == [] and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv("PATH", fake_nvidia_smi.path_with(fake_nvidia_smi.install(tmp_path / "bin")))
    assert util.single_node_env(1) == ["0"] and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    nodes = ["10.0.0.1:2222", "10.0.0.1:2223"]
    assert util.single_node_env(1, worker_index=1, nodes=nodes) == ["1"]  # the second node on the host
    assert util.single_node_env(0) == [] and os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_single_node_env_expands_the_hadoop_classpath(tmp_path, monkeypatch):
    hadoop = tmp_path / "hadoop"
    (hadoop / "bin").mkdir(parents=True)
    script = hadoop / "bin" / "hadoop"
    script.write_text("#!/bin/sh\n[ \"$1 $2\" = 'classpath --glob' ] && echo /h/a.jar:/h/b.jar\n")
    script.chmod(0o755)
    monkeypatch.setenv("HADOOP_HOME", str(hadoop))
    monkeypatch.setenv("CLASSPATH", "/own.jar")
    monkeypatch.delenv("TFOS_CLASSPATH_UPDATED", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    util.single_node_env()
    assert os.environ["CLASSPATH"] == f"/own.jar{os.pathsep}/h/a.jar:/h/b.jar"
    util.single_node_env()  # once only
    assert os.environ["CLASSPATH"].count("/h/a.jar") == 1


# -- dfutil conversions --------------------------------------------------------------------------------
def test_to_and_from_tf_example_and_infer_schema():
    import tensorflow as tf
    from pyspark.sql import Row
    from pyspark.sql import types as T

    dtypes = [("label", "bigint"), ("x", "array<float>"), ("name", "string"), ("blob", "binary"), ("w", "double")]
    rows = [Row(label=1, x=[0.5, 1.5], name="a", blob=bytearray(b"\x00\x01"), w=2.0)]
    records = list(dfutil.toTFExample(dtypes)(iter(rows)))
    assert len(records) == 1 and records[0][1] is None and isinstance(records[0][0], bytearray)
    example = tf.train.Example.FromString(bytes(records[0][0]))
    assert list(example.features.feature["x"].float_list.value) == [0.5, 1.5]
    assert dfutil.infer_schema(example, binary_features=["blob"]) == T.StructType([
        T.StructField("blob", T.BinaryType()), T.StructField("label", T.LongType()),
        T.StructField("name", T.StringType()), T.StructField("w", T.DoubleType()),
        T.StructField("x", T.ArrayType(T.DoubleType())),
    ])
    back = dfutil.fromTFExample(iter(records), binary_features=["blob"])
    assert back == [Row(blob=bytearray(b"\x00\x01"), label=1, name="a", w=2.0, x=[0.5, 1.5])]
    assert dfutil.fromTFExample([bytes(records[0][0])])[0].name == "a"  # plain bytes records too
    with pytest.raises(TypeError, match="column 'm' has type map<string,int>"):
        dfutil.toTFExample([("m", "map<string,int>")])


def test_node_context_has_tensorflowonspark_methods_and_fields():
    from tfos_nb.runtime.executor.context import NodeContext

    info = {"job_name": "worker", "task_index": 1, "node": 2, "executor_id": "7",
            "cluster_spec": {"chief": ["h:1"], "worker": ["h:2", "h:3"]}, "default_fs": "hdfs://nn:8020"}
    ctx = NodeContext(info, None, None)
    assert (ctx.executor_id, ctx.worker_num, ctx.spark_executor_id, ctx.num_workers) == (2, 2, "7", 3)
    assert ctx.tmp_socket is None and ctx.release_port() is None  # nothing reserved: a no-op
    assert ctx.absolute_path("/d") == TFNode.hdfs_path(ctx, "/d") == "hdfs://nn:8020/d"
    with pytest.raises(ValueError, match="no RDMA"):
        ctx.start_cluster_server(rdma=True)


def test_request_stop_is_stop_streams_under_tensorflowonspark_s_name():
    """One implementation: ``request_stop`` (TensorFlowOnSpark's reservation client) is ``stop_streams``."""
    from tfos_nb.runtime.driver.cluster import TFCluster

    assert TFCluster.request_stop is TFCluster.stop_streams


def test_tfcluster_members_are_what_a_user_calls():
    """TFCluster's public methods: TensorFlowOnSpark's (train, inference, shutdown, tensorboard_url) and the
    documented extras; the plumbing its streams, start and shutdown use is private."""
    from tfos_nb.runtime.driver.cluster import TFCluster

    tensorflowonspark = {"train", "inference", "shutdown", "tensorboard_url"}
    extras = {"status", "nodes", "logs", "stacks", "close", "cancel", "closed", "train_stream", "inference_stream",
              "streams", "stop_streams", "request_stop"}
    assert {n for n in dir(TFCluster) if not n.startswith("_")} == tensorflowonspark | extras


def test_tfcluster_is_one_class_whose_feeding_and_streams_are_collaborators():
    """No mixins: the Spark jobs that feed the nodes are a BatchFeed's, the streaming feeds a ClusterStreams' (the
    owner each StreamingFeed reports to); both are built from the cluster's job, not from the cluster."""
    import inspect

    from tfos_nb.runtime.driver.cluster import TFCluster
    from tfos_nb.runtime.driver.feeding.batch import BatchFeed
    from tfos_nb.runtime.driver.feeding.streams import ClusterStreams

    assert TFCluster.__bases__ == (object,)
    assert list(inspect.signature(BatchFeed).parameters) == ["job", "meta"]
    assert list(inspect.signature(ClusterStreams).parameters) == ["job", "feed"]


def test_named_queues_read_sets_and_results_have_one_queue():
    """TensorFlowOnSpark's ``DataFeed(mgr, qname_in=...)`` (issue 50) reads a named set the node holds; a hub with no
    sets (outside a fed node) says so; results go back on one queue, 'output', so another is refused."""
    from tfos_nb.runtime.executor.feed.data_feed import DataFeed
    from tfos_nb.runtime.executor.feed.hub import FeedHub

    hub = FeedHub()
    with pytest.raises(ValueError, match=r"DataFeed\(qname_in='validation'\): this feed has no named sets"):
        DataFeed(hub, qname_in="validation")
    with pytest.raises(ValueError, match=r"DataFeed\(qname_out='preds'\): inference results go back on one queue"):
        TFNode.DataFeed(hub, False, "input", "preds")
    assert DataFeed(hub, True, "input", "output").qname_in == "input"  # TensorFlowOnSpark's defaults, spelled out
