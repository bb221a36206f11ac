"""Control messages from the notebook to a coordinator hosted in the cluster (Spark Connect).

On Spark Connect the notebook cannot be reached from the executors, so the
cluster's control server (the *coordinator*) runs on an executor and the
notebook talks to it through tiny Spark jobs whose task sends one of these
signed messages and returns the reply body (plain JSON) to the notebook.
The task hands the reply back as an :class:`Answer` (the reply's ``ok``, ``body``
and ``error``, or why the coordinator could not be reached).  Each request has a
typed reply body, built by the coordinator and parsed by the notebook (every
field checked, nested ones too; a missing or ill-typed one is a ``ProtocolError``
naming it): a ``Snapshot``'s is a :class:`ClusterSnapshot`; a ``Command``'s is
:class:`EpochOpened` for ``open_epoch``, :class:`Closed` for ``close``, and
:class:`Done` for the others.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from .bodies import Body
from .messages import Message

# Command ops the coordinator obeys (the Controller methods the notebook calls).
OPS = ("open_epoch", "end_epoch", "open_set", "end_set", "request_stop", "request_kill", "cancel", "set_running",
       "reset_feed_errors", "set_feed_tasks", "close")


@dataclasses.dataclass(frozen=True)
class Snapshot(Message):
    """The notebook asks for the cluster's state; ``logs``/``history``: per node, how many it has already."""

    TYPE: ClassVar[str] = "snapshot"
    logs: list[Any] = dataclasses.field(default_factory=list)
    history: list[Any] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Command(Message):
    """The notebook asks the coordinator's Controller for a transition (one of :data:`OPS`).

    Its reply body: :class:`EpochOpened` (``open_epoch``; ``open_set``: the set's version), :class:`Closed` (``close``),
    else :class:`Done`.
    """

    TYPE: ClassVar[str] = "command"
    op: str
    epoch: int = 0
    reason: str = ""
    remaining: int = -1  # open_epoch: epochs its train() call opens after it (-1: a stream's epoch); open_set: passes
    tasks: int = 0  # set_feed_tasks: the epoch's feeding tasks (its DataFrame's partitions)


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


# --------------------------------------------------------------------------
# What an ask task brings back, and a Command's reply bodies (coordinator -> notebook)
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answer(Body):
    """The coordinator's reply as the asking task returns it to the notebook.

    ``ok``/``body``/``error``: the reply's (``body``: the request's reply body, not yet parsed: the
    asker parses it as the type its request answers with); ``unreachable``: the task could not get a
    reply (``error`` says why: no connection, a frame the codec refused).
    """

    ok: bool
    body: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    unreachable: bool = False


@dataclasses.dataclass(frozen=True)
class Done(Body):
    """A :class:`Command`'s reply body when the transition has nothing to tell (every op but two)."""


@dataclasses.dataclass(frozen=True)
class EpochOpened(Body):
    """``open_epoch``'s reply body: the epoch the coordinator's Controller opened."""

    epoch: int


@dataclasses.dataclass(frozen=True)
class Closed(Body):
    """``close``'s reply body: the cluster's final state as the coordinator's Controller settled it."""

    final: str


# --------------------------------------------------------------------------
# A Snapshot's reply body (coordinator -> notebook)
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Report(Body):
    """One ``ctx.report(...)`` of a node, as its history keeps it: the node's clock, its step, its metrics."""

    time: float | None
    step: int | None
    metrics: dict[str, Any]
    times: dict[str, Any] = dataclasses.field(default_factory=dict)  # runtime.step_time's totals ({}: none)


@dataclasses.dataclass(frozen=True)
class NodeSnapshot(Body):
    """One node as the coordinator's state has it.

    ``age``/``still``/``failed``: seconds since its last heartbeat / since it last moved / since it failed (ages,
    not times: the two clocks differ); ``logs``/``reports``: its output lines and reports after those the notebook said it
    has, with ``logs_count``/``history_count`` how many it has with them.
    """

    state: str
    host: str
    port: int
    executor_id: str
    pid: int
    child_pid: int | None
    data_port: int | None
    gpus: list[dict[str, Any]]
    step: int | None
    total_steps: int | None
    total_epochs: int | None
    metrics: dict[str, Any]
    rows_fed: int
    feed_closed: bool
    error: str | None
    exit_code: int | None
    tail: list[str]
    tensorboard: str | None
    tensorboard_error: str | None
    value: Any  # a cluster node's value (plain JSON, from its last heartbeat)
    working_dir: str
    phase: str | None
    rate: float | None
    age: float | None
    still: float | None
    logs: list[str]
    logs_count: int
    reports: list[Report]
    history_count: int
    failed: float | None = None
    where: str = ""  # its main thread's place in the user's code (executor.process.phases.where)
    grant: dict[str, Any] = dataclasses.field(default_factory=dict)  # a state.Grant's fields: what Spark gave its task

    NESTED: ClassVar[dict[str, type[Body]]] = {"reports": Report}


@dataclasses.dataclass(frozen=True)
class StreamCounts(Body):
    """What the coordinator counted of a training stream's micro-batches (:class:`StreamBatch`); ``error`` and
    ``failed_batch``: the first failed micro-batch's."""

    rows: int = 0
    skipped: int = 0
    partitions: int = 0
    batches: int = 0
    error: str | None = None
    failed_batch: int | None = None


@dataclasses.dataclass(frozen=True)
class ClusterSnapshot(Body):
    """A :class:`Snapshot`'s answer: the cluster's state, every node's, and the training streams' counts (by
    epoch, as a string: JSON keys are strings)."""

    state: str
    error: str | None
    feed_epoch: int
    epoch_done: int
    stop_requested: bool
    kill_requested: bool
    nodes: list[NodeSnapshot]
    feed_errors: list[str]
    lost_feeds: int
    streams: dict[str, StreamCounts]
    feeding: list[list[Any]] = dataclasses.field(default_factory=list)  # [feed, gen, partition, node, executor, age s]
    feed_pending: list[int] = dataclasses.field(default_factory=list)  # partitions that reached no node yet

    NESTED: ClassVar[dict[str, type[Body]]] = {"nodes": NodeSnapshot, "streams": StreamCounts}


__all__ = ["OPS", "Answer", "Closed", "ClusterSnapshot", "Command", "Done", "EpochOpened", "NodeSnapshot", "Report",
           "Snapshot", "StreamBatch", "StreamCounts"]
