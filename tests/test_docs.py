"""The documentation site (mkdocs.yml, docs/): it builds with warnings as errors, every public name has a
docstring (the API reference is generated from them), and the notebook pages are the real notebooks.

Nothing here starts Spark or imports TensorFlow: mkdocstrings (griffe) and these checks read the sources.
The README's and the pages' Python blocks are checked by tests/test_readme.py.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import griffe
import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]

# The public modules: each one's __all__ is its public names (the API reference's pages document them).
PUBLIC_MODULES = ["tfos_nb", "tfos_nb.TFCluster", "tfos_nb.TFNode", "tfos_nb.TFParallel", "tfos_nb.compat",
                  "tfos_nb.dfutil", "tfos_nb.util", "tfos_nb.pipeline", "tfos_nb.magics"]


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """A broken link or anchor, a page left out of the nav, a reference mkdocstrings cannot resolve: an error."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=env, stdin=subprocess.DEVNULL)
    problems = [ln for ln in run.stderr.splitlines() if ln.startswith(("WARNING", "ERROR"))]
    assert run.returncode == 0 and not problems, "\n".join(problems) or run.stderr[-3000:]
    for page in ("index.html", "reference/TFCluster/index.html", "notebooks/quickstart/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def _public_names() -> list[tuple[str, str]]:
    """(module, name) of every name in a public module's ``__all__``."""
    names = []
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            if name != "__version__":
                names.append((module, name))
    return names


def test_every_public_name_has_a_docstring():
    """Read statically, as the API reference is: a lazily exported name is looked up where it is defined."""
    package = griffe.load("tfos_nb", search_paths=[str(REPO)], resolve_aliases=True, resolve_external=False)
    missing = []
    for module, name in _public_names():
        node = package if module == "tfos_nb" else package[module.removeprefix("tfos_nb.")]
        if name in node.members:
            obj = node[name]
        else:  # a module __getattr__ gives it (tfos_nb.doctor, tfos_nb.magics.*): where it is defined
            target = getattr(importlib.import_module(module), name)
            obj = package[f"{target.__module__}.{name}".removeprefix("tfos_nb.")]
        if obj.is_alias:
            obj = obj.final_target
        if not (obj.docstring and obj.docstring.value.strip()):
            missing.append(f"{module}.{name}")
    assert not missing, f"public names without a docstring: {missing}"


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs" / "notebooks").glob("*.ipynb")))
def test_notebook_pages_are_the_notebooks(page):
    """docs/notebooks/X.ipynb is an executed copy of notebooks/X.ipynb (scripts/docs_notebooks.py): same cells,
    every code cell ran, none failed."""
    doc = nbformat.read(REPO / "docs" / "notebooks" / page, as_version=4)
    src = nbformat.read(REPO / "notebooks" / page, as_version=4)
    assert [(c.cell_type, c.source) for c in doc.cells] == [(c.cell_type, c.source) for c in src.cells], (
        f"docs/notebooks/{page} differs from notebooks/{page}: run .venv/bin/python scripts/docs_notebooks.py")
    for cell in doc.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is not None, f"a cell of docs/notebooks/{page} was not executed"
            errors = [o for o in cell.outputs if o.output_type == "error"]
            assert not errors, f"a cell of docs/notebooks/{page} failed: {errors[0].get('ename')}"


def test_the_recovery_figures_are_their_results_files():
    """docs/reliability.md's recovery table: the audit's figures are recovery-audit.md's, and the backups' cost
    ratios are recomputed here from b2-backup.md's runs (fit, fastest vs fastest and median vs median), deterministic
    mode's from b2-deterministic.md's and b2-deterministic-8.md's."""
    import statistics

    doc = (REPO / "docs" / "reliability.md").read_text(encoding="utf-8")
    table = doc.split("### Resuming from the last backup", 1)[1].split("| figure | measured |", 1)[1].split("\n\n", 1)[0]
    audit = (REPO / "benchmarks" / "results" / "recovery-audit.md").read_text(encoding="utf-8")
    rows = {r.split(" | ")[0].strip("| "): r for r in table.splitlines() if r.startswith("| ") and "---" not in r}
    trials = re.search(r"(\d+) of (\d+) trials ended as they must", audit)
    assert trials and f"{trials.group(1)} of {trials.group(2)}" in rows["trials that resumed from a backup, not from "
                                                                         "the start"]
    assert f"resumed from a backup, not from the start: {trials.group(1)} of" in audit
    assert "rows trained twice: 0; rows never trained: 0" in audit and "| 0 / 0 |" in \
        rows["rows trained twice / never trained (every epoch, every trial)"]
    kill = re.search(r"kill to the first step of attempt 2: (min [\d.]+ s, median [\d.]+ s, max [\d.]+ s)", audit)
    assert kill and kill.group(1) in rows["time from the kill to attempt 2's first step"]
    for row, results, variant, them in (("cost of the backups", "b2-backup.md", "tfos_nb_backup", "them"),
                                        ("cost of deterministic mode (", "b2-deterministic.md",
                                         "tfos_nb_deterministic", "it"),
                                        ("cost of deterministic mode, 8", "b2-deterministic-8.md",
                                         "tfos_nb_deterministic", "it")):
        fits: dict[str, list[float]] = {}
        text = (REPO / "benchmarks" / "results" / results).read_text(encoding="utf-8")
        for name, fit in re.findall(r"^\| (\w+) \| run \d+ \| [\d.]+ \| ([\d.]+) \|", text, flags=re.M):
            fits.setdefault(name, []).append(float(fit))
        cost = next(r for k, r in rows.items() if k.startswith(row))
        base, new = fits["tfos_nb"], fits[variant]
        assert f"{min(new)}–{max(new)} s with {them} against {min(base)}–{max(base)} s without" in cost, (cost, fits)
        fastest, median = min(new) / min(base), statistics.median(new) / statistics.median(base)
        assert f"{fastest:.2f}× fastest against fastest, {median:.2f}× median against median" in cost, (fastest,
                                                                                                        median)
