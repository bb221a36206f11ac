"""tfos_nb's one logger tree (``tfos_nb.*``, the standard :mod:`logging`) and its one level setting.

Every module logs to ``logging.getLogger(__name__)``, so the tree is ``tfos_nb`` and its children.  Untouched,
the tree follows Python's defaults: warnings and errors reach stderr (``logging.lastResort``), or the handlers
the application configured.  ``TFOS_NB_LOG_LEVEL`` (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``), read when
tfos_nb is imported, or :func:`set_level` (what ``%config TFOSMagics.log_level`` calls) sets the tree's level
and gives it one stderr handler of its own, so its records show in a notebook that configured no logging.  The
driver passes the level to its node processes in their environment (:func:`node_env`): a node logs at the
level the notebook set, into its output lines.
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "tfos_nb"
LEVEL_ENV = "TFOS_NB_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMAT = "tfos_nb %(levelname)s %(name)s: %(message)s"


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The tree's own stderr handler, told apart from the application's; it writes to ``sys.stderr`` as it is at
    each record (a notebook kernel's captured stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def check_level(value: object) -> str:
    """``value`` as one of :data:`LEVELS` (any case); ValueError naming them for anything else."""
    name = str(value).strip().upper() if isinstance(value, str) else ""
    if name not in LEVELS:
        msg = f"the tfos_nb log level must be one of {', '.join(LEVELS)} (any case), got {value!r}"
        raise ValueError(msg)
    return name


def set_level(value: str | None) -> str | None:
    """Set the tree's level (``None`` or ``""``: back to Python's defaults); returns the level's name.  Also sets
    :data:`LEVEL_ENV` in this process, so node processes started from here log at it."""
    logger = logging.getLogger(ROOT)
    for h in [h for h in logger.handlers if isinstance(h, _Handler)]:
        logger.removeHandler(h)
    if not value:
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        os.environ.pop(LEVEL_ENV, None)
        return None
    name = check_level(value)
    logger.setLevel(name)
    logger.addHandler(_Handler())
    logger.propagate = False  # once here, not again through the application's root handlers
    os.environ[LEVEL_ENV] = name
    return name


def from_env() -> str | None:
    """Apply :data:`LEVEL_ENV` if it is set (at import of tfos_nb, in the notebook and in every node process); a
    bad value is said once on stderr and ignored (an import must not fail on it)."""
    raw = os.environ.get(LEVEL_ENV, "")
    if not raw:
        return None
    try:
        return set_level(raw)
    except ValueError as exc:
        sys.stderr.write(f"tfos_nb: {exc} (from {LEVEL_ENV}); ignored\n")
        return None


def node_env() -> dict[str, str]:
    """What a node process's environment gets so that it logs at this process's level."""
    name = os.environ.get(LEVEL_ENV, "")
    return {LEVEL_ENV: name} if name.upper() in LEVELS else {}
