"""Writes a fake ``nvidia-smi`` into a directory (for GPU discovery tests on CPU machines)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

GPUS = [
    ("0", "GPU-11111111-aaaa", "NVIDIA A100-SXM4-80GB", "81920", "1234"),
    ("1", "GPU-22222222-bbbb", "NVIDIA A100-SXM4-80GB", "81920", "2345"),
]

SCRIPT = """#!{python}
import sys
gpus = {gpus!r}
ids = None
for a in sys.argv[1:]:
    if a.startswith("--id="):
        ids = a[5:].split(",")
if not any(a.startswith("--query-gpu=") for a in sys.argv[1:]):
    sys.exit(9)
for g in gpus:
    if ids is None or g[0] in ids:
        print(", ".join(g))
"""


def install(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text(SCRIPT.format(python=sys.executable, gpus=GPUS))
    path.chmod(0o755)
    return directory


def path_with(directory: Path) -> str:
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"
