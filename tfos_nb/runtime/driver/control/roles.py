"""What a node's TensorFlow role means to the driver: which roles are fed, and which a job's end waits for.

The notebook's driver (``cluster.py``, ``start.py``), its lifecycle (``job.py``) and Spark Connect's
coordinator decide with these when a job ended FINISHED; the coordinator runs in a bare process on an
executor, so this module imports nothing but the node states.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from . import state

FEEDABLE = ("chief", "master", "worker")  # the roles ``train()``/``inference()`` feed


def awaited(nodes: Iterable[Any], node: Any) -> bool:
    """Whether shutdown waits for ``node``'s function to return (``nodes``: the whole cluster).

    With parameter servers and a chief, the chief coordinates and workers only
    serve (``server.join()``): shutdown waits for the chief.  Otherwise it waits
    for every chief/worker.  ps and evaluator nodes are stopped, never awaited.
    """
    return node.job_name in _awaited_roles({n.job_name for n in nodes})


def _awaited_roles(roles: set[str]) -> tuple[str, ...]:
    if "ps" in roles and roles & {"chief", "master"}:
        return ("chief", "master")
    return FEEDABLE


def awaited_nodes(nodes: Sequence[Any]) -> list[Any]:
    """The nodes of ``nodes`` (the whole cluster) that shutdown waits for: :func:`awaited` of each, in one pass."""
    roles = _awaited_roles({n.job_name for n in nodes})
    return [n for n in nodes if n.job_name in roles]


def trainers_finished(nodes: list[Any]) -> bool:
    """A cluster ends FINISHED when every node shutdown waits for finished."""
    trainers = awaited_nodes(nodes)
    return bool(trainers) and all(n.state == state.FINISHED for n in trainers)


def all_finished(nodes: list[Any]) -> bool:
    """Parallel runs end FINISHED when every run finished."""
    return all(n.state == state.FINISHED for n in nodes)
