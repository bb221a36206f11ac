"""What crosses the pipes between an executor's processes (never a socket, never the driver).

Three pairs talk over pipes, all on one host:

* the launch task → a node's supervisor (stdin): :class:`Launch`, then the
  function :func:`blob <write_blob>`; the supervisor answers on its stdout with
  :class:`Launched` once it registered with the driver (the launch handshake);
* an owner (a node's supervisor, a parallel run's Spark task) → its child process
  (stdin): the function blob, :class:`Start`, then commands (:class:`EpochDone`, :class:`EpochAssigned`,
  :class:`FeedPlan`, :class:`FeedSets`, :class:`Stop`); stdin closing means the owner is gone;
* the child → its owner (the report pipe, ``TFOS_REPORT_FD``): events
  (:class:`Ready`, :class:`Report`, :class:`Failed`, :class:`Finished`,
  :class:`FeedClosed`, :class:`FeedPast`, :class:`Phase`).

One framing: a frame is one line of JSON, ``{"v": VERSION, "t": kind, ...fields}``;
a binary blob is a ``{"t": "blob", "size": n}`` frame followed by its ``n`` bytes.
:func:`decode` is the one parser: a frame of another version or of an unknown kind
raises :class:`PipeProtocolError` saying which.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar

VERSION = 1


class PipeProtocolError(ValueError):
    """A frame this side cannot read: not JSON, another version, an unknown kind, bad fields."""


def jsonable(x: Any) -> Any:
    """JSON's fallback for values of other types (numpy scalars and arrays; anything else as text)."""
    if hasattr(x, "item") and not getattr(x, "ndim", 0):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


@dataclass(frozen=True)
class Frame:
    """A message on a pipe; ``kind`` is its ``"t"`` on the wire."""

    kind: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Frame:
        return cls(**fields)


# -- the child's events (report pipe) ---------------------------------------------------------
@dataclass(frozen=True)
class Ready(Frame):
    """The function is about to run; ``data_port`` is the node's feed server (None: not fed)."""

    kind: ClassVar[str] = "ready"
    data_port: int | None = None


@dataclass(frozen=True)
class Report(Frame):
    """The latest progress report, plus every report since the previous one (``batch``).

    On the wire the report's own fields stand flat next to ``batch``.
    """

    kind: ClassVar[str] = "report"
    report: dict[str, Any] = field(default_factory=dict)
    batch: list[dict[str, Any]] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        return {**self.report, "batch": list(self.batch)}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Frame:
        batch = fields.pop("batch", None)
        return cls(report=fields, batch=batch if isinstance(batch, list) else [])


@dataclass(frozen=True)
class Failed(Frame):
    """The function raised (or could not be loaded, or its value cannot go back)."""

    kind: ClassVar[str] = "error"
    error: str = ""


@dataclass(frozen=True)
class Finished(Frame):
    """The function returned; ``value`` is its plain-data value for the driver (a node's; runs send None)."""

    kind: ClassVar[str] = "finished"
    value: Any = None


@dataclass(frozen=True)
class FeedClosed(Frame):
    """The node stopped reading its data feed (``terminate()`` or its function returned)."""

    kind: ClassVar[str] = "feed_closed"


@dataclass(frozen=True)
class FeedDropped(Frame):
    """A training partition's connection broke before its end (its feeding task died): ``rows`` of it arrived.
    Spark's retry would feed them again, so the driver stops the cluster (``driver.control.controller``)."""

    kind: ClassVar[str] = "feed_dropped"
    gen: int = 0
    partition: int = -1
    rows: int = 0


@dataclass(frozen=True)
class FeedPast(Frame):
    """A read of the node's feed waits for ``epoch``, past the running ``train()``'s epochs, after the node read
    ``rows`` rows of the last of them: its input ran out.  The driver names it when its peers wait for it in a step
    (``driver.control.controller``)."""

    kind: ClassVar[str] = "feed_past"
    epoch: int = 0
    rows: int = 0


@dataclass(frozen=True)
class FeedOpened(Frame):
    """The node function read (or began to read) the named set ``name`` (the driver says so of a set nobody read)."""

    kind: ClassVar[str] = "feed_opened"
    name: str = ""


@dataclass(frozen=True)
class Phase(Frame):
    """Where the child is (one of ``executor.process.phases.PHASES``) and when its main thread last moved
    (``moved_at``, its ``time.time()``); ``where``: its main thread's place in the user's code, if it is there
    (``executor.process.phases.where``); ``stacks``: it dumps its stacks on the owner's signal; ``times``: its
    :mod:`..step_time` totals now (``{}`` before its first step), so that a node stuck inside a step, which reports
    no step, still shows where that time goes."""

    kind: ClassVar[str] = "phase"
    phase: str = ""
    moved_at: float = 0.0
    where: str = ""
    stacks: bool = False
    times: dict[str, Any] = field(default_factory=dict)


# -- the owner's commands (the child's stdin, after the blob and Start) -----------------------
@dataclass(frozen=True)
class EpochDone(Frame):
    """Every feeding task of epoch ``epoch`` is done: the node's feed may end that epoch."""

    kind: ClassVar[str] = "epoch_done"
    epoch: int = 0


