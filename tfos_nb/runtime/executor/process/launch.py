"""What runs inside Spark tasks: starting node supervisors (feeding is in ``feeder.py``).

These functions are shipped to executors in Spark's task closures.  They
import only the standard library, numpy/pyarrow and this package's light
modules — never TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ... import private
from ...protocol import messages, pipes
from ...protocol.fields import ProtocolError
from ..identity import executor_id
from .threads import task_cpus

LAUNCH_WAIT_S = 120


def _bundled_copy(path: str, dirs: set[str]) -> bool:
    """Whether ``path`` is one of the zips an installed pyspark carries (``<site>/pyspark/python/lib/pyspark.zip``,
    ``py4j-<version>-src.zip``) and ``<site>``, on the path too, holds the same code installed."""
    name = os.path.basename(path)
    pkg = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(path))))  # <site>/pyspark
    site = os.path.dirname(pkg)
    if not name.endswith(".zip") or os.path.basename(pkg) != "pyspark" or site not in dirs:
        return False
    if name == "pyspark.zip":
        return os.path.isfile(os.path.join(pkg, "__init__.py"))
    match = re.fullmatch(r"py4j-(.+)-src\.zip", name)
    return match is not None and os.path.isdir(os.path.join(site, f"py4j-{match.group(1)}.dist-info"))


def import_path(paths: list[str]) -> list[str]:
    """The supervisor's and node's import path: this worker's (``--py-files``, ...), less the zips of an installed
    pyspark, whose installed copy has compiled bytecode.  Spark puts the zips first on a worker's path, and a
    module imported from a zip is compiled from source every time: ``pyspark.sql`` took ~1 s so (0.1 s installed),
    in each node that feeds DataFrame rows or imports pyspark."""
    dirs = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)}
    return [p for p in paths if p and not _bundled_copy(p, dirs)]


def child_env(meta: messages.LaunchMeta) -> dict[str, str]:
    env = dict(os.environ)
    env["TFOS_CLUSTER_ID"] = meta.cluster_id
    env["TFOS_DRIVER_PID"] = str(meta.driver_pid)
    # The supervisor must import what this worker imports (pyspark, --py-files, ...).
    env["PYTHONPATH"] = os.pathsep.join(import_path(sys.path))
    for var in ("PYTHON_WORKER_FACTORY_SECRET", "_PYSPARK_DRIVER_CONN_INFO_PATH"):
        env.pop(var, None)
    return env


def spawn_detached(role: str, meta: messages.LaunchMeta, log_path: str,
                   feed: Callable[[Any], None]) -> tuple[subprocess.Popen[bytes], bytes]:
    """Start ``python -m tfos_nb.runtime ROLE`` in a session of its own, ``feed`` its stdin, read its first line.

    The line is ``b""`` when the process said nothing within ``LAUNCH_WAIT_S``.
    """
    log = private.open_log(log_path)  # 0600, no symlink, ours: the directory may be shared
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfos_nb.runtime", role, meta.cluster_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=child_env(meta),
            start_new_session=True,
        )
    finally:
        os.close(log)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        feed(proc.stdin)
        proc.stdin.close()
    except OSError:
        pass
    ready, _, _ = select.select([proc.stdout], [], [], LAUNCH_WAIT_S)
    line = proc.stdout.readline() if ready else b""
    proc.stdout.close()
    return proc, line


def start_failed(proc: subprocess.Popen[bytes], log_path: str, what: str) -> dict[str, Any]:
    """End a process that did not start; its status names it with the tail of its log."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=5)
    try:
        tail = private.read_tail(log_path, 4000)
    except OSError:
        tail = ""
    return {"ok": False, "error": f"{what} did not start ({proc.returncode}): {tail}"}


def start_supervisor(meta: messages.LaunchMeta, blob: bytes, log_path: str) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    """Start a node supervisor and wait until it registered with the driver."""

    def feed(stdin: Any) -> None:
        pipes.write(stdin, pipes.Launch(meta=meta.to_dict()))
        pipes.write_blob(stdin, blob)

    proc, line = spawn_detached("supervisor", meta, log_path, feed)
    try:
        launched = pipes.decode(line) if line else None
    except pipes.PipeProtocolError as exc:
        sys.stderr.write(f"tfos_nb: the node supervisor's answer: {exc}\n")
        launched = None
    status = launched.status() if isinstance(launched, pipes.Launched) else None
    if not status:
        status = start_failed(proc, log_path, "the node supervisor")
    return status, proc


