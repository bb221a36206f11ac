"""The doctor on executors whose Python is not the driver's: a real ``python -m venv`` without TensorFlow,
Keras or any package (Spark puts pyspark on its path), that imports another tfos_nb — a copy of this one
whose ``__version__`` says 0.0.1-other, on the executors' path only.  Each must be a FAIL naming the
executors and the fix, from a stage that still runs (the probe needs neither TensorFlow nor tfos_nb)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import spark_session
from tfos_nb import TFCluster, doctor
from tfos_nb.runtime.doctor import FAIL, DoctorFailed

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
OTHER_VERSION = "0.0.1-other"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    root = tmp_path_factory.mktemp("executor-python")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    shadow = root / "shadow"
    shutil.copytree(REPO / "tfos_nb", shadow / "tfos_nb", ignore=shutil.ignore_patterns("__pycache__"))
    init = shadow / "tfos_nb" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"', f'__version__ = "{OTHER_VERSION}"', 1))
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "tfos_nb_other.pth").write_text(f"{shadow}\n")
    session = spark_session(2, python=str(python))
    yield session
    session.stop()


def test_executors_without_tensorflow_and_with_another_tfos_nb_fail_by_name(spark, no_leaks):
    report = doctor(spark, nodes=2)
    print("\n" + report.text())
    fails = {c.area: c for c in report.checks if c.status == FAIL}
    assert set(fails) == {"tfos_nb", "tensorflow"}, report.text()
    for c in fails.values():
        assert c.where.startswith("executors 0 (") and ", 1 (" in c.where, c
    assert "No module named 'tensorflow'" in fails["tensorflow"].detail and "/venv/bin/python" in fails["tensorflow"].detail
    assert "pip install tensorflow==" in fails["tensorflow"].fix and "PYSPARK_PYTHON" in fails["tensorflow"].fix
    assert f"tfos_nb {OTHER_VERSION} from " in fails["tfos_nb"].detail and "/shadow/tfos_nb/" in fails["tfos_nb"].detail
    assert "tfos_nb==0.1.0" in fails["tfos_nb"].fix


def test_preflight_stops_the_start_with_both(spark, no_leaks):
    with pytest.raises(DoctorFailed) as info:
        TFCluster.run(spark.sparkContext, print, {}, 2, preflight=True)
    text = str(info.value)
    assert "TensorFlow cannot be imported" in text and f"tfos_nb {OTHER_VERSION}" in text
