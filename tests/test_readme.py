"""The README and the documentation pages (docs/) are checked by running their examples.

Rules (they keep this test honest as the pages change):

* Every fenced ``python`` block of README.md and docs/**/*.md compiles, and every name it imports from tfos_nb
  exists.
* A ``python`` block right after an HTML comment ``<!-- readme-test: run; given: NAMES ... -->`` is
  executed for real (slow tier) on a small local-cluster, with only the names the comment lists
  given to it (``sc``, ``args``, ``train_df``: see ``GIVEN``); anything else it uses it must define.
* The README's links and images point inside the repository (a user's clone has nothing beside it) and exist
  (the docs' links are checked by ``mkdocs build --strict``: tests/test_docs.py).
* The magics table (docs/notebooks.md) lists every option of every magic; the configuration page
  (docs/reference/configuration.md) every configurable trait with its default, and every ``TFOS_*`` environment
  variable the package reads or sets.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
PAGES = {"README.md": README} | {str(p.relative_to(REPO)): p.read_text(encoding="utf-8")
                                 for p in sorted((REPO / "docs").rglob("*.md"))}
NOTEBOOKS_PAGE = PAGES["docs/notebooks.md"]  # the magics table
CONFIG_PAGE = PAGES["docs/reference/configuration.md"]  # the settings, with their defaults, and the environment
FENCE = re.compile(r"(?:<!--\s*readme-test:\s*run;\s*given:(?P<given>[^>]*)-->\s*\n)?```(?P<lang>[\w-]*)\n(?P<code>.*?)\n```",
                   re.S)


def blocks(lang: str, pages: tuple[str, ...] | None = None) -> list[tuple[str, list[str] | None]]:
    """(code, names given to it if it is to be run, else None) of each fenced block in ``lang``, README first."""
    found = []
    text = "\n".join(PAGES[name] for name in (pages or tuple(PAGES)))
    for m in FENCE.finditer(text):
        if m.group("lang") != lang:
            continue
        given = None
        if m.group("given") is not None:
            given = re.findall(r"(?:^|,)\s*(\w+)", re.sub(r"\([^)]*\)", "", m.group("given")))  # (notes) aside
        found.append((m.group("code"), given))
    return found


def test_python_blocks_compile_and_their_tfos_nb_imports_resolve():
    code_blocks = blocks("python")
    assert len(code_blocks) >= 3, "the README's and the docs' python examples were not found"
    for code, _ in code_blocks:
        tree = ast.parse(code)  # a SyntaxError names the block's line
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfos_nb"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                        f"a page imports {alias.name} from {node.module}, which has no such name")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tfos_nb"):
                        importlib.import_module(alias.name)


def test_first_example_is_the_run_one_and_imports_what_it_uses():
    code, given = blocks("python", ("README.md",))[0]
    assert given == ["sc", "args", "train_df"], given
    tree = ast.parse(code)
    defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    defined |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    defined |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    missing = used - defined - set(given) - set(dir(__builtins__))
    assert not missing, f"the README's first example uses names it neither defines nor imports: {sorted(missing)}"


def test_links_stay_inside_the_repository():
    assert "../" not in README
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        assert (REPO / target).exists(), f"README links {target}, which is not in the repository"


def _options(func) -> set[str]:
    parser = func.parser
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--") and s != "--help"}


def _table_row(magic: str) -> str:
    row = next((ln for ln in NOTEBOOKS_PAGE.splitlines() if ln.startswith(f"| `{magic}` |")), None)
    assert row is not None, f"the magics table of docs/notebooks.md has no row for {magic}"
    return row


def test_magics_table_lists_every_option_and_every_setting():
    from tfos_nb.magics._magics import TFOSMagics
    from tfos_nb.tensorboard.proxy._handlers import TensorBoardProxy

    magics = {
        "%%tfos_cluster": TFOSMagics.tfos_cluster, "%%tfos_parallel": TFOSMagics.tfos_parallel, "%tfos_logs": TFOSMagics.tfos_logs,
        "%tfos_shutdown": TFOSMagics.tfos_shutdown, "%tfos_tensorboard": TFOSMagics.tfos_tensorboard,
    }
    magics["%tfos_doctor"] = TFOSMagics.tfos_doctor
    for magic, func in magics.items():
        row = _table_row(magic)
        missing = [opt for opt in sorted(_options(func)) if f"`{opt}" not in row]
        assert not missing, f"docs/notebooks.md's row for {magic} does not list {missing}"
    _table_row("%tfos_status")
    for name, trait in TFOSMagics.class_traits(config=True).items():
        row = f"| `TFOSMagics.{name}` | `{_shown(trait.default_value)}` |"
        assert row in CONFIG_PAGE, f"the configuration page's settings table has no row starting {row}"
    for name, trait in TensorBoardProxy.class_traits(config=True).items():
        row = f"| `c.TensorBoardProxy.{name}` | `{_shown(trait.default())}` |"
        assert row in CONFIG_PAGE, f"the configuration page's server settings have no row starting {row}"


def _shown(value: object) -> str:
    """A default as the tables write it: strings in double quotes, the rest as Python writes them."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def test_every_environment_variable_is_on_the_configuration_page():
    names = set()
    for path in (REPO / "tfos_nb").rglob("*.py"):
        names |= set(re.findall(r"\bTFOS_[A-Z][A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")))
    assert "TFOS_NB_LOG_LEVEL" in names  # the scan finds what it should
    missing = sorted(n for n in names if f"`{n}`" not in CONFIG_PAGE)
    assert not missing, f"docs/reference/configuration.md does not list {missing}"


# -- running the runnable blocks --------------------------------------------------------------
@pytest.fixture(scope="module")
def given(tmp_path_factory):
    """What a reader has when the README's first example runs: a SparkContext, args, a DataFrame."""
    from tests.conftest import spark_session
    from tfos_nb.examples import digits

    spark = spark_session(2)
    x, y, _, _ = digits.load_digits_arrays()
    export = tmp_path_factory.mktemp("readme") / "export"
    yield {"sc": spark.sparkContext, "args": {"epochs": 1, "export_dir": str(export)},
           "train_df": digits.to_dataframe(spark, x[:400], y[:400], partitions=2)}
    spark.stop()


@pytest.mark.slow
def test_runnable_blocks_run(given, no_leaks):
    runnable = [(code, names) for code, names in blocks("python") if names is not None]
    assert runnable, "no README or docs block is marked to run"
    for code, names in runnable:
        assert set(names) <= set(given), f"the test does not provide {set(names) - set(given)}"
        namespace = {"__name__": "__readme__", **{k: given[k] for k in names}}
        exec(compile(code, "README.md", "exec"), namespace)  # the README's (or a page's) own example
    export = Path(given["args"]["export_dir"])
    assert (export / "saved_model.pb").is_file(), sorted(p.name for p in export.parent.iterdir())
