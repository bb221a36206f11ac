"""TensorFlowOnSpark's ``util`` helpers (``from tfos_nb import util``)."""

from __future__ import annotations

import os
import socket
import subprocess
from typing import Any

from . import gpus
from .net import local_ip_towards

__all__ = ["find_in_path", "get_ip_address", "read_executor_id", "single_node_env", "write_executor_id"]


def single_node_env(num_gpus: int = 1, worker_index: int = -1, nodes: list[str] | None = None) -> list[str]:
    """Prepare this process for a single-node TensorFlow run (e.g. inference in a Spark task).

    Expands the Hadoop ``CLASSPATH`` (``HADOOP_HOME``/``HADOOP_PREFIX``) once, so
    TensorFlow's HDFS file system works, and sets ``CUDA_VISIBLE_DEVICES`` to
    ``num_gpus`` of this host's GPUs (``""`` on a host without GPUs or for
    ``num_gpus=0``); with ``nodes`` (``host:port`` strings) and ``worker_index``,
    nodes on the same host get different GPUs.  Call it before importing
    TensorFlow.  Returns the GPU indices chosen.  Unlike TensorFlowOnSpark it
    does not import TensorFlow (that would initialise CUDA before the choice).
    """
    hadoop = os.environ.get("HADOOP_HOME") or os.environ.get("HADOOP_PREFIX")
    if hadoop and "TFOS_CLASSPATH_UPDATED" not in os.environ:
        exe = os.path.join(hadoop, "bin", "hadoop")
        try:
            extra = subprocess.run([exe, "classpath", "--glob"], capture_output=True, text=True, check=True,
                                   timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            msg = f"cannot expand the Hadoop classpath with {exe} classpath --glob: {exc}"
            raise RuntimeError(msg) from exc
        current = os.environ.get("CLASSPATH", "")
        os.environ["CLASSPATH"] = f"{current}{os.pathsep}{extra}" if current else extra
        os.environ["TFOS_CLASSPATH_UPDATED"] = "1"

    chosen: list[str] = []
    available = gpus.query() if num_gpus > 0 else []
    if available:
        rank, count = 0, 1
        if nodes and 0 <= worker_index < len(nodes):
            mine = nodes[worker_index]
            host = mine.rsplit(":", 1)[0]
            peers = [n for n in nodes if n.rsplit(":", 1)[0] == host]
            rank, count = peers.index(mine), len(peers)
        chosen = [str(g["index"]) for g in gpus.assign(available, rank, count, num_gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    return chosen


def get_ip_address() -> str:
    """This host's address on the network (the one used to reach the outside; no packet is sent)."""
    ip = local_ip_towards("8.8.8.8", 80)
    if ip == "127.0.0.1":
        try:
            return socket.gethostbyname(socket.getfqdn())
        except OSError:
            return ip
    return ip


def find_in_path(path: str, file: str) -> str | bool:
    """The first ``<dir>/file`` that is a file, for ``dir`` in ``path`` (``os.pathsep``-separated); else False."""
    for d in path.split(os.pathsep):
        candidate = os.path.join(d, file)
        if os.path.isfile(candidate):
            return candidate
    return False


def write_executor_id(num: Any) -> None:
    """Write ``num`` to the file ``executor_id`` in the current directory (TensorFlowOnSpark's helper)."""
    with open("executor_id", "w") as f:
        f.write(str(num))


def read_executor_id() -> int:
    """Read back what :func:`write_executor_id` wrote in the current directory."""
    with open("executor_id") as f:
        return int(f.read())
