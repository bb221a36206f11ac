"""The typed bodies of the driver's replies, the kinds of feeding errors, and the launch metadata.

A :class:`~tfos_nb.runtime.protocol.messages.Reply` carries one body per request: the driver builds
them, peers read them with ``Body.from_dict(reply.body)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .fields import ProtocolError, from_dict

# Kinds of feeding errors (FeedRelease.error_kind).
ERROR_LOST_CONNECTION = "lost_connection"  # the node (or its supervisor) probably died
ERROR_OTHER = "other"
_LOST_CONNECTION = ("ConnectionResetError", "BrokenPipeError", "ConnectionAbortedError", "ConnectionRefusedError",
                    "DataPlaneError", "EOFError", "IncompleteRead")


def error_kind(exc: BaseException) -> str:
    """What a feeding task's error says about its node: ``ERROR_LOST_CONNECTION`` or ``ERROR_OTHER``."""
    names = {t.__name__ for t in type(exc).__mro__}
    return ERROR_LOST_CONNECTION if names & set(_LOST_CONNECTION) else ERROR_OTHER


# --------------------------------------------------------------------------
# Reply bodies (driver -> peer) and the launch metadata
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Body:
    """A typed body: ``to_dict()`` for the wire, ``from_dict()`` checks the types (ProtocolError)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ProtocolError(f"{cls.__name__}: body is not an object")
        return from_dict(cls, data)


@dataclasses.dataclass(frozen=True)
class Retry(Body):
    """Not yet: ask again in ``retry`` seconds (AwaitSpec before the cluster formed, FeedAssign with no free node)."""

    retry: float = 0.1


@dataclasses.dataclass(frozen=True)
class NodeSpec(Body):
    """AwaitSpec's answer once every node registered: the node's part in the cluster."""

    cluster_spec: dict[str, list[str]]
    tf_config: dict[str, Any]
    gpus: list[dict[str, Any]]
    host_has_gpus: bool
    feed: bool
    tensorboard: bool
    log_dir: str


@dataclasses.dataclass(frozen=True)
class BeatCommand(Body):
    """A heartbeat's answer: the last epoch fed in full, the epochs whose partitions all went to nodes (as
    ``[epoch, partitions sent to this node]``), whether to stop (gracefully) or be killed, and the last stack
    dump asked for (``stacks``: a growing id; the node answers with ``Heartbeat.stacks``)."""

    epoch_done: int = 0
    stop: bool = False
    kill: bool = False
    grace: float = 2.0
    epochs_assigned: list[list[int]] = dataclasses.field(default_factory=list)
    stacks: int = 0


@dataclasses.dataclass(frozen=True)
class FeedAssignment(Body):
    """FeedAssign's answer: the node that takes the partition, or ``skip`` (no node reads data any more)."""

    node: int = -1
    label: str = ""
    host: str = ""
    port: int = 0
    skip: bool = False


@dataclasses.dataclass(frozen=True)
class FeedVerdict(Body):
    """FeedCheck's answer: ``done`` | ``failed`` (with ``error``) | ``stopped`` | ``reading``."""

    verdict: str = "reading"
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class FeedReleased(Body):
    """FeedRelease's answer: the cluster's error when it failed meanwhile."""

    cluster_error: str | None = None


@dataclasses.dataclass(frozen=True)
class LaunchMeta(Body):
    """What the driver gives every Spark task that starts a cluster node or a parallel run.

    It travels inside the task's closure (with the secret, which never crosses our sockets).
    Cluster launches use ``roles``/``first_node``/``reservation_timeout``/``release_port``,
    parallel runs ``num_runs``/``num_gpus``.
    """

    cluster_id: str
    secret: str  # hex
    control: list[Any]  # [host, port]
    hb_interval: float
    driver_timeout: float
    env: dict[str, str]
    keras: str
    default_fs: str
    driver_pid: int
    roles: list[list[Any]] = dataclasses.field(default_factory=list)  # [[job_name, task_index], ...]
    first_node: int = 0
    reservation_timeout: float = 600.0
    release_port: bool = True
    num_runs: int = 0
    num_gpus: int = 1
