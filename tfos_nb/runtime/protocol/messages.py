"""Every control-plane message of the runtime, the typed bodies of the driver's replies, and the wire codec.

A frame on the wire is ``len (4 bytes, big endian) | mac (32 bytes) | body``
where ``body`` is UTF-8 JSON and ``mac`` is HMAC-SHA256 over the body with the
cluster's secret.  The secret is created per cluster on the driver and travels
to the executors inside Spark's task closure; it never crosses our sockets.

Decoding is strict: the MAC is checked before the JSON is parsed, the envelope
must carry the right protocol version and cluster id, a sender's sequence
numbers must grow (replays are refused) and every message type is a frozen
dataclass whose required fields are type-checked.  Unknown keys are ignored,
so a newer peer can add fields.  Nothing here ever unpickles.

A :class:`Reply` carries one typed body per request (:class:`NodeSpec`,
:class:`BeatCommand`, :class:`FeedAssignment`, :class:`FeedVerdict`,
:class:`FeedReleased`, :class:`Retry`): the driver builds them, peers read them
with ``Body.from_dict(reply.body)``.  :class:`LaunchMeta` is what the driver
hands every Spark task that starts a node or a run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import struct
import threading
import time
from typing import Any, ClassVar

from ..net import recv_exact

PROTOCOL_VERSION = 2  # 2: typed reply bodies, epoch (was gen) in heartbeat commands, FeedRelease.error_kind
MAC_SIZE = 32
HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20  # control messages are small; logs are capped per heartbeat
MAX_CLOCK_SKEW_S = 600.0


class ProtocolError(Exception):
    """A frame that must be rejected: bad MAC, bad JSON, wrong version, replay..."""


def new_secret() -> bytes:
    return os.urandom(32)


def sign(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).digest()


# --------------------------------------------------------------------------
# Message types
# --------------------------------------------------------------------------

_TYPES: dict[str, type[Message]] = {}


@dataclasses.dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.TYPE:
            _TYPES[cls.TYPE] = cls

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check(cls: type, name: str, value: Any, typ: Any) -> Any:
    """Type-check one decoded JSON value against a (simple) annotation."""
    ok: bool
    if typ in ("int", int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ in ("float", float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif typ in ("str", str):
        ok = isinstance(value, str)
    elif typ in ("bool", bool):
        ok = isinstance(value, bool)
    elif str(typ).startswith("list"):
        ok = isinstance(value, list)
    elif str(typ).startswith("dict"):
        ok = isinstance(value, dict)
    elif str(typ).startswith("int | None"):
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
    elif str(typ).startswith("str | None"):
        ok = value is None or isinstance(value, str)
    elif str(typ).startswith("float | None"):
        ok = value is None or isinstance(value, (int, float))
    else:  # pragma: no cover - a field type this codec does not know is a bug
        raise TypeError(f"{cls.__name__}.{name}: unsupported field type {typ!r}")
    if not ok:
        raise ProtocolError(f"{cls.__name__}.{name}: expected {typ}, got {type(value).__name__}")
    return value


def _from_dict(cls: type[Message], data: dict[str, Any]) -> Message:
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _check(cls, f.name, data[f.name], f.type)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{cls.__name__}: missing field {f.name!r}")
    return cls(**kwargs)


# Node -> driver -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Register(Message):
    """A node's supervisor announces itself (host, ports, devices)."""

    TYPE: ClassVar[str] = "register"
    node: int
    host: str
    port: int
    executor_id: str
    pid: int
    gpus: list = dataclasses.field(default_factory=list)  # [{"index","name","memory_total","memory_used"}]
    spark_gpus: list = dataclasses.field(default_factory=list)  # addresses Spark gave the task
    working_dir: str = ""
    attempt: int = 0


@dataclasses.dataclass(frozen=True)
class AwaitSpec(Message):
    """Poll: is the cluster complete, and what is my part in it?"""

    TYPE: ClassVar[str] = "await_spec"
    node: int


@dataclasses.dataclass(frozen=True)
class Heartbeat(Message):
    """Liveness plus everything new since the last heartbeat."""

    TYPE: ClassVar[str] = "heartbeat"
    node: int
    state: str  # starting | running | finished | failed | stopped
    child_pid: int | None = None
    data_port: int | None = None
    tensorboard: str | None = None
    report: dict = dataclasses.field(default_factory=dict)  # latest ctx.report(...)
    reports: list = dataclasses.field(default_factory=list)  # every ctx.report since the last beat: [{step, time, metrics}]
    returned: dict = dataclasses.field(default_factory=dict)  # last beat: {"value": what the node function returned}
    feed: dict = dataclasses.field(default_factory=dict)  # {"closed": True} once the function stopped reading
    logs: list = dataclasses.field(default_factory=list)  # new output lines
    logs_dropped: int = 0
    exit_code: int | None = None
    error: str | None = None  # one line
    tail: list = dataclasses.field(default_factory=list)  # last lines of output on failure


@dataclasses.dataclass(frozen=True)
class FeedAssign(Message):
    """A Spark feeding task asks which node should take its partition."""

    TYPE: ClassVar[str] = "feed_assign"
    partition: int
    gen: int
    host: str
    executor_id: str
    mode: str  # train | infer


@dataclasses.dataclass(frozen=True)
class FeedRelease(Message):
    """A feeding task is done with its node."""

    TYPE: ClassVar[str] = "feed_release"
    partition: int
    gen: int
    node: int
    rows: int
    skipped: int = 0
    error: str | None = None
    error_kind: str | None = None  # ERROR_LOST_CONNECTION: the connection to the node broke (see error_kind())


