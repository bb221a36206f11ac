"""What a node's TensorFlow role means to the driver: which roles are fed, and which a job's end waits for.

The notebook's driver (``cluster.py``, ``start.py``), its lifecycle (``job.py``) and Spark Connect's
coordinator decide with these when a job ended FINISHED; the coordinator runs in a bare process on an
executor, so this module imports nothing but the node states.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import state

FEEDABLE = ("chief", "master", "worker")  # the roles ``train()``/``inference()`` feed


def awaited(nodes: Iterable[Any], node: Any) -> bool:
    """Whether shutdown waits for ``node``'s function to return (``nodes``: the whole cluster).

    With parameter servers and a chief, the chief coordinates and workers only
    serve (``server.join()``): shutdown waits for the chief.  Otherwise it waits
    for every chief/worker.  ps and evaluator nodes are stopped, never awaited.
    """
    roles = {n.job_name for n in nodes}
    if "ps" in roles and roles & {"chief", "master"}:
        return node.job_name in ("chief", "master")
    return node.job_name in FEEDABLE


def trainers_finished(nodes: list[Any]) -> bool:
    """A cluster ends FINISHED when every node shutdown waits for finished."""
    trainers = [n for n in nodes if awaited(nodes, n)]
    return bool(trainers) and all(n.state == state.FINISHED for n in trainers)


def all_finished(nodes: list[Any]) -> bool:
    """Parallel runs end FINISHED when every run finished."""
    return all(n.state == state.FINISHED for n in nodes)
