"""The maps match the tree: the architecture page's folder table names every module of the package in its
folder's row, the contributing guide's layout every folder, and every module path the docs name exists (a moved
or deleted module fails here first)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tfos_nb"
ARCHITECTURE = REPO / "docs" / "architecture.md"
CONTRIBUTING = REPO / "docs" / "contributing.md"


def package_folders() -> dict[str, set[str]]:
    """Each folder of the package holding Python modules (``tfos_nb/runtime/driver/``), with its modules'
    file names (``__init__.py`` left out: a package's own module is named only where it holds more than a
    docstring)."""
    folders: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        folder = f"{path.parent.relative_to(REPO).as_posix()}/"
        folders.setdefault(folder, set())
        if path.name != "__init__.py":
            folders[folder].add(path.name)
    return folders


def folder_table(page: str) -> dict[str, set[str]]:
    """The ``## Folders`` section's table: each row's folder (first cell) and the module file names its
    second cell names in backticks (``a.py``; names with a folder, ``x/y.py``, point elsewhere)."""
    section = page.split("\n## Folders\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not re.fullmatch(r"`tfos_nb/[\w/]*`", cells[0]):
            continue
        folder = cells[0].strip("`")
        assert folder not in rows, f"{folder} has two rows"
        rows[folder] = set(re.findall(r"`(\w+\.py)`", cells[1])) - {"__init__.py"}
    return rows


def named_paths(page: str) -> set[str]:
    """Every ``folder/module.py`` the page names in backticks (``runtime/driver/job.py: DriverJob`` too)."""
    return set(re.findall(r"`((?:[\w.]+/)+\w+\.py)\b", page))


def exists_in_package(path: str) -> bool:
    """Whether ``path`` names a file: from the repository's root, or as the docs abbreviate a module of the package
    (``connect/job.py`` for ``tfos_nb/runtime/driver/connect/job.py``: some module's path ends with it)."""
    if (REPO / path).is_file():  # a path from the repository's root (``tests/test_wings.py``)
        return True
    return any(p.relative_to(REPO).as_posix().endswith("/" + path) for p in PACKAGE.rglob("*.py"))


def test_the_folder_table_names_every_module_in_its_folder():
    table, tree = folder_table(ARCHITECTURE.read_text()), package_folders()
    assert "tfos_nb/runtime/driver/control/" in table  # the table as read (a renamed section would pass vacuously)
    assert sorted(set(tree) - set(table)) == [], "a folder with no row in docs/architecture.md's folder table"
    assert sorted(set(table) - set(tree)) == [], "a row for a folder that does not exist"
    unnamed = {folder: sorted(tree[folder] - table[folder]) for folder in tree if tree[folder] - table[folder]}
    assert unnamed == {}, "modules the folder table does not name in their folder's row"
    stale = {folder: sorted(table[folder] - tree[folder]) for folder in table if table[folder] - tree[folder]}
    assert stale == {}, "modules the folder table names that are not in that folder"


def test_every_module_path_the_docs_name_exists():
    """Not only the maps: every page of the docs and the README."""
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    assert ARCHITECTURE in pages and len(named_paths(ARCHITECTURE.read_text())) > 20
    for page in pages:
        stale = sorted(p for p in named_paths(page.read_text()) if not exists_in_package(p))
        assert stale == [], f"{page.name} names modules that do not exist"


def layout_folders(page: str) -> set[str]:
    """The package folders the contributing guide's layout block names (``  driver/`` under ``tfos_nb/runtime/``,
    by its indentation)."""
    block = page.split("\n## Layout\n", 1)[1].split("```", 2)[1]
    folders: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder) of the enclosing folders
    for line in block.splitlines():
        match = re.match(r"( *)([\w/]+/)\s", line + " ")
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        folder = (stack[-1][1] if stack else "") + name
        stack.append((indent, folder))
        if folder.startswith("tfos_nb/"):
            folders.add(folder)
    return folders


def test_the_contributing_layout_names_every_package_folder():
    named, tree = layout_folders(CONTRIBUTING.read_text()), set(package_folders())
    assert "tfos_nb/runtime/executor/feed/" in named  # the block as read
    assert sorted(tree - named - {"tfos_nb/"}) == [], "package folders docs/contributing.md's layout leaves out"
    assert sorted(named - tree) == [], "folders docs/contributing.md's layout names that do not exist"


def test_the_readers_fail_on_a_stale_map():
    """The readers catch what they guard against: a row missing a module, a module named twice over, a stale path."""
    page = ("# x\n\n## Folders\n\n| Folder | What |\n|---|---|\n| `tfos_nb/runtime/driver/control/` | `controller.py`, "
            "`gone.py` |\n\n## Next\n`runtime/executor/tensorboard.py`\n")
    assert folder_table(page) == {"tfos_nb/runtime/driver/control/": {"controller.py", "gone.py"}}
    assert named_paths(page) == {"runtime/executor/tensorboard.py"}
    assert not exists_in_package("runtime/executor/tensorboard.py")
    assert exists_in_package("connect/job.py") and exists_in_package("tfos_nb/runtime/driver/control/state.py")
    assert layout_folders("\n## Layout\n\n```\ntfos_nb/runtime/  x\n  driver/  y\n    control/  z\n  batches/  w\n```\n") \
        == {"tfos_nb/runtime/", "tfos_nb/runtime/driver/", "tfos_nb/runtime/driver/control/", "tfos_nb/runtime/batches/"}
