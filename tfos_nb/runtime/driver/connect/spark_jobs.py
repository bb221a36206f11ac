"""Spark jobs on a Spark Connect session: tagged jobs in a thread, and tiny jobs that talk to the coordinator.

A Connect session has no job groups: a job is cancelled through its tag
(``spark.addTag`` is thread-local on the client, so each job runs in a thread
of its own that tags it; ``spark.interruptTag`` cancels it).
:class:`ConnectSparkJob` has :class:`~..sparkjob.SparkJob`'s interface, so
``TFCluster`` watches and cancels both alike.

:func:`ask` runs a one-task job whose task sends one signed control message to
the coordinator (executors can reach it; the notebook cannot) and returns the
reply as a :class:`~...protocol.remote.Answer` (JSON); the notebook parses it and
its body as the request's typed reply body: how it polls snapshots and sends
commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from ...protocol import messages, remote
from ...protocol.bodies import Body
from ...sessions import in_one_task
from ..launch.sparkjob import SparkJob


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


_B = TypeVar("_B", bound=Body)


class CoordinatorError(RuntimeError):
    """The coordinator refused a request, or the asking task could not reach it (``unreachable``)."""

    def __init__(self, error: str, unreachable: bool) -> None:
        super().__init__(error)
        self.unreachable = unreachable


def _asker(meta: dict[str, Any], msg: messages.Message, timeout: float) -> Callable[[], str]:
    secret, cluster_id, control = meta["secret"], meta["cluster_id"], (meta["control"][0], int(meta["control"][1]))

    def call() -> str:
        from tfos_nb.runtime.protocol import (
            messages,
            remote,  # registers Snapshot/Command
        )
        from tfos_nb.runtime.protocol.channel import ControlClient

        client = ControlClient(messages.Codec(bytes.fromhex(secret), cluster_id, "notebook"), control, timeout=timeout)
        try:
            reply = client.request(msg)
            out = remote.Answer(ok=reply.ok, body=reply.body, error=reply.error)
        except (OSError, messages.ProtocolError) as exc:
            out = remote.Answer(ok=False, error=f"{type(exc).__name__}: {exc}", unreachable=True)
        finally:
            client.close()
        return json.dumps(out.to_dict())

    return call


def read_answer(text: str, kind: type[_B]) -> _B:
    """What an asking task returned (an :class:`~...protocol.remote.Answer` as JSON): its body parsed as ``kind``.

    Raises :class:`CoordinatorError` when the coordinator refused the request or could not be reached, and
    ``ProtocolError`` naming the field when the answer or its body is not what it should be.
    """
    answer = remote.Answer.from_dict(json.loads(text))
    if not answer.ok:
        raise CoordinatorError(answer.error or "no reason given", answer.unreachable)
    return kind.from_dict(answer.body)


def ask(spark: Any, meta: dict[str, Any], msg: messages.Message, kind: type[_B], timeout: float = 10.0) -> _B:
    """Send ``msg`` to the coordinator from a one-task Spark job; its reply body, parsed as ``kind`` (the type
    ``msg`` is answered with: see :mod:`~...protocol.remote`).  Raises as :func:`read_answer` does."""
    return read_answer(in_one_task(spark, _asker(meta, msg, timeout)), kind)
