"""The ``args`` a node function gets: one object read the way the user built it.

TensorFlowOnSpark programs index their arguments as they passed them:
``args["batch_size"]`` for a dict, ``args.batch_size`` for an
``argparse.Namespace``, ``vars(args)`` to log them.  :class:`Namespace` takes
both forms (and TensorFlowOnSpark's argv list) and answers every one of
those reads, so the same cell or ``main_fun`` works whatever was passed:
``%%tfos_cluster --args``, the magic's own options, ``%%tfos_parallel``
grids and the Spark ML ``TFEstimator``'s merge of Params.

It is TensorFlowOnSpark's ``pipeline.Namespace`` (same constructor forms,
iteration over the keys, ``==`` on the values) extended with the mapping
protocol.  Plain Python: no IPython, pyspark or TensorFlow import; picklable.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

__all__ = ["Namespace", "as_namespace"]


class _Method:
    """A method that a key of the same name cannot hide (``args.keys()`` keeps working with a ``"keys"`` key).

    A data descriptor: attribute reads find the method; assigning the name stores a key
    (read it back as ``args["keys"]``).
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self.fn if obj is None else self.fn.__get__(obj, owner)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.fn.__name__] = value

    def __delete__(self, obj: Any) -> None:
        del obj.__dict__[self.fn.__name__]


class Namespace:
    """Arguments readable as attributes and as a mapping.

    ``Namespace({"batch_size": 32})``, ``Namespace(argparse_ns)``,
    ``Namespace(batch_size=32)`` or ``Namespace(["--batch_size", "32"])`` (an argv
    list, kept as ``.argv`` for the program's own argparse, TensorFlowOnSpark's form).
    Reads: ``args.batch_size``, ``args["batch_size"]``, ``"batch_size" in args``,
    ``args.get("lr", 0.1)``, ``dict(args)``, ``vars(args)``, ``list(args)`` (the keys),
    ``args.keys()``/``items()``/``values()``, ``len(args)``; writes:
    ``args.x = 1`` or ``args["x"] = 1``.  Equal to another Namespace, an
    ``argparse.Namespace`` or a dict with the same values.
    """

    argv: list[str] | None = None  # TensorFlowOnSpark: set only for the argv-list form

    def __init__(self, source: Any = None, /, **values: Any) -> None:
        if source is None:
            pass
        elif isinstance(source, Namespace):
            self.__dict__.update(source.__dict__)
        elif isinstance(source, Mapping):
            self.__dict__.update(_str_keys(source))
        elif isinstance(source, (argparse.Namespace, types.SimpleNamespace)):
            self.__dict__.update(vars(source))
        elif isinstance(source, (list, tuple)) and all(isinstance(a, str) for a in source):
            self.argv = list(source)
        else:
            msg = (f"args must be a dict, an argparse.Namespace or an argv list of str, got {type(source).__name__}"
                   f" ({source!r:.80})")
            raise TypeError(msg)
        self.__dict__.update(values)

    if TYPE_CHECKING:  # the user's arguments are attributes, as on argparse.Namespace
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...

    # -- the mapping protocol -----------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        try:
            return self.__dict__[key]
        except KeyError:
            raise KeyError(f"{key!r} (args has: {', '.join(sorted(self.__dict__)) or 'nothing'})") from None

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            msg = f"args keys are str, got {key!r}"
            raise TypeError(msg)
        self.__dict__[key] = value

    def __delitem__(self, key: str) -> None:
        del self.__dict__[key]

    def __contains__(self, key: object) -> bool:
        return key in self.__dict__

    def __iter__(self) -> Iterator[str]:
        if self.argv is not None and set(self.__dict__) <= {"argv"}:
            return iter(self.argv)  # TensorFlowOnSpark: an argv Namespace iterates over the argv
        return iter(list(self.__dict__))

    def __len__(self) -> int:
        return len(self.__dict__)

    @_Method
    def keys(self) -> Any:
        """The argument names (``dict(args)`` and ``**args`` use them)."""
        return self.__dict__.keys()

    @_Method
    def values(self) -> Any:
        return self.__dict__.values()

    @_Method
    def items(self) -> Any:
        return self.__dict__.items()

    @_Method
    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)

    @_Method
    def to_dict(self) -> dict[str, Any]:
        """A plain dict copy of the arguments."""
        return dict(self.__dict__)

    # -- comparison, display --------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Namespace):
            return self.__dict__ == other.__dict__
        if isinstance(other, (argparse.Namespace, types.SimpleNamespace)):
            return self.__dict__ == vars(other)
        if isinstance(other, Mapping):
            return self.__dict__ == dict(other)
        if isinstance(other, list) and self.argv is not None:
            return self.argv == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self.__dict__.items()))
        return f"{type(self).__name__}({items})"

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _str_keys(values: Mapping[Any, Any]) -> dict[str, Any]:
    bad = [k for k in values if not isinstance(k, str)]
    if bad:
        msg = f"args keys must be str, got {bad[0]!r}"
        raise TypeError(msg)
    return dict(values)


def as_namespace(value: Any) -> Namespace:
    """``value`` (None, a dict, an argparse/SimpleNamespace, a Namespace, an argv list) as a new :class:`Namespace`."""
    return Namespace(value)
