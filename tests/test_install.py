"""How tfos_nb installs: the TensorBoard proxy server extension is enabled by every install.

Each case installs the package (a wheel, or ``pip install -e``) with ``--no-deps`` into a
fresh virtual environment of its own (its own ``sys.prefix``, so its own
``etc/jupyter``), then asks that environment's ``jupyter server extension list`` what is
enabled.  The dependencies (jupyter_server...) come from this interpreter's site-packages
through a path entry, so nothing is downloaded; this environment's Jupyter configuration
is not seen (another prefix).  ``JUPYTER_CONFIG_DIR`` is an empty directory, so only the
install's own files can enable the extension.
"""

from __future__ import annotations

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

    _run([sys.executable, "-m", "pip", "--python", str(sandbox["python"]), "uninstall", "-y", "-q", "tfos_nb"],
         sandbox["cwd"], sandbox["env"])
    assert not config.exists()
    assert "tfos_nb" not in _extensions(sandbox)


def test_editable_install_enables_the_extension(sandbox):
    _pip(sandbox, "install", "-e", str(sandbox["src"]))
    out = _extensions(sandbox)
    assert ENABLED.search(out) and VALIDATED.search(out), out
    # the editable install runs the sources in place
    where = _run([str(sandbox["python"]), "-c", "import tfos_nb.tbproxy; print(tfos_nb.tbproxy.__file__)"],
                 sandbox["cwd"], sandbox["env"])
    assert where.strip() == str(sandbox["src"] / "tfos_nb" / "tbproxy" / "__init__.py"), where
