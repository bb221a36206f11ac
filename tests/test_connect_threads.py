"""TensorFlow's thread pools on Spark Connect: a cluster's nodes get their task's cores, as on a classic session."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest

from tests.conftest import connect_fixture
from tfos_nb import TFCluster

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# One executor of 2 cores whose tasks take both (spark.task.cpus=2); no thread settings in executorEnv.
spark = connect_fixture(1, conf={"spark.task.cpus": "2", "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2"},
                        cores=2, node_env=False)


def report_threads(args, ctx):
    return {name: os.environ.get(name) for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}


def test_a_connect_node_gets_the_cores_of_its_task(spark):
    # was: the Connect launch passed no task_cpus, so every node got 1 thread whatever spark.task.cpus said
    cluster = TFCluster.run(spark, report_threads, {}, 1)
    cluster.shutdown(timeout=120)
    assert cluster.state.values() == {"worker:0": {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "3"}}
