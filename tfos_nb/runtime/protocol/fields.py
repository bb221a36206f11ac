"""Typed fields on the wire: the one error for a rejected frame and the strict field checker.

Every message and reply body is a frozen dataclass; decoding checks each JSON value against its
field's annotation, so nothing shaped wrong gets past the codec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

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
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "int | None": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "str | None": lambda v: v is None or isinstance(v, str),
    "float | None": lambda v: v is None or isinstance(v, (int, float)),
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


_FIELDS: dict[type, tuple[tuple[str, str | None, Any, bool], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, str | None, Any, bool], ...]:
    """(name, kind, annotation, required) of each field of ``cls``."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = tuple(
            (f.name, _kind(f.type), f.type,
             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls))
    return found


def from_dict(cls: type[_T], data: dict[str, Any]) -> _T:
    """Build ``cls`` from decoded JSON, checking every field's type (ProtocolError)."""
    kwargs = {}
    for name, kind, typ, required in _fields(cls):
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


def to_plain_dict(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict(obj)`` for the wire without its deep copy: each field's value as it is, a dataclass
    as its own dict -- where the protocol's types put one: a field's value, or the items (dict values) of a
    body's ``NESTED`` fields.  The containers are the message's own (messages are frozen and nothing changes them
    once sent); asdict's copying was a third of the control server's CPU with 512 nodes heartbeating."""
    nested = getattr(type(obj), "NESTED", None) or {}
    out = {}
    for name, _, _, _ in _fields(type(obj)):
        value = getattr(obj, name)
        if name in nested:
            value = ([to_plain_dict(v) for v in value] if isinstance(value, list)
                     else {k: to_plain_dict(v) for k, v in value.items()})
        elif hasattr(type(value), "__dataclass_fields__"):
            value = to_plain_dict(value)
        out[name] = value
    return out
