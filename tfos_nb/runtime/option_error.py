"""A bad option value, said in the words of whoever gave it.

The option groups (``driver/options.py``) and deterministic mode (``determinism``) check a job's options once.
The Python API says a bad value in its keywords' names (``retries must be a non-negative integer, got -2``); a
cell magic says the same sentence in its own flags (``--retries must be a non-negative integer, got -2``)
without checking anything itself.  Stdlib only: the driver and the modules both sides share import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["Named", "OptionError"]


@dataclasses.dataclass(frozen=True)
class Named:
    """An option as a message names it: ``name`` (the keyword's name); ``said``, what the Python API calls it when
    not by its name (``chief/worker nodes``); ``value``, shown after the name when ``shown`` (``min_workers=1``)."""

    name: str
    said: str | None = None
    value: Any = None
    shown: bool = False

    def words(self, flags: Mapping[str, str]) -> str:
        """This option in a message: by ``flags[name]`` (``--min-workers 1``, ``--deterministic``) when given,
        else as the Python API names it (``min_workers=1``, ``deterministic=True``)."""
        flag = flags.get(self.name)
        if flag is None:
            return f"{self.said or self.name}={self.value}" if self.shown else self.said or self.name
        if not self.shown or self.value is True:
            return flag
        return f"{flag} {self.value}"


class OptionError(ValueError):
    """A ValueError about one or more options, its message ``parts``: text and the :class:`Named` options."""

    def __init__(self, *parts: str | Named) -> None:
        self.parts = parts
        super().__init__(self.said())

    def said(self, flags: Mapping[str, str] | None = None) -> str:
        """The message, each option named by ``flags`` (a front-end's own names: ``{"retries": "--retries"}``) or,
        for those it does not name, as the Python API names them."""
        return "".join(p if isinstance(p, str) else p.words(flags or {}) for p in self.parts)
