"""The launch stage on Spark Connect: barrier task 0 starts the coordinator, every task its node.

There is no SparkContext and the notebook cannot be reached from here, so the
cluster's control server runs in the cluster: task 0 starts it (a detached
``python -m tfos_nb.runtime coordinator`` process), the barrier's ``allGather``
hands its address to every task, and each task starts its node's supervisor
pointed at it.  The task body is a ``mapInArrow`` function (one output row, the
start status as JSON).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..protocol import messages as m
from .launch import executor_id, spawn_detached, start_failed, start_supervisor
from .threads import task_cpus


def start_coordinator(meta: m.LaunchMeta, log_path: str) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    """Start the coordinator process; returns its status (``control``: its address) once it listens."""
    proc, line = spawn_detached("coordinator", meta, log_path,
                                lambda stdin: stdin.write(json.dumps(meta.to_dict()).encode() + b"\n"))
    try:
        status = json.loads(line) if line else {}
    except ValueError:
        status = {}
    if isinstance(status, dict) and status.get("ok") is False and status.get("error"):  # it said why
        status = {"ok": False, "error": f"the coordinator did not start: {status['error']}"}
        proc.wait(timeout=5)
    elif not isinstance(status, dict) or not status.get("ok"):
        status = start_failed(proc, log_path, "the coordinator")
    return status, proc


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """The process outlives this task; reap it when it ends (no zombie in the worker)."""
    threading.Thread(target=proc.wait, name="tfos-reaper", daemon=True).start()


def make_connect_launcher(meta: Mapping[str, Any] | m.LaunchMeta, blob: bytes) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The barrier ``mapInArrow`` body: task 0 starts the coordinator, then every task starts one node."""
    launch_meta = m.LaunchMeta.parse(meta)

    def launch(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import BarrierTaskContext

        for _ in batches:
            pass
        tctx = BarrierTaskContext.get()
        task = tctx.partitionId()
        node = launch_meta.first_node + task
        cdir = os.getcwd()
        coordinator: dict[str, Any] = {}
        if task == 0:
            try:
                coordinator, proc = start_coordinator(launch_meta,
                                                      os.path.join(cdir, f"tfos_nb-{launch_meta.cluster_id}-coordinator.log"))
                if coordinator.get("ok"):
                    _reap(proc)
            except Exception as exc:  # noqa: BLE001 - reported to every task and to the notebook
                coordinator = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        gathered = [json.loads(s) for s in tctx.allGather(json.dumps(coordinator))]
        first = gathered[0]
        if first.get("ok"):
            res = tctx.resources().get("gpu")
            node_meta = dataclasses.replace(
                launch_meta, node=node, attempt=tctx.attemptNumber(), executor_id=executor_id(),
                spark_gpus=list(res.addresses) if res is not None else [], working_dir=cdir,
                task_cpus=task_cpus(tctx), control=list(first["control"]))
            try:
                status, proc = start_supervisor(node_meta, blob,
                                                os.path.join(cdir, f"tfos_nb-{launch_meta.cluster_id}-node{node}.log"))
                _reap(proc)
            except Exception as exc:  # noqa: BLE001 - the notebook decides; Spark must not retry
                status = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        else:
            status = {"ok": False, "error": f"no coordinator: {first.get('error')}"}
        status["node"] = node
        if task == 0:
            status["coordinator"] = coordinator
        yield pa.RecordBatch.from_pydict({"s": [json.dumps(status)]}, schema=pa.schema([("s", pa.string())]))

    return launch
