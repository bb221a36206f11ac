"""Refresh the documentation's notebook pages: execute notebooks/<name>.ipynb and keep the executed copy.

``.venv/bin/python scripts/docs_notebooks.py [NAME ...]`` (default: every notebook already under
docs/notebooks/) runs each notebook headless on an embedded Spark with ``scripts/run_notebook.py`` and copies
the executed notebook, outputs and pictures included, to docs/notebooks/<name>.ipynb, which mkdocs-jupyter
renders as a page. tests/test_docs.py checks that those copies' code cells equal the source notebooks'.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import run_notebook  # noqa: E402 - the script beside this one


def main(names: list[str]) -> int:
    docs = ROOT / "docs" / "notebooks"
    names = names or sorted(p.stem for p in docs.glob("*.ipynb"))
    for name in names:
        if run_notebook.main(str(ROOT / "notebooks" / f"{name}.ipynb")) != 0:
            print(f"{name}.ipynb failed: docs/notebooks/ left as it was", file=sys.stderr)
            return 1
        nb = nbformat.read(ROOT / "build" / f"{name}.ipynb", as_version=4)
        # the live panel's widget state: the page shows each cell's final static table instead (no widget
        # manager script from a CDN)
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, docs / f"{name}.ipynb")
        print(f"docs/notebooks/{name}.ipynb refreshed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
