"""Typed fields on the wire: the one error for a rejected frame and the strict field checker.

Every message and reply body is a frozen dataclass; decoding checks each JSON value against its
field's annotation, so nothing shaped wrong gets past the codec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T", bound="DataclassInstance")


class ProtocolError(Exception):
    """A frame that must be rejected: bad MAC, bad JSON, wrong version, replay..."""


# what each annotation accepts: every field's kind is found once per class (a heartbeat is decoded a thousand
# times a second with 512 nodes)
_ACCEPTS: dict[str, Callable[[Any], bool]] = {
    "Any": lambda v: True,
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    # lists whose items the readers trust, checked item by item (before "list": the first match is a field's kind)
    "list[int]": lambda v: isinstance(v, list) and all(type(x) is int for x in v),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "list[list[int]]": lambda v: isinstance(v, list) and all(isinstance(x, list) and all(type(i) is int for i in x)
                                                             for x in v),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "int | None": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "str | None": lambda v: v is None or isinstance(v, str),
    "float | None": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
}
_BY_TYPE = {Any: "Any", int: "int", float: "float", str: "str", bool: "bool"}


def _kind(typ: Any) -> str | None:
    """The key of :data:`_ACCEPTS` for an annotation; None for one this codec does not check (a body that holds
    another parses that field itself, e.g. ``LaunchStatus.coordinator``)."""
    if typ in _BY_TYPE:
        return _BY_TYPE[typ]
    text = str(typ)
    return next((k for k in _ACCEPTS if text == k or (k in ("list", "dict") and text.startswith(k))
                 or (k.endswith("| None") and text.startswith(k))), None)


class _Field(NamedTuple):
    name: str
    kind: str | None  # its key in _ACCEPTS
    typ: object  # its annotation
    required: bool
    default: object  # what a sparse body leaves out (_REQUIRED: always sent)
    body: type | None  # the body its JSON object (or each item of its list) is read as (body_field)
    many: bool  # a list of bodies


_REQUIRED = object()
_BODY = "tfos_body"  # a field's metadata key: (the body class, a list of them)
_FIELDS: dict[type, tuple[_Field, ...]] = {}
_BODY_FIELDS: dict[type, tuple[_Field, ...]] = {}


def body_field(cls: type, *, many: bool = False) -> Any:
    """A dataclass field that holds one body of ``cls`` (``many``: a list of them), empty by default.  The JSON
    object given for it (decoded from the wire, or written by a caller) is read with ``cls.from_dict`` when the
    message is built (:func:`parse_bodies`), so an error names the field: ``Heartbeat.phase: BeatPhase.still_s: ...``."""
    return dataclasses.field(default_factory=list if many else cls, metadata={_BODY: (cls, many)})


def _fields(cls: type) -> tuple[_Field, ...]:
    """Each field of ``cls``, found once per class."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = tuple(_field(f) for f in dataclasses.fields(cls))
        _BODY_FIELDS[cls] = tuple(f for f in found if f.body is not None)
    return found


def _field(f: dataclasses.Field[Any]) -> _Field:
    body, many = f.metadata.get(_BODY, (None, False))
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = _REQUIRED
    kind = ("list" if many else "dict") if body is not None else _kind(f.type)
    return _Field(f.name, kind, f.type, default is _REQUIRED, default, body, many)


def from_dict(cls: type[_T], data: dict[str, Any]) -> _T:
    """Build ``cls`` from decoded JSON, checking every field's type (ProtocolError)."""
    kwargs = {}
    for name, kind, typ, required, _, _, _ in _fields(cls):
        if name in data:
            value = data[name]
            if kind is None:  # pragma: no cover - a field type this codec does not know is a bug
                raise TypeError(f"{cls.__name__}.{name}: unsupported field type {typ!r}")
            if not _ACCEPTS[kind](value):
                raise ProtocolError(f"{cls.__name__}.{name}: expected {typ}, got {type(value).__name__}")
            kwargs[name] = float(value) if kind == "float" else value
        elif required:
            raise ProtocolError(f"{cls.__name__}: missing field {name!r}")
    return cls(**kwargs)


def parse_bodies(obj: object) -> None:
    """Read, in place, the JSON objects given for ``obj``'s :func:`body_field` fields as their bodies (a message's
    ``__post_init__``); a field already holding its body is kept.  An error names the field and, in a list, the item."""
    _fields(type(obj))
    for name, _, typ, _, _, body, many in _BODY_FIELDS[type(obj)]:
        assert body is not None
        value = getattr(obj, name)
        where = f"{type(obj).__name__}.{name}"
        if not many:
            if not isinstance(value, body):
                object.__setattr__(obj, name, _parse(body, value, where, typ))
        elif not isinstance(value, list):
            raise ProtocolError(f"{where}: expected {typ}, got {type(value).__name__}")
        elif not all(isinstance(v, body) for v in value):
            object.__setattr__(obj, name, [v if isinstance(v, body) else _parse(body, v, f"{where}[{i}]", body.__name__)
                                           for i, v in enumerate(value)])


def _parse(body: Any, value: object, where: str, typ: object) -> Any:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: expected {typ}, got {type(value).__name__}")
    try:
        return body.from_dict(value)
    except ProtocolError as exc:
        raise ProtocolError(f"{where}: {exc}") from None


def to_plain_dict(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict(obj)`` for the wire without its deep copy: each field's value as it is, a dataclass
    as its own dict -- where the protocol's types put one: a field's value, the items of a :func:`body_field` list,
    or the items (dict values) of a body's ``NESTED`` fields.  The containers are the message's own (messages are
    frozen and nothing changes them once sent); asdict's copying was a third of the control server's CPU with 512
    nodes heartbeating.  A ``SPARSE`` body leaves out each field at its default (a heartbeat says only its news)."""
    nested = getattr(type(obj), "NESTED", None) or {}
    sparse = getattr(type(obj), "SPARSE", False)
    out = {}
    for name, kind, _, _, default, body, many in _fields(type(obj)):
        value = getattr(obj, name)
        if sparse and value == default:
            continue
        if name in nested:
            value = ([to_plain_dict(v) for v in value] if isinstance(value, list)
                     else {k: to_plain_dict(v) for k, v in value.items()})
        elif many:
            value = [to_plain_dict(v) for v in value]
        elif (body is not None or kind in (None, "Any")) and hasattr(type(value), "__dataclass_fields__"):
            value = to_plain_dict(value)  # a field of a plain kind (int, str, list, dict...) holds no dataclass
        out[name] = value
    return out
