"""The typed bodies of the driver's replies and of a node's heartbeat, the kinds of feeding errors, and the launch
metadata.

A :class:`.messages.Reply` carries one body per request: the driver builds
them, peers read them with ``Body.from_dict(reply.body)``.  A :class:`.messages.Heartbeat` carries
:class:`BeatReport`, :class:`BeatFeed`, :class:`BeatPhase` and :class:`BeatStacks`: the node builds them, the
codec reads them when it decodes the beat.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from .fields import ProtocolError, from_dict, to_plain_dict

_B = TypeVar("_B", bound="Body")

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
    """A typed body: ``to_dict()`` for the wire, ``from_dict()`` checks the types (ProtocolError).

    ``NESTED``: the fields whose list items (or dict values) are bodies themselves, by field name: they
    are parsed too, and an error names the field and the item (``ClusterSnapshot.nodes[1]: ...``).
    ``SPARSE``: ``to_dict()`` leaves out each field at its default (the heartbeat's bodies: a beat says its news).
    """

    NESTED: ClassVar[dict[str, type[Body]]] = {}
    SPARSE: ClassVar[bool] = False

    def to_dict(self) -> dict[str, Any]:
        return to_plain_dict(self)

    @classmethod
    def from_dict(cls: type[_B], data: Any) -> _B:
        if not isinstance(data, dict):
            raise ProtocolError(f"{cls.__name__}: body is not an object")
        body = from_dict(cls, data)
        nested: dict[str, Any] = {}
        for name, item in cls.NESTED.items():
            value = getattr(body, name)
            keys = range(len(value)) if isinstance(value, list) else list(value)
            parsed = {}
            for key in keys:
                try:
                    parsed[key] = item.from_dict(value[key])
                except ProtocolError as exc:
                    raise ProtocolError(f"{cls.__name__}.{name}[{key!r}]: {exc}") from None
            nested[name] = list(parsed.values()) if isinstance(value, list) else parsed
        return dataclasses.replace(body, **nested) if nested else body


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
    ``[epoch, partitions sent to this node]``), the epochs the running ``train()`` feeds (``feed_plan``:
    ``[first, last]``, empty for none), whether to stop (gracefully) or be killed, and the last stack
    dump asked for (``stacks``: a growing id; the node answers with ``Heartbeat.stacks``)."""

    epoch_done: int = 0
    stop: bool = False
    kill: bool = False
    grace: float = 2.0
    epochs_assigned: list[list[int]] = dataclasses.field(default_factory=list)
    stacks: int = 0
    feed_plan: list[int] = dataclasses.field(default_factory=list)
    #: the fed data's shape while ``feed_plan`` is set, until the node confirms it: ``{"id", "schema": Arrow IPC
    #: schema as hex, "shapes": each column's value shape}`` (a node given no row builds its dataset from it)
    feed_sample: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the named sets (sets fed once: a validation set) this node holds a share of: ``{name: {"version", "parts"
    #: (its partitions; None while the set is fed), "passes", "sample"}}`` (see ``executor/feed/named_sets.py``)
    feed_sets: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class FeedAssignment(Body):
    """FeedAssign's answer: the node that takes the partition, or ``skip`` (no node reads data any more);
    ``after``: in deterministic mode, the partition the node reads before this one (-1: none)."""

    node: int = -1
    label: str = ""
    host: str = ""
    port: int = 0
    skip: bool = False
    after: int = -1
    rows: int = -1  # the partition's rows as the train() call counted them (-1: not counted)


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
class CoordinatorMeta(Body):
    """:class:`LaunchMeta`'s ``coordinator`` section (Spark Connect): how the coordinator hosts the control plane.

    The notebook builds it from its own (local) controller's settings, so the coordinator's
    controller is configured alike; the coordinator reads it with ``from_dict``.  ``kind``:
    ``"cluster"`` (a TFCluster's nodes) or ``"parallel"`` (TFParallel's runs); ``kernel_timeout``:
    seconds without news of the notebook before the coordinator stops everything; ``bind``: the
    address to listen on (None: the executor's own).
    """

    name: str
    input_mode_spark: bool
    tensorboard: bool
    log_dir: str | None
    num_gpus: int
    heartbeat_timeout: float
    kernel_timeout: float
    bind: str | None = None
    kind: str = "cluster"
    ordered_feed: bool = False  # deterministic mode's fixed feed


@dataclasses.dataclass(frozen=True)
class CoordinatorStarted(Body):
    """A coordinator's start (Spark Connect), as the task that started it hands it to the notebook: where it
    listens (``control``: ``[host, port]``, its ``pid``), or why it did not start (``error``)."""

    ok: bool = False
    control: list[Any] = dataclasses.field(default_factory=list)
    pid: int | None = None
    error: str | None = None

    @property
    def address(self) -> list[Any]:
        """``control``, checked: a started coordinator names a host and a port."""
        if len(self.control) != 2:
            raise ProtocolError(f"CoordinatorStarted.control: expected [host, port], got {self.control!r}")
        return list(self.control)


@dataclasses.dataclass(frozen=True)
class LaunchStatus(Body):
    """A launch task's row for the driver: its node's supervisor registered (``pid``, ``host``, ``port``), or why
    not (``error``); task 0's also carries the coordinator's start when the launch started one (Spark Connect)."""

    node: int
    ok: bool = False
    error: str | None = None
    pid: int | None = None
    host: str | None = None
    port: int | None = None
    coordinator: CoordinatorStarted | None = None

    @classmethod
    def from_dict(cls, data: Any) -> LaunchStatus:
        if not isinstance(data, dict):
            raise ProtocolError(f"{cls.__name__}: body is not an object")
        rest = {k: v for k, v in data.items() if k != "coordinator"}
        status = from_dict(cls, rest)
        if data.get("coordinator") is None:
            return status
        try:
            coordinator = CoordinatorStarted.from_dict(data["coordinator"])
        except ProtocolError as exc:
            raise ProtocolError(f"{cls.__name__}.coordinator: {exc}") from None
        return dataclasses.replace(status, coordinator=coordinator)


@dataclasses.dataclass(frozen=True)
class LaunchMeta(Body):
    """What the driver gives every Spark task that starts a cluster node or a parallel run.

    It travels inside the task's closure (with the secret, which never crosses our sockets) as
    the dict ``to_dict()`` makes; every receiver on the executor side reads it through
    :meth:`parse` (one default per field, here).  Cluster launches use
    ``roles``/``first_node``/``reservation_timeout``/``release_port``, parallel runs
    ``num_runs``/``num_gpus``, Spark Connect ``coordinator``.  The launch task adds what only it
    knows (``node`` ... ``task_cpus``) before it hands the meta to a node's supervisor.
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
    coordinator: dict[str, Any] = dataclasses.field(default_factory=dict)  # Spark Connect: a CoordinatorMeta's dict
    # a cluster whose roles ask their own resources launches a stage per group of nodes (driver.launch.resources)
    nodes: list[int] = dataclasses.field(default_factory=list)  # the stage's nodes, by task ([]: first_node + task)
    barrier: bool = True  # a barrier stage (False: dynamic allocation, which Spark cannot combine with one)
    profile_id: int | None = None  # the stage's ResourceProfile (None: the default one)
    # added by the launch task for the node's supervisor
    node: int | None = None  # the node's index in ``roles``
    attempt: int = 0  # Spark's task attempt
    executor_id: str = ""
    spark_gpus: list[str] = dataclasses.field(default_factory=list)  # the addresses Spark gave the task
    spark_resources: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # every resource's addresses
    working_dir: str = ""  # the task's working directory ("": the process's own)
    task_cpus: int | None = None  # spark.task.cpus, for the node's thread pools
    watch_jvm: bool = True  # the node dies with its executor's JVM (a ps node on the driver has none)

    @classmethod
    def parse(cls, meta: Mapping[str, Any] | LaunchMeta) -> LaunchMeta:
        """The meta a task got (the dict, or its JSON on a supervisor's stdin), checked field by field.

        A missing field takes its default here; a missing required one, or a value of the wrong
        type, raises :class:`ProtocolError`; keys this version does not know are left out.
        """
        if isinstance(meta, LaunchMeta):
            return meta
        return cls.from_dict(json.loads(json.dumps(dict(meta))))  # as the wire has it: tuples are lists

    @property
    def address(self) -> tuple[str, int]:
        """The control server's ``(host, port)`` (the driver's, or the Connect coordinator's)."""
        return str(self.control[0]), int(self.control[1])


# --------------------------------------------------------------------------
# Heartbeat bodies (node -> driver): what a beat says besides the node's state
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BeatReport(Body):
    """One ``ctx.report(...)`` of a node's function (``Heartbeat.report``: the latest; ``Heartbeat.reports``: each one
    since the last beat, with its step, time, metrics and times): its step, the run's total steps and epochs, its
    metrics (plain data), the node's clock (``time``), its :mod:`~tfos_nb.runtime.step_time` totals (``times``; the
    driver keeps them only if :func:`~tfos_nb.runtime.step_time.valid`) and, in the latest, what its supervisor
    measured of its GPUs (``gpus``; ``[]``: not measured)."""

    SPARSE: ClassVar[bool] = True
    step: int | None = None
    total_steps: int | None = None
    total_epochs: int | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    time: float | None = None
    times: dict[str, Any] = dataclasses.field(default_factory=dict)
    gpus: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class BeatFeed(Body):
    """What a node says of its feed (``Heartbeat.feed``): its function stopped reading (``closed``), the last data
    shape it was sent (``sample``: a ``BeatCommand.feed_sample`` id), training partitions whose connection broke
    before their end (``dropped``: ``[epoch, partition, rows that arrived]``), a read waiting past the running
    ``train()``'s epochs (``past``: ``[epoch, rows]``, ``[]``: none) and the named sets its function read."""

    SPARSE: ClassVar[bool] = True
    closed: bool = False
    sample: int = 0
    dropped: list[list[int]] = dataclasses.field(default_factory=list)
    past: list[int] = dataclasses.field(default_factory=list)
    sets_read: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_dict(cls, data: object) -> BeatFeed:
        """As :meth:`Body.from_dict`, but an item of ``dropped`` that is not three integers is left out: one bad
        item does not lose the news of the others."""
        if isinstance(data, dict) and isinstance(data.get("dropped"), list):
            data = {**data, "dropped": [d for d in data["dropped"] if isinstance(d, list) and len(d) == 3
                                        and all(type(v) is int for v in d)]}
        return super().from_dict(data)


@dataclasses.dataclass(frozen=True)
class BeatPhase(Body):
    """Where a node's process is (``Heartbeat.phase``): its phase (one of ``executor.process.phases.PHASES``;
    ``""``: not known yet), the seconds since its main thread last moved (``still_s``: an age, as the driver's clock
    may differ from the node's), the phases it went through since the last beat (``seen``), its main thread's place
    in the user's code (``where``) and its :mod:`~tfos_nb.runtime.step_time` totals now (``times``)."""

    SPARSE: ClassVar[bool] = True
    phase: str = ""
    still_s: float | None = None
    seen: list[str] = dataclasses.field(default_factory=list)
    where: str = ""
    times: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BeatStacks(Body):
    """A node's answer to ``BeatCommand.stacks`` (``Heartbeat.stacks``): the id it answers (0: none) and every thread's
    Python stack in its process (``text``)."""

    SPARSE: ClassVar[bool] = True
    id: int = 0
    text: str = ""
