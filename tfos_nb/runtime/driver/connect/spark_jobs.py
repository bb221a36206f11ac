"""Spark jobs on a Spark Connect session: tagged jobs in a thread, and tiny jobs that talk to the coordinator.

A Connect session has no job groups: a job is cancelled through its tag
(``spark.addTag`` is thread-local on the client, so each job runs in a thread
of its own that tags it; ``spark.interruptTag`` cancels it).
:class:`ConnectSparkJob` has :class:`~..sparkjob.SparkJob`'s interface, so
``TFCluster`` watches and cancels both alike.

:func:`ask` runs a one-task job whose task sends one signed control message to
the coordinator (executors can reach it; the notebook cannot) and returns the
reply as JSON: how the notebook polls snapshots and sends commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ...protocol import messages as m
from ...sessions import in_one_task
from ..sparkjob import SparkJob


class ConnectSparkJob(SparkJob):
    """``action()`` run from a thread of its own with the job tag ``group``; ``cancel()`` interrupts the tag."""

    def _labelled(self, action: Callable[[], Any]) -> Any:
        self._sc.addTag(self.group)  # thread-local on the Connect client: only this thread's jobs
        try:
            return action()
        finally:
            self._sc.removeTag(self.group)

    def _cancel_label(self) -> None:
        self._sc.interruptTag(self.group)

    def feeding_tasks(self) -> int | None:
        """Never known: a Connect client has no status tracker (so a node ends its read at the epoch's end)."""
        return None


def _asker(meta: dict[str, Any], msg: m.Message, timeout: float) -> Callable[[], str]:
    secret, cluster_id, control = meta["secret"], meta["cluster_id"], (meta["control"][0], int(meta["control"][1]))

    def call() -> str:
        from tfos_nb.runtime.protocol import messages as mm
        from tfos_nb.runtime.protocol import remote  # noqa: F401 - registers Snapshot/Command
        from tfos_nb.runtime.protocol.channel import ControlClient

        client = ControlClient(mm.Codec(bytes.fromhex(secret), cluster_id, "notebook"), control, timeout=timeout)
        try:
            reply = client.request(msg)
            out = {"ok": reply.ok, "body": reply.body, "error": reply.error}
        except (OSError, mm.ProtocolError) as exc:
            out = {"ok": False, "unreachable": True, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            client.close()
        return json.dumps(out)

    return call


def ask(spark: Any, meta: dict[str, Any], msg: m.Message, timeout: float = 10.0) -> dict[str, Any]:
    """Send ``msg`` to the coordinator from a one-task Spark job; its reply as ``{"ok", "body", "error"}``."""
    out = json.loads(in_one_task(spark, _asker(meta, msg, timeout)))
    if not isinstance(out, dict):
        raise ValueError("the coordinator's answer is not a JSON object")
    return out