@dataclasses.dataclass(frozen=True)
class FeedCheck(Message):
    """A feeding task lost its connection to a node: has that node stopped reading, failed, or neither?

    The reply's body holds ``verdict``: ``"done"`` (its function called terminate() or
    returned: the partition is skipped), ``"failed"`` (with ``error``), ``"stopped"``
    (the cluster is being shut down) or ``"reading"`` (no news yet: ask again).
    """

    TYPE: ClassVar[str] = "feed_check"
    partition: int
    node: int


# Driver -> node (responses) --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reply(Message):
    """The driver's answer to any request. ``body`` depends on the request."""

    TYPE: ClassVar[str] = "reply"
    ok: bool
    body: dict = dataclasses.field(default_factory=dict)
    error: str | None = None


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
        return _from_dict(cls, data)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class Retry(Body):
    """Not yet: ask again in ``retry`` seconds (AwaitSpec before the cluster formed, FeedAssign with no free node)."""

    retry: float = 0.1


@dataclasses.dataclass(frozen=True)
class NodeSpec(Body):
    """AwaitSpec's answer once every node registered: the node's part in the cluster."""

    cluster_spec: dict
    tf_config: dict
    gpus: list
    host_has_gpus: bool
    feed: bool
    tensorboard: bool
    log_dir: str


@dataclasses.dataclass(frozen=True)
class BeatCommand(Body):
    """A heartbeat's answer: the last epoch fed in full, and whether to stop (gracefully) or be killed."""

    epoch_done: int = 0
    stop: bool = False
    kill: bool = False
    grace: float = 2.0


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
    control: list  # [host, port]
    hb_interval: float
    driver_timeout: float
    env: dict
    keras: str
    default_fs: str
    driver_pid: int
    roles: list = dataclasses.field(default_factory=list)  # [[job_name, task_index], ...]
    first_node: int = 0
    reservation_timeout: float = 600.0
    release_port: bool = True
    num_runs: int = 0
    num_gpus: int = 1


# --------------------------------------------------------------------------
# Envelope codec
# --------------------------------------------------------------------------


class Codec:
    """Signs and verifies frames for one cluster.

    One codec per endpoint.  ``sender`` names this endpoint; its sequence numbers
    grow strictly so that a replayed frame is refused by the receiver.
    """

    def __init__(self, secret: bytes, cluster_id: str, sender: str) -> None:
        if len(secret) < 16:
            raise ValueError("the cluster secret must be at least 16 bytes")
        self._secret = secret
        self.cluster_id = cluster_id
        self.sender = f"{sender}/{os.urandom(6).hex()}"
        self._seq = 0
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}

    def encode(self, msg: Message) -> bytes:
        with self._lock:
            self._seq += 1
            seq = self._seq
        env = {
            "v": PROTOCOL_VERSION,
            "cid": self.cluster_id,
            "from": self.sender,
            "seq": seq,
            "ts": time.time(),
            "type": msg.TYPE,
            "body": msg.to_dict(),
        }
        body = json.dumps(env, separators=(",", ":"), allow_nan=False).encode()
        frame = sign(self._secret, body) + body
        if len(frame) > MAX_FRAME:
            raise ValueError(f"control message too large ({len(frame)} bytes)")
        return HEADER.pack(len(frame)) + frame

    def decode(self, frame: bytes) -> Message:
        """Verify and decode one frame (without its length header)."""
        if len(frame) > MAX_FRAME:
            raise ProtocolError("frame too large")
        if len(frame) <= MAC_SIZE:
            raise ProtocolError("frame too short")
        mac, body = frame[:MAC_SIZE], frame[MAC_SIZE:]
        if not hmac.compare_digest(mac, sign(self._secret, body)):
            raise ProtocolError("bad signature")
        try:
            env = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"bad JSON: {exc}") from None
        if not isinstance(env, dict):
            raise ProtocolError("envelope is not an object")
        if env.get("v") != PROTOCOL_VERSION:
            msg = (f"protocol version mismatch: the peer speaks version {env.get('v')!r}, this side "
                   f"{PROTOCOL_VERSION} (the driver and the executors run different tfos_nb versions)")
            raise ProtocolError(msg)
        if env.get("cid") != self.cluster_id:
            raise ProtocolError("message for another cluster")
        sender, seq, ts = env.get("from"), env.get("seq"), env.get("ts")
        if not isinstance(sender, str) or not isinstance(seq, int) or not isinstance(ts, (int, float)):
            raise ProtocolError("bad envelope")
        if abs(time.time() - ts) > MAX_CLOCK_SKEW_S:
            raise ProtocolError("stale message")
        with self._lock:
            if seq <= self._seen.get(sender, 0):
                raise ProtocolError("replayed message")
            self._seen[sender] = seq
        cls = _TYPES.get(env.get("type"))  # type: ignore[arg-type]
        if cls is None:
            raise ProtocolError(f"unknown message type {env.get('type')!r}")
        data = env.get("body")
        if not isinstance(data, dict):
            raise ProtocolError("body is not an object")
        return _from_dict(cls, data)


def read_frame(sock: Any, max_frame: int = MAX_FRAME) -> bytes:
    """Blocking read of one frame from a socket (the client side)."""
    (n,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    if n > max_frame:
        raise ProtocolError(f"frame of {n} bytes exceeds {max_frame}")
    return bytes(recv_exact(sock, n))