@dataclass(frozen=True)
class EpochAssigned(Frame):
    """Every partition of epoch ``epoch`` went to a node, ``partitions`` of them to this one; in a counted epoch
    (``driver/feeding/counts.py``) with ``rows`` rows, and ``most`` rows the largest share of any node (-1: not
    counted)."""

    kind: ClassVar[str] = "epoch_assigned"
    epoch: int = 0
    partitions: int = 0
    rows: int = -1
    most: int = -1


@dataclass(frozen=True)
class FeedPlan(Frame):
    """The running ``train()`` feeds epochs ``first``..``last`` (``last`` 0: none announced); ``sample``: its data's
    shape once a feeding task told it (``{"id", "schema", "shapes"}``, see ``BeatCommand.feed_sample``)."""

    kind: ClassVar[str] = "feed_plan"
    first: int = 0
    last: int = 0
    sample: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FeedSets(Frame):
    """The named sets this node holds a share of (``BeatCommand.feed_sets``): ``{name: {"version", "parts"
    (None while the set is fed), "passes", "sample"}}``."""

    kind: ClassVar[str] = "feed_sets"
    feeds: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Stop(Frame):
    """The driver asks the node to stop (its feed ends; the function should return)."""

    kind: ClassVar[str] = "stop"


# -- starting processes ------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch(Frame):
    """Launch task → supervisor: the node's meta (the driver's launch meta plus this task's placement)."""

    kind: ClassVar[str] = "launch"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Launched(Frame):
    """Supervisor → launch task: registered with the driver (or why not)."""

    kind: ClassVar[str] = "launched"
    ok: bool = False
    error: str | None = None
    pid: int | None = None
    host: str | None = None
    port: int | None = None

    def status(self) -> dict[str, Any]:
        """The launch task's status for the driver (its keys unchanged: ok, error | pid, host, port)."""
        return {k: v for k, v in self.fields().items() if v is not None}


@dataclass(frozen=True)
class Start(Frame):
    """Owner → child, after the function blob: what the child's ``ctx`` is built from."""

    kind: ClassVar[str] = "start"
    info: dict[str, Any] = field(default_factory=dict)


KINDS: dict[str, type[Frame]] = {
    cls.kind: cls for cls in (Ready, Report, Failed, Finished, FeedClosed, FeedDropped, FeedPast, FeedOpened, Phase,
                              EpochDone, EpochAssigned, FeedPlan, FeedSets, Stop, Launch, Launched, Start)
}
BLOB = "blob"


# -- the framing --------------------------------------------------------------------------------
def encode(msg: Frame) -> bytes:
    """One frame: a line of JSON."""
    return (json.dumps({"v": VERSION, "t": msg.kind, **msg.fields()}, default=jsonable) + "\n").encode()


def _envelope(line: bytes | str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise PipeProtocolError(f"not a JSON frame ({exc}): {line[:80]!r}") from None
    if not isinstance(obj, dict):
        raise PipeProtocolError(f"a frame is a JSON object, not {type(obj).__name__}")
    if obj.get("v") != VERSION:
        raise PipeProtocolError(
            f"pipe frame of protocol version {obj.get('v')!r}; this side speaks {VERSION} "
            "(two tfos_nb versions on one executor?)"
        )
    return obj


def decode(line: bytes | str) -> Frame:
    """The message in one frame; :class:`PipeProtocolError` if it is not one this side knows."""
    obj = _envelope(line)
    obj.pop("v")
    kind = obj.pop("t", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise PipeProtocolError(f"unknown pipe message kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    try:
        return cls.from_fields(obj)
    except TypeError as exc:
        raise PipeProtocolError(f"bad fields for {kind!r}: {exc}") from None


def write(stream: IO[bytes], msg: Frame) -> None:
    stream.write(encode(msg))


def read(stream: IO[bytes], expect: type[Frame] | None = None) -> Frame:
    """The next frame of ``stream`` (``expect``: the kind it must be)."""
    line = stream.readline()
    if not line:
        raise EOFError("the pipe closed before a frame")
    msg = decode(line)
    if expect is not None and not isinstance(msg, expect):
        raise PipeProtocolError(f"expected {expect.kind!r}, got {msg.kind!r}")
    return msg


def write_blob(stream: IO[bytes], data: bytes) -> None:
    stream.write((json.dumps({"v": VERSION, "t": BLOB, "size": len(data)}) + "\n").encode())
    stream.write(data)


def read_blob(stream: IO[bytes]) -> bytes:
    line = stream.readline()
    if not line:
        raise EOFError("the pipe closed before the blob")
    head = _envelope(line)
    size = head.get("size")
    if head.get("t") != BLOB or not isinstance(size, int) or size < 0:
        raise PipeProtocolError(f"expected a blob frame, got {line[:80]!r}")
    parts, got = [], 0
    while got < size:
        chunk = stream.read(size - got)
        if not chunk:
            raise EOFError(f"truncated blob ({got} of {size} bytes)")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def lines(fd: int) -> Iterator[bytes]:
    """The lines of a raw fd until EOF (no buffered reader: its lock would stall interpreter exit)."""
    buf = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        buf += chunk
        *complete, buf = buf.split(b"\n")
        yield from (line for line in complete if line.strip())


def messages(fd: int, on_bad: Callable[[PipeProtocolError], None]) -> Iterator[Frame]:
    """The frames read from ``fd`` until EOF; a frame that cannot be read goes to ``on_bad`` and is skipped."""
    for line in lines(fd):
        try:
            yield decode(line)
        except PipeProtocolError as exc:
            on_bad(exc)
