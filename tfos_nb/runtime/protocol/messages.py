"""Every control-plane message of the runtime and the wire codec (reply bodies: ``bodies.py``).

A frame on the wire is ``len (4 bytes, big endian) | mac (32 bytes) | body``
where ``body`` is UTF-8 JSON and ``mac`` is HMAC-SHA256 over the body with the
cluster's secret.  The secret is created per cluster on the driver and travels
to the executors inside Spark's task closure; it never crosses our sockets.

Decoding is strict: the MAC is checked before the JSON is parsed, the envelope
must carry the right protocol version and cluster id, a sender's sequence
numbers must grow (replays are refused) and every message type is a frozen
dataclass whose required fields are type-checked.  A request's id is its
sender and sequence number (the sender's name ends in 128 random bits); the
reply to it names that id inside the signed envelope (``re``), and a client
accepts a reply only as the answer to the very request it just sent
(:meth:`Codec.decode_reply`), so a reply cannot be replayed to another peer or
as the answer to a later request.  Unknown keys are ignored,
so a newer peer can add fields.  Nothing here ever unpickles.

A :class:`Reply` carries one typed body per request (:class:`NodeSpec`,
:class:`BeatCommand`, :class:`FeedAssignment`, :class:`FeedVerdict`,
:class:`FeedReleased`, :class:`Retry`): the driver builds them, peers read them
with ``Body.from_dict(reply.body)``.  :class:`LaunchMeta` is what the driver
hands every Spark task that starts a node or a run.  A :class:`Heartbeat`'s news is typed too
(:class:`BeatReport`, :class:`BeatFeed`, :class:`BeatPhase`, :class:`BeatStacks`), read when the beat is decoded.
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
from typing import Any, ClassVar, TypedDict

from ..net import recv_exact
from .bodies import (  # re-exported: every wire type is reachable as messages.X
    ERROR_LOST_CONNECTION,
    ERROR_OTHER,
    BeatCommand,
    BeatFeed,
    BeatPhase,
    BeatReport,
    BeatStacks,
    Body,
    CoordinatorMeta,
    CoordinatorStarted,
    FeedAssignment,
    FeedReleased,
    FeedVerdict,
    LaunchMeta,
    LaunchStatus,
    NodeSpec,
    Retry,
    error_kind,
)
from .fields import ProtocolError, body_field, parse_bodies, to_plain_dict
from .fields import from_dict as _from_dict

PROTOCOL_VERSION = 3  # 3: a reply names the request it answers; 2: typed reply bodies, epoch in heartbeat commands
MAC_SIZE = 32
HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20  # control messages are small; logs are capped per heartbeat
MAX_CLOCK_SKEW_S = 600.0
SEEN_PRUNE_AT = 256  # senders remembered before the stale ones are forgotten


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

    def __post_init__(self) -> None:
        parse_bodies(self)  # a body field given its JSON object (decoded, or a caller's dict) holds its body

    def to_dict(self) -> dict[str, Any]:
        return to_plain_dict(self)


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
    gpus: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # [{"index","name","memory_total","memory_used"}]
    spark_gpus: list[str] = dataclasses.field(default_factory=list)  # addresses Spark gave the task
    working_dir: str = ""
    attempt: int = 0
    resources: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # every resource Spark gave the task
    task_cpus: int | None = None  # the cpus Spark gave the task
    profile_id: int | None = None  # the launch stage's ResourceProfile (None: the default one)


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
    tensorboard: str | None = None  # the chief's TensorBoard, once verified to listen and answer (http://host:port)
    tensorboard_error: str | None = None  # why the chief has no TensorBoard (it exited or never listened)
    report: BeatReport = body_field(BeatReport)  # the latest ctx.report(...)
    reports: list[BeatReport] = body_field(BeatReport, many=True)  # every ctx.report since the last beat
    returned: dict[str, Any] = dataclasses.field(default_factory=dict)  # last beat: {"value": what the node function returned}
    feed: BeatFeed = body_field(BeatFeed)
    phase: BeatPhase = body_field(BeatPhase)
    stacks: BeatStacks = body_field(BeatStacks)  # the answer to BeatCommand.stacks
    logs: list[str] = dataclasses.field(default_factory=list)  # new output lines
    logs_dropped: int = 0
    exit_code: int | None = None
    error: str | None = None  # one line
    tail: list[str] = dataclasses.field(default_factory=list)  # last lines of output on failure


class BeatFields(TypedDict, total=False):
    """The :class:`Heartbeat` fields a node's owner adds to its state, logs and end (``ChildOwner.beat_fields``)."""

    data_port: int | None
    tensorboard: str | None
    tensorboard_error: str | None
    report: BeatReport
    reports: list[BeatReport]
    returned: dict[str, Any]
    feed: BeatFeed
    phase: BeatPhase
    stacks: BeatStacks


@dataclasses.dataclass(frozen=True)
class FeedAssign(Message):
    """A Spark feeding task asks which node should take its partition."""

    TYPE: ClassVar[str] = "feed_assign"
    partition: int
    gen: int
    host: str
    executor_id: str
    mode: str  # train | infer
    sample: dict[str, Any] = dataclasses.field(default_factory=dict)  # train: {"schema", "shapes"} of its first rows
    feed: str = "input"  # a named set's name (a set fed once, ``gen`` its version), else the training stream


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
    feed: str = "input"  # as FeedAssign's


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
    body: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


# --------------------------------------------------------------------------
# Envelope codec
# --------------------------------------------------------------------------


