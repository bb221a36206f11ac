"""tf-keras is not a requirement of the package (pip paired the newest with an upgraded TensorFlow): a node asked for
``keras="tf_keras"`` without it, or with one for another TensorFlow minor, fails before its function with the fix
(issue 45, item 2).

Installed distributions are what ``importlib.metadata`` finds on the path: the cases put real ``.dist-info``
records of the versions they need first on a fresh interpreter's path (``-S``: without the venv's own).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import cloudpickle
import pytest

from tests.conftest import spark_fixture, start_cluster
from tfos_nb import TFCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[1]


def dist(root: Path, name: str, version: str) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def problem(tmp_path: Path, dists: dict[str, str], legacy: bool = True, first: tuple[Path, ...] = (),
            code: str = "print(keras_flavour.problem())") -> str:
    """What a fresh process with ``dists`` installed (after ``first`` on its path) prints running ``code``."""
    root = tmp_path / "site"
    for name, version in dists.items():
        dist(root, name, version)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(map(str, (*first, root, REPO)))}
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    code = "from tfos_nb.runtime.executor.keras_node import flavour as keras_flavour\n" + code
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    return out.stdout.strip()


def test_no_tf_keras_for_tensorflow_2_16_on_names_the_release_to_install(tmp_path):
    assert problem(tmp_path, {"tensorflow": "2.17.1"}) == (
        "keras='tf_keras' (the default) needs the tf-keras package for TensorFlow 2.17.1: pip install "
        "'tf-keras~=2.17.0' where the nodes run, or start the job with keras='keras3'")


def test_a_tf_keras_for_another_minor_is_named(tmp_path):
    assert problem(tmp_path, {"tensorflow": "2.17.1", "tf_keras": "2.21.0"}) == (
        "tf-keras 2.21.0 is for TensorFlow 2.21, and this node has TensorFlow 2.17.1: pip install "
        "'tf-keras~=2.17.0' where the nodes run, or start the job with keras='keras3'")


@pytest.mark.parametrize(("dists", "legacy"), [
    ({"tensorflow": "2.17.1", "tf_keras": "2.17.0"}, True),  # the pair
    ({"tensorflow": "2.15.1"}, True),  # tf.keras is TensorFlow's own Keras 2 before 2.16
    ({"tensorflow": "2.21.0"}, False),  # keras="keras3": tf_keras is not asked for
    ({"tensorflow-cpu": "2.21.0", "tf_keras": "2.21.0"}, True),  # TensorFlow's CPU wheel counts as TensorFlow
], ids=["matched", "before-2.16", "keras3", "tensorflow-cpu"])
def test_nothing_to_say(tmp_path, dists, legacy):
    assert problem(tmp_path, dists, legacy) == "None"


def test_the_check_reads_no_zip_archive_on_the_path(tmp_path):
    """Spark puts ``pyspark.zip`` and py4j's zip on every worker's path, so on each node's start: the versions are
    read from the folders on the path alone (no package installs into a zip), not by listing every archive."""
    archive = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i in range(50):
            z.writestr(f"pyspark/m{i}.py", "")
    watch = ("import zipfile\n"
             "opened = []\n"
             "real = zipfile.ZipFile.__init__\n"
             "def watched(self, file, *a, **kw):\n"
             "    opened.append(str(file)); real(self, file, *a, **kw)\n"
             "zipfile.ZipFile.__init__ = watched\n"
             "print(keras_flavour.problem(), [f for f in opened if f.endswith('pyspark.zip')])")
    out = problem(tmp_path, {"tensorflow": "2.17.1", "tf_keras": "2.17.0"}, first=(archive,), code=watch)
    assert out == "None []", out


spark = spark_fixture(2)


def uses_tf_keras(args, ctx):
    import tensorflow as tf

    tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])


@pytest.mark.slow
def test_a_node_with_a_tf_keras_for_another_tensorflow_fails_before_its_function(sc, tmp_path, no_leaks):
    import tensorflow as tf

    shadow = tmp_path / "shadow"
    dist(shadow, "tf_keras", "2.15.0")  # first on the nodes' path: what importlib.metadata reports there
    with pytest.raises(TFCluster.TFClusterError) as info:  # at the start or at the shutdown: whichever sees it
        cluster = start_cluster(sc, uses_tf_keras, {}, 1, master_node="chief",
                                input_mode=TFCluster.InputMode.TENSORFLOW, env={"PYTHONPATH": str(shadow)})
        cluster.shutdown(timeout=120)
    minor = ".".join(tf.__version__.split(".")[:2])
    assert f"tf-keras 2.15.0 is for TensorFlow 2.15, and this node has TensorFlow {tf.__version__}: pip install " \
           f"'tf-keras~={minor}.0' where the nodes run, or start the job with keras='keras3'" in str(info.value), info.value
    assert str(info.value).startswith("chief:0 failed on host "), info.value
