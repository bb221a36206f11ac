"""Control messages from the notebook to a coordinator hosted in the cluster (Spark Connect).

On Spark Connect the notebook cannot be reached from the executors, so the
cluster's control server (the *coordinator*) runs on an executor and the
notebook talks to it through tiny Spark jobs whose task sends one of these
signed messages and returns the reply body (plain JSON) to the notebook.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from .messages import Message

# Command ops the coordinator obeys (the Controller methods the notebook calls).
OPS = ("open_epoch", "end_epoch", "request_stop", "request_kill", "cancel", "set_running",
       "reset_feed_errors", "close")


@dataclasses.dataclass(frozen=True)
class Snapshot(Message):
    """The notebook asks for the cluster's state; ``logs``/``history``: per node, how many it has already."""

    TYPE: ClassVar[str] = "snapshot"
    logs: list[Any] = dataclasses.field(default_factory=list)
    history: list[Any] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Command(Message):
    """The notebook asks the coordinator's Controller for a transition (one of :data:`OPS`)."""

    TYPE: ClassVar[str] = "command"
    op: str
    epoch: int = 0
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class StreamBatch(Message):
    """A training stream's micro-batch was fed (or failed): sent by its ``foreachBatch`` function.

    On Spark Connect that function runs on the Connect server, away from the
    notebook: the coordinator keeps the stream's counts (per ``epoch``, the
    stream's one epoch) and the notebook reads them from its snapshots.
    ``error``: why the micro-batch failed (the Spark error's text, shortened).
    """

    TYPE: ClassVar[str] = "stream_batch"
    epoch: int
    batch: int
    rows: int = 0
    skipped: int = 0
    partitions: int = 0
    error: str | None = None


__all__ = ["OPS", "Command", "Snapshot", "StreamBatch"]