def start_coordinator(meta: messages.LaunchMeta, log_path: str) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    """Start the coordinator process (Spark Connect); returns its status (``control``: its address) once it listens."""
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


def reap(proc: subprocess.Popen[bytes]) -> None:
    """The process outlives this task; reap it when it ends (no zombie in the worker)."""
    threading.Thread(target=proc.wait, name="tfos-reaper", daemon=True).start()


def coordinator_log(meta: messages.LaunchMeta) -> str:
    return os.path.join(os.getcwd(), f"tfos_nb-{meta.cluster_id}-coordinator.log")


def coordinator_status(meta: messages.LaunchMeta) -> messages.CoordinatorStarted:
    """Start the coordinator from this task and say how it went (never raises: the notebook decides)."""
    try:
        status, proc = start_coordinator(meta, coordinator_log(meta))
        started = messages.CoordinatorStarted.from_dict(status)
        if started.ok:
            reap(proc)
    except Exception as exc:  # noqa: BLE001 - reported to every task and to the notebook
        started = messages.CoordinatorStarted(error=f"{type(exc).__name__}: {exc}")
    return started


LAUNCH_SCHEMA = "s string"  # one row per launch task: its node's start status as JSON


def make_launcher(meta: Mapping[str, Any] | messages.LaunchMeta, blob: bytes) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The launch stage's task body, on either backend: a barrier ``mapInArrow`` function, one node per task.

    With a ``coordinator`` section in the meta (Spark Connect, where executors cannot reach the
    notebook), task 0 first starts the cluster's coordinator and the barrier's ``allGather`` hands
    its address to every task; otherwise the nodes register with the driver's control server
    (``meta.control``).  Each task yields one row, its node's start status as JSON (``s``);
    task 0's carries the coordinator's status too.
    """
    launch_meta = messages.LaunchMeta.parse(meta)

    def launch(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import BarrierTaskContext, TaskContext

        for _ in batches:
            pass
        tctx: Any = BarrierTaskContext.get() if launch_meta.barrier else TaskContext.get()
        task = tctx.partitionId()
        node = launch_meta.nodes[task] if launch_meta.nodes else launch_meta.first_node + task
        control: list[Any] = list(launch_meta.control)
        coordinator: messages.CoordinatorStarted | None = None
        why = "no control server address"
        if launch_meta.coordinator:
            mine = coordinator_status(launch_meta) if task == 0 else messages.CoordinatorStarted()
            # a stage that is no barrier one has a single task here (launching.Launch): its own status is all
            gathered = tctx.allGather(json.dumps(mine.to_dict())) if launch_meta.barrier else [json.dumps(mine.to_dict())]
            coordinator = mine if task == 0 else None
            try:
                first = messages.CoordinatorStarted.from_dict(json.loads(gathered[0]))
                control, why = (first.address if first.ok else []), f"no coordinator: {first.error}"
            except (ProtocolError, ValueError) as exc:
                control, why = [], f"no coordinator: {exc}"
        if not control:
            status: dict[str, Any] = {"ok": False, "error": why}
        else:
            granted = {name: list(res.addresses) for name, res in tctx.resources().items()}
            node_meta = dataclasses.replace(
                launch_meta, node=node, attempt=tctx.attemptNumber(), executor_id=executor_id(),
                spark_gpus=granted.get("gpu", []), spark_resources=granted, working_dir=os.getcwd(),
                task_cpus=task_cpus(tctx), control=control)
            log_path = os.path.join(os.getcwd(), f"tfos_nb-{launch_meta.cluster_id}-node{node}.log")
            try:
                status, proc = start_supervisor(node_meta, blob, log_path)
                reap(proc)
            except Exception as exc:  # noqa: BLE001 - the driver decides; Spark must not retry
                status = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        row = messages.LaunchStatus.from_dict({**status, "node": node})
        row = dataclasses.replace(row, coordinator=coordinator)
        yield pa.RecordBatch.from_pydict({"s": [json.dumps(row.to_dict())]}, schema=pa.schema([("s", pa.string())]))

    return launch
