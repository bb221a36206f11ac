"""How tfos_nb installs: the TensorBoard proxy server extension is enabled by every install, and a wheel's
install runs a training cell (the kernel and the nodes import the installed package, not the checkout).

Each case installs the package (a wheel, or ``pip install -e``) with ``--no-deps`` into a
fresh virtual environment of its own (its own ``sys.prefix``, so its own
``etc/jupyter``), then asks that environment's ``jupyter server extension list`` what is
enabled.  The dependencies (jupyter_server...) come from this interpreter's site-packages
through a path entry, so nothing is downloaded; this environment's Jupyter configuration
is not seen (another prefix).  ``JUPYTER_CONFIG_DIR`` is an empty directory, so only the
install's own files can enable the extension.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import tfos_nb

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["setup.py", "pyproject.toml", "README.md", "LICENSE", "jupyter-config", "tfos_nb"]
ENABLED = re.compile(r"tfos_nb\.tbproxy\s+enabled")
VALIDATED = re.compile(r"tfos_nb\.tbproxy\s+\S*\s*OK")


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (cmd, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout + proc.stderr


@pytest.fixture
def sandbox(tmp_path: Path) -> dict:
    """A copy of the sources, a fresh venv seeing this one's packages, and a clean environment."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                           text=True).strip())
    # a path entry, not a site dir: the shared .pth files (this checkout's editable install) are not run
    (purelib / "zz_shared_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (tmp_path / "jupyter-config").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON"))}
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "jupyter-config")  # empty: no user-level config
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    return {"src": src, "venv": venv, "python": python, "env": env, "cwd": tmp_path}


def _pip(box: dict, *args: str) -> str:
    return _run([sys.executable, "-m", "pip", "--python", str(box["python"]), *args,
                 "--no-deps", "--no-build-isolation", "--no-index", "-q"], box["cwd"], box["env"])


def _extensions(box: dict) -> str:
    out = _run([str(box["python"]), "-m", "jupyter_server", "extension", "list"], box["cwd"], box["env"])
    return re.sub(r"\x1b\[[0-9;]*m", "", out)  # colours


def test_wheel_install_enables_the_extension_and_uninstall_removes_it(sandbox):
    out = _extensions(sandbox)
    assert "tfos_nb" not in out, out  # nothing enables it before the install
    dist = sandbox["cwd"] / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist),
          str(sandbox["src"])], sandbox["cwd"], sandbox["env"])
    (wheel,) = dist.glob("tfos_nb-*.whl")
    assert wheel.name.startswith(f"tfos_nb-{tfos_nb.__version__}-"), wheel.name  # the version in one place
    names = zipfile.ZipFile(wheel).namelist()
    assert f"tfos_nb-{tfos_nb.__version__}.data/data/etc/jupyter/jupyter_server_config.d/tfos_nb.json" in names, names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), names

    _pip(sandbox, "install", str(wheel))
    config = sandbox["venv"] / "etc" / "jupyter" / "jupyter_server_config.d" / "tfos_nb.json"
    assert config.is_file()
    out = _extensions(sandbox)
    assert ENABLED.search(out) and VALIDATED.search(out), out  # enabled, and the module imports

    # a training cell in a kernel of that environment: the kernel and both nodes run the wheel's tfos_nb
    nb = sandbox["cwd"] / "notebooks" / "wheel.ipynb"
    nb.parent.mkdir()
    nb.write_text(json.dumps(_notebook(WHEEL_CELLS)))
    out = _run([str(sandbox["python"]), str(REPO / "scripts" / "run_notebook.py"), str(nb)], sandbox["cwd"],
               sandbox["env"])
    assert out.startswith("executed notebook: "), out
    ran = json.loads((sandbox["cwd"] / "build" / "wheel.ipynb").read_text())
    texts = [o.get("text", "") for c in ran["cells"] for o in c.get("outputs", [])]
    text = "".join("".join(t) if isinstance(t, list) else t for t in texts)  # nbformat keeps a stream as lines
    site = str(sandbox["venv"])
    assert re.search(rf"^kernel tfos_nb {re.escape(site)}/lib/python[\d.]+/site-packages/tfos_nb/__init__.py$", text,
                     re.M), text
    nodes = re.findall(rf"^\[(\w+:\d)\] node tfos_nb {re.escape(site)}/lib/python[\d.]+/site-packages/tfos_nb/", text,
                       re.M)
    assert sorted(nodes) == ["chief:0", "worker:0"], text
    assert float(re.search(r"^\[chief:0\] accuracy: ([\d.]+)$", text, re.M).group(1)) > 0.5, text  # it trained

    _run([sys.executable, "-m", "pip", "--python", str(sandbox["python"]), "uninstall", "-y", "-q", "tfos_nb"],
         sandbox["cwd"], sandbox["env"])
    assert not config.exists()
    assert "tfos_nb" not in _extensions(sandbox)


