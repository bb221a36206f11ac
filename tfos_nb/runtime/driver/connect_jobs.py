"""Spark jobs on a Spark Connect session: tagged jobs in a thread, and tiny jobs that talk to the coordinator.

A Connect session has no job groups: a job is cancelled through its tag
(``spark.addTag`` is thread-local on the client, so each job runs in a thread
of its own that tags it; ``spark.interruptTag`` cancels it).
:class:`ConnectSparkJob` has :class:`~.sparkjob.SparkJob`'s interface, so
``TFCluster`` watches and cancels both alike.

:func:`ask` runs a one-task job whose task sends one signed control message to
the coordinator (executors can reach it; the notebook cannot) and returns the
reply as JSON: how the notebook polls snapshots and sends commands.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..protocol import messages as m


class ConnectSparkJob:
    """``action()`` run from a thread of its own with the job tag ``group``; ``cancel()`` interrupts the tag."""

    def __init__(self, spark: Any, group: str, description: str, action: Callable[[], Any]) -> None:
        self._spark = spark
        self.group = group
        self._description = description
        self._action = action
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name=f"tfos-job-{group}", daemon=True)

    def start(self) -> ConnectSparkJob:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._spark.addTag(self.group)
            try:
                self._result = self._action()
            finally:
                self._spark.removeTag(self.group)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._error = exc
        finally:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def error(self) -> BaseException | None:
        return self._error

    def cancel(self, join_timeout: float = 10.0) -> None:
        """Interrupt the tag's jobs (once) and wait up to ``join_timeout`` s for the thread to end."""
        if not self._done.is_set() and not self._cancelled:
            self._cancelled = True
            try:
                self._spark.interruptTag(self.group)
            except Exception:  # noqa: BLE001 - the session may be stopping already
                pass
        if join_timeout > 0 and self._thread.is_alive():
            self._thread.join(timeout=join_timeout)


def _asker(meta: dict[str, Any], msg: m.Message, timeout: float) -> Callable[[Iterable[Any]], Iterator[Any]]:
    secret, cluster_id, control = meta["secret"], meta["cluster_id"], (meta["control"][0], int(meta["control"][1]))

    def task(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from tfos_nb.runtime.protocol import messages as mm
        from tfos_nb.runtime.protocol import remote  # noqa: F401 - registers Snapshot/Command
        from tfos_nb.runtime.protocol.channel import ControlClient

        for _ in batches:
            pass
        client = ControlClient(mm.Codec(bytes.fromhex(secret), cluster_id, "notebook"), control, timeout=timeout)
        try:
            reply = client.request(msg)
            out = {"ok": reply.ok, "body": reply.body, "error": reply.error}
        except (OSError, mm.ProtocolError) as exc:
            out = {"ok": False, "unreachable": True, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict({"blob": [json.dumps(out).encode()]},
                                         schema=pa.schema([("blob", pa.binary())]))

    return task


def ask(spark: Any, meta: dict[str, Any], msg: m.Message, timeout: float = 10.0) -> dict[str, Any]:
    """Send ``msg`` to the coordinator from a one-task Spark job; its reply as ``{"ok", "body", "error"}``."""
    rows = spark.range(0, 1, 1, 1).mapInArrow(_asker(meta, msg, timeout), "blob binary").collect()
    out = json.loads(bytes(rows[0]["blob"]))
    if not isinstance(out, dict):
        raise ValueError("the coordinator's answer is not a JSON object")
    return out
