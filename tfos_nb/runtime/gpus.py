"""GPU discovery on a node: Spark's task resources first, else ``nvidia-smi``.

TensorFlowOnSpark took the 6th word of ``nvidia-smi --list-gpus`` as the UUID,
which breaks on model names of more than two words; here the CSV query
interface is parsed with the csv module instead.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from typing import Any

QUERY = "index,uuid,name,memory.total,memory.used"


def _int(x: str) -> int | None:
    try:
        return int(float(x))
    except ValueError:
        return None


def query(indices: list[str] | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """GPUs as dicts (index, uuid, name, memory_total, memory_used in MiB); [] without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    cmd = [exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
    if indices:
        cmd.append("--id=" + ",".join(indices))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for row in csv.reader(io.StringIO(out.stdout)):
        if len(row) < 5:
            continue
        index, uuid, name, total, used = (c.strip() for c in row[:5])
        gpus.append(
            {"index": index, "uuid": uuid, "name": name, "memory_total": _int(total), "memory_used": _int(used)}
        )
    return gpus


def assign(available: list[dict[str, Any]], local_rank: int, local_count: int, num_gpus: int) -> list[dict[str, Any]]:
    """Split a host's GPUs among the nodes on it: node ``local_rank`` of ``local_count``."""
    if not available or num_gpus <= 0:
        return []
    per = max(1, min(num_gpus, len(available) // max(local_count, 1) or 1))
    start = (local_rank * per) % len(available)
    return [available[(start + i) % len(available)] for i in range(per)]
