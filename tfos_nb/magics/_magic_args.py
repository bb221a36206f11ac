"""IPython's magic decorators with types (IPython's own carry no annotations).

The same functions, re-exported with signatures, so a magic they decorate keeps its own
type under ``mypy --strict`` (an untyped decorator would make it ``Any``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from IPython.core import magic as _magic
from IPython.core import magic_arguments as _arguments

__all__ = ["argument", "cell_magic", "line_magic", "magic_arguments", "no_var_expand", "parse_argstring"]

_F = TypeVar("_F", bound=Callable[..., Any])


def cell_magic(method: _F) -> _F:
    """Register a ``Magics`` method as the cell magic ``%%NAME``."""
    marked: _F = _magic.cell_magic(method)
    return marked


def line_magic(method: _F) -> _F:
    """Register a ``Magics`` method as the line magic ``%NAME``."""
    marked: _F = _magic.line_magic(method)
    return marked


def no_var_expand(method: _F) -> _F:
    """IPython passes the magic's line as typed (no ``$name`` expansion)."""
    marked: _F = _magic.no_var_expand(method)
    return marked


def magic_arguments() -> Callable[[_F], _F]:
    """Mark a magic as taking ``argparse`` options (its ``%magic?`` help lists them)."""
    decorate: Callable[[_F], _F] = _arguments.magic_arguments()
    return decorate


def argument(*args: Any, **kwargs: Any) -> Callable[[_F], _F]:
    """One option of the magic: the arguments of ``argparse.ArgumentParser.add_argument``."""
    decorate: Callable[[_F], _F] = _arguments.argument(*args, **kwargs)
    return decorate


def parse_argstring(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """The magic's options parsed from its line (IPython's ``UsageError`` when they do not parse)."""
    opts: argparse.Namespace = _arguments.parse_argstring(magic, line)
    return opts