WHEEL_CELLS = [
    "%load_ext tfos_nb\nimport tfos_nb\nprint('kernel tfos_nb', tfos_nb.__file__)",
    "%%tfos_cluster --workers 2 --name wheel\nimport tfos_nb\nimport tensorflow as tf\n"
    "from tfos_nb.examples.digits import build_model, load_digits_arrays\n"
    "print('node tfos_nb', tfos_nb.__file__, flush=True)\n"
    "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
    "with strategy.scope():\n    model = build_model(learning_rate=0.01)\n"
    "x, y, x_test, y_test = load_digits_arrays()\n"
    "model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=2, verbose=0)\n"
    "accuracy = model.evaluate(x_test, y_test, verbose=0)[1]  # every worker: evaluate is a collective\n"
    "if ctx.is_chief:\n    print('accuracy: %.3f' % accuracy)",
]


def _notebook(cells: list[str]) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": c}
                      for c in cells],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_editable_install_enables_the_extension(sandbox):
    _pip(sandbox, "install", "-e", str(sandbox["src"]))
    out = _extensions(sandbox)
    assert ENABLED.search(out) and VALIDATED.search(out), out
    # the editable install runs the sources in place
    where = _run([str(sandbox["python"]), "-c", "import tfos_nb.tbproxy; print(tfos_nb.tbproxy.__file__)"],
                 sandbox["cwd"], sandbox["env"])
    assert where.strip() == str(sandbox["src"] / "tfos_nb" / "tbproxy" / "__init__.py"), where


def test_installing_the_wheel_leaves_the_installed_tensorflow_and_spark_alone(tmp_path):
    """``pip install tfos_nb[spark,notebook,examples]`` where TensorFlow, tf-keras and pyspark are installed changes none
    of them: TensorFlow 2.21 / pyspark 4.3 in the suite, TensorFlow 2.16.1 / pyspark 3.5.0 in the floor tier
    (scripts/check_floor.sh runs this test there). pip resolves the wheel against this environment and reports what
    it would install (``--dry-run --report``); before tf-keras left the requirements it upgraded TensorFlow."""
    from importlib.metadata import version

    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(REPO)],
         tmp_path, dict(os.environ))
    (wheel,) = dist.glob("tfos_nb-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        metadata = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = re.findall(r"^Requires-Dist: ([\w.-]+)", metadata, re.M)
    # tf-keras X.Y requires tensorflow X.Y: a requirement on it, whatever its range, let pip upgrade TensorFlow
    assert "tensorflow" in requires and not {"tf-keras", "tf_keras", "keras"} & set(requires), requires
    report = tmp_path / "report.json"
    _run([sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report),
          f"tfos_nb[spark,notebook,examples] @ {wheel.as_uri()}"], tmp_path, dict(os.environ))
    planned = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert planned.pop("tfos-nb") == tfos_nb.__version__, planned
    kept = {name: version(name) for name in ("tensorflow", "tf-keras", "tensorboard", "pyspark", "numpy", "pandas")}
    assert not set(planned) & set(kept), (planned, kept)  # nothing of the stack is installed over what is there
