"""A griffe extension for the API reference (mkdocs.yml): Sphinx roles in docstrings become inline code.

tfos_nb's docstrings cross-reference with Sphinx roles (``:class:`TFCluster```, ``:func:`run```), which
Markdown would show as written; mkdocstrings renders docstrings as Markdown, so each role becomes
`` `TFCluster` ``. Loaded by mkdocstrings only (``extensions:`` in mkdocs.yml); the package is not imported.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj):`~?([^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`target``` to ``target`` in inline code, in every docstring griffe reads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"``\1``", obj.docstring.value)
