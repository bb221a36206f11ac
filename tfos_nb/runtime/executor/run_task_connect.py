"""Parallel runs' Spark tasks on Spark Connect: ``mapInArrow`` bodies.

A one-task job starts the runs' coordinator (their control server, on an
executor, as a cluster's launch task 0 does: see :mod:`.launch_connect`).
Then each run is one task of a ``mapInArrow`` stage (barrier or not) whose body
is :func:`~.run_task.make_run_task`'s: the same :class:`~.run_task.RunOwner`,
pointed at the coordinator.  A run's outcome is one Arrow row (its index, its
status as JSON, its pickled value as bytes) that comes back through Spark's
own ``collect()``, as the classic path's tuple does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..protocol import messages as m
from .launch_connect import _reap, start_coordinator
from .run_task import make_run_task

RESULT_SCHEMA = "i int, s string, v binary"  # run index, status (JSON), cloudpickled value (or null)


def make_coordinator_starter(meta: Mapping[str, Any] | m.LaunchMeta) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The one-task ``mapInArrow`` body that starts the coordinator; one row, its status as JSON (``s``)."""
    launch_meta = m.LaunchMeta.parse(meta)

    def start(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:
            pass
        log_path = os.path.join(os.getcwd(), f"tfos_nb-{launch_meta.cluster_id}-coordinator.log")
        try:
            status, proc = start_coordinator(launch_meta, log_path)
            if status.get("ok"):
                _reap(proc)
        except Exception as exc:  # noqa: BLE001 - reported to the notebook
            status = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        yield pa.RecordBatch.from_pydict({"s": [json.dumps(status)]}, schema=pa.schema([("s", pa.string())]))

    return start


def make_connect_run_task(meta: Mapping[str, Any] | m.LaunchMeta, blob: bytes, barrier: bool) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The runs' ``mapInArrow`` body: partition ``i`` runs run ``i``; one row ``(i, status, value)``."""
    body = make_run_task(meta, blob, barrier)

    def task(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:
            pass
        schema = pa.schema([("i", pa.int32()), ("s", pa.string()), ("v", pa.binary())])
        for index, status, value in body(iter(())):
            yield pa.RecordBatch.from_pydict({"i": [index], "s": [status], "v": [value]}, schema=schema)

    return task