class Codec:
    """Signs and verifies frames for one cluster.

    One codec per endpoint.  ``sender`` names this endpoint; its sequence numbers
    grow strictly so that a replayed frame is refused by the receiver.  A client
    sends with :meth:`encode_request` and reads the answer with :meth:`decode_reply`;
    a server reads with :meth:`decode_request` and answers with ``encode(reply, answers=…)``.
    """

    def __init__(self, secret: bytes, cluster_id: str, sender: str) -> None:
        if len(secret) < 16:
            raise ValueError("the cluster secret must be at least 16 bytes")
        self._secret = secret
        self.cluster_id = cluster_id
        self.sender = f"{sender}/{os.urandom(16).hex()}"  # unique: a request's id (sender#seq) is a nonce
        self._seq = 0
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, float]] = {}  # sender -> (last seq, newest ts)
        self._prune_at = SEEN_PRUNE_AT  # the table's size at which stale senders are next forgotten

    def encode(self, msg: Message, *, answers: str | None = None) -> bytes:
        """One signed frame, its length header included.  A :class:`Reply` names the request it ``answers`` (the id
        :meth:`decode_request` gave); a request names none."""
        return self._encode(msg, answers)[0]

    def encode_request(self, msg: Message) -> tuple[bytes, str]:
        """A request's frame and its id: :meth:`decode_reply` accepts only the reply that names this id."""
        return self._encode(msg, None)

    def _encode(self, msg: Message, answers: str | None) -> tuple[bytes, str]:
        if isinstance(msg, Reply) != (answers is not None):
            raise ValueError(f"a reply, and only a reply, names the request it answers (a {msg.TYPE} with {answers!r})")
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
        if answers is not None:
            env["re"] = answers
        body = json.dumps(env, separators=(",", ":"), allow_nan=False).encode()
        frame = sign(self._secret, body) + body
        if len(frame) > MAX_FRAME:
            raise ValueError(f"control message too large ({len(frame)} bytes)")
        return HEADER.pack(len(frame)) + frame, _request_id(self.sender, seq)

    def decode(self, frame: bytes) -> Message:
        """Verify and decode one request frame (without its length header); a reply is refused here."""
        return self._decode(frame, None)[0]

    def decode_request(self, frame: bytes) -> tuple[Message, str]:
        """Verify and decode one request frame; returns it and its id, which the reply to it names."""
        return self._decode(frame, None)

    def decode_reply(self, frame: bytes, answers: str) -> Reply:
        """Verify and decode the reply to the request whose id is ``answers`` (from :meth:`encode_request`).

        Any other frame is a :class:`ProtocolError`, a reply to another request too: one meant for another
        peer, or for an earlier request of this one.
        """
        msg = self._decode(frame, answers)[0]
        assert isinstance(msg, Reply)  # _decode checked its type
        return msg

    def _decode(self, frame: bytes, answers: str | None) -> tuple[Message, str]:
        """``answers``: None where a request is expected, else the id of the request whose reply is."""
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
        kind = env.get("type")
        if answers is None and kind == Reply.TYPE:
            raise ProtocolError("a reply where a request was expected")
        if answers is not None:
            if kind != Reply.TYPE:
                raise ProtocolError(f"expected a reply, got {kind!r}")
            if env.get("re") != answers:
                raise ProtocolError("a reply not for this request (replayed, or meant for another peer)")
        with self._lock:
            last, newest = self._seen.get(sender, (0, ts))
            if seq <= last:
                raise ProtocolError("replayed message")
            self._seen[sender] = (seq, max(newest, ts))
            if len(self._seen) > self._prune_at:
                self._forget_stale_senders()
                # next time at twice the senders still remembered: a cluster of more live nodes than
                # SEEN_PRUNE_AT does not walk the table on every message (amortised O(1))
                self._prune_at = max(SEEN_PRUNE_AT, 2 * len(self._seen))
        cls = _TYPES.get(str(kind))
        if cls is None:
            raise ProtocolError(f"unknown message type {kind!r}")
        data = env.get("body")
        if not isinstance(data, dict):
            raise ProtocolError("body is not an object")
        return _from_dict(cls, data), _request_id(sender, seq)

    def _forget_stale_senders(self) -> None:
        """Drop senders whose newest message is already stale: any replay of theirs is refused by its
        timestamp.  (Each Spark Connect status job is a sender of its own; without this the table
        would grow by one entry per snapshot for the cluster's whole life.)"""
        now = time.time()
        for sender in [s for s, (_, newest) in self._seen.items() if now - newest > MAX_CLOCK_SKEW_S]:
            del self._seen[sender]


def _request_id(sender: str, seq: int) -> str:
    return f"{sender}#{seq}"


def read_frame(sock: Any, max_frame: int = MAX_FRAME) -> bytes:
    """Blocking read of one frame from a socket (the client side)."""
    (n,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    if n > max_frame:
        raise ProtocolError(f"frame of {n} bytes exceeds {max_frame}")
    return bytes(recv_exact(sock, n))


__all__ = [
    "ERROR_LOST_CONNECTION", "ERROR_OTHER", "AwaitSpec", "BeatCommand", "BeatFeed", "BeatFields", "BeatPhase", "BeatReport",
    "BeatStacks", "Body", "Codec", "CoordinatorMeta",
    "CoordinatorStarted", "FeedAssign", "FeedAssignment", "FeedCheck", "FeedRelease", "FeedReleased",
    "FeedVerdict", "Heartbeat", "LaunchMeta", "LaunchStatus", "Message", "NodeSpec", "ProtocolError", "Register",
    "Reply", "Retry", "error_kind", "new_secret", "read_frame", "sign"
]
