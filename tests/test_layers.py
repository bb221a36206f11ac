"""The package's layer rules, import cycles and module sizes, read from the source with ``ast``.

Why a test over ``ast`` rather than import-linter: no extra dependency (the rules run in the
fast tier wherever the suite runs), imports under ``if TYPE_CHECKING:`` are skipped exactly,
lazy imports inside functions are seen (a layer rule holds for them too), and the known
exceptions sit next to the rules with the reason they are there.

Each rule is checked on the *direct* imports of every module (module level and inside
functions).  Packages that must load in a process without Spark or TensorFlow (TensorBoard's proxy in
the Jupyter server, ``widgets`` in the kernel) are also checked on everything their
module-level imports pull in, through other tfos_nb modules; the runtime's own processes
(``python -m tfos_nb.runtime ROLE``) on everything they may import, inside functions too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tfos_nb"

#: a review threshold, not a budget: a module past it is split along a noun, or listed in LONG_BECAUSE with why
#: its one concern is that long (a module cut to fit a number is worse than a long one)
MAX_LINES = 400
LONG_BECAUSE: dict[str, str] = {
    "tfos_nb/magics/_magics.py": "the magics' argument declarations and docstrings are their %magic? help: "
                                 "one class IPython registers, each magic a thin call into the handles",
    "tfos_nb/runtime/driver/control/state.py": "one cluster's state: the mutable node and cluster records "
                                       "under the one lock every reader waits on, and its frozen views, which "
                                       "the widgets import from this module only (their layering rule)",
    "tfos_nb/runtime/driver/control/controller.py": "the one writer of a cluster's state: a handler per control message "
                                            "and every transition the driver asks for, each a few lines",
    "tfos_nb/runtime/executor/feed/hub.py": "one queue under one condition: the feeders' puts, deterministic mode's "
                                            "read-back of spilled partitions, the reader's take/peek and the "
                                            "end-of-data rules all wait on it (the epochs' bookkeeping it consults "
                                            "is feed/epochs.py; what needs no lock is in feed_plan and feed_turns)",
}

#: the same threshold for the tests (``tests/``, helper modules and conftest files included): a module past it is
#: split along what it tests, or listed here with the one subject it tests and why that does not cut along a noun
TESTS = PACKAGE.parent / "tests"
LONG_TESTS_BECAUSE: dict[str, str] = {
    "tests/hub_fixture.py": "the whole real hub the multi-user tests drive, one harness: its Unix users, its Spark "
                            "standalone cluster run by a service account, the hub and its proxy, an MLflow server, "
                            "logins, and a kernel driven over the proxy's websocket with every wait bound; split it "
                            "when a second hub test module needs only a part",
    "tests/conftest.py": "not one subject: every module's shared fixtures and helpers, where pytest finds them "
                         "(Spark and Spark Connect sessions that consecutive modules share, with the collection "
                         "hook that orders modules for it; kernels; waits; leak checks); its session machinery "
                         "could move to a support module, which 40-odd modules import from here today",
    "tests/test_faults.py": "the fault suite (issue 7), one module on purpose: its module fixture gathers each fault's "
                            "measured figure into test-output/reliability.md, the one table the docs' reliability "
                            "page quotes from a run of this module; each fault is one test with its node function",
    "tests/test_live_view.py": "one feature, the live view, fast tier: a node's phase (from its threads' frames, or "
                               "from a stack dump when frozen), the stall flag the driver derives from the phases, "
                               "stack dumps over heartbeats, and what the mirror, the panel and %tfos_stack show; "
                               "the fake libraries and the controller on a fake clock serve every part",
    "tests/test_magics.py": "the IPython layer through one real shell (the module's ip) and one Spark session the "
                            "magics find in it (magic_spark): bad input, the cell as a node function, configuration, "
                            "then each magic end to end; split by magic, each module would start that session again",
    "tests/test_parallel.py": "one feature, parallel runs, through both its entry points (TFParallel and "
                              "%%tfos_parallel) on one shared Spark session: the fast checks, then the runs end to "
                              "end (a grid, ctx, a failing run, KeyboardInterrupt, the magic, the notebook)",
    "tests/test_pipeline_modes.py": "TFEstimator's Params end to end: half the module is the node functions the fits "
                                    "run (executors take them by value from this module) and the helpers (TFRecords, "
                                    "serving, start listeners) that several Params' tests share",
    "tests/test_runtime_spark.py": "TFCluster.run end to end on one local-cluster session: the strategies and input "
                                   "modes, then errors and teardown, GPUs, TensorBoard; a split between training and "
                                   "errors/teardown would share the session at no cost (same spark_fixture key), "
                                   "left whole while issue 29's driver rework runs it as its check",
    "tests/test_tracking.py": "one feature, MLflow tracking, against one real mlflow server and one real kernel "
                              "(module fixtures): most of the module is the cells one notebook session runs in "
                              "turn (a cluster, autolog, a failing node, a killed one, a sweep, an estimator, "
                              "retries, a background cell) and the checks of the runs each one logged",
}

#: dependency cycles allowed (none since issue 13), including ones an import inside a function hides
#: from Python's import machinery; each a frozenset of modules
KNOWN_CYCLES: set[frozenset[str]] = set()


@dataclass(frozen=True)
class Import:
    source: str  #: the importing module
    target: str  #: the imported module (a tfos_nb submodule when the name is one, else the package)
    module_level: bool  #: runs when ``source`` is imported (not inside a function)
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def scan(root: Path = PACKAGE) -> list[Import]:
    """Every import in the package under ``root``, relative ones resolved; ``if TYPE_CHECKING`` skipped."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    found: list[Import] = []
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

        def visit(node: ast.AST, module_level: bool, mod: str = mod, package: str = package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_checking(child.test):
                    for stmt in child.orelse:
                        visit(ast.Module(body=[stmt], type_ignores=[]), module_level)
                elif isinstance(child, ast.Import):
                    found.extend(Import(mod, a.name, module_level, child.lineno) for a in child.names)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        origin = ".".join(base + ([child.module] if child.module else []))
                    else:
                        origin = child.module or ""
                    for alias in child.names:
                        sub = f"{origin}.{alias.name}"
                        found.append(Import(mod, sub if sub in files else origin, module_level, child.lineno))
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, False)
                else:
                    visit(child, module_level)

        visit(ast.parse(path.read_text(), str(path)), True)
    return found


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(imports: list[Import], sources: tuple[str, ...], forbidden: tuple[str, ...],
               allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(str(i) for i in imports
                  if _under(i.source, sources) and _under(i.target, forbidden) and not _under(i.target, allowed))


def reachable(imports: list[Import], start: str, module_level_only: bool = True) -> dict[str, list[str]]:
    """Modules (tfos_nb or third-party) that importing ``start`` loads, each with the import chain to it.

    A module's parent packages count as loaded by it (Python imports ``a.b`` before ``a.b.c``).  With
    ``module_level_only=False``, imports inside functions are followed too (what a module may load once
    its functions run), except a package's that is only loaded as a parent: importing a submodule runs
    none of its functions.
    """
    at_import: dict[str, set[str]] = {}
    inside: dict[str, set[str]] = {}
    for i in imports:
        (at_import if i.module_level else inside).setdefault(i.source, set()).add(i.target)
    paths = {start: [start]}
    todo, seen = [(start, True)], {(start, True)}
    while todo:
        mod, imported = todo.pop()
        targets = at_import.get(mod, set()) | (inside.get(mod, set()) if imported and not module_level_only else set())
        parent = mod.rpartition(".")[0]
        for target, how in sorted({(t, True) for t in targets} | ({(parent, False)} if parent else set())):
            if (target, how) not in seen and (target, True) not in seen:
                seen.add((target, how))
                paths.setdefault(target, [*paths[mod], target])
                todo.append((target, how))
    return paths


def cycles(imports: list[Import], module_level_only: bool = True) -> set[frozenset[str]]:
    """The strongly connected components (size > 1) of the import graph inside the package.

    A package's ``__init__`` is not counted as imported by its submodules (Python imports it
    first, so a package re-exporting its own modules is no cycle).
    """
    internal = {i.source for i in imports}
    edges: dict[str, set[str]] = {m: set() for m in internal}
    for i in imports:
        if (i.module_level or not module_level_only) and i.target in internal and i.target != i.source:
            edges[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def strongconnect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return found


IMPORTS = scan()
RUNTIME = "tfos_nb.runtime"
DRIVER = "tfos_nb.runtime.driver"
EXECUTOR = "tfos_nb.runtime.executor"
PROTOCOL = "tfos_nb.runtime.protocol"
SHARED = tuple(f"tfos_nb.runtime.{m}" for m in ("args", "columns", "gpus", "net", "procs", "results", "util"))
NOTEBOOK_TB = "tfos_nb.tensorboard"  # TensorBoard's kernel side, HTML and Jupyter server proxy
PROXY = ("tfos_nb.tensorboard.proxy", "tfos_nb.tbproxy")  # the extension, and the name users enable it by



# -- the scanner itself -------------------------------------------------------------------------


def test_scanner_resolves_relative_imports_and_skips_type_checking(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nfrom .sub import c as renamed\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
                              "else:\n    import json\ndef f():\n    import pyspark\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\n")
    (pkg / "sub" / "c.py").write_text("from ..b import f\ndef g():\n    from .. import a\n")
    found = {(i.source, i.target, i.module_level) for i in scan(pkg)}
    assert found == {
        ("pkg.a", "pkg.b", True), ("pkg.a", "pkg.sub.c", True), ("pkg.b", "typing", True),
        ("pkg.b", "json", True), ("pkg.b", "pyspark", False), ("pkg.sub", "pkg.a", True), ("pkg.sub.c", "pkg.b", True),
        ("pkg.sub.c", "pkg.a", False),
    }
    assert cycles(scan(pkg)) == set()
    assert cycles(scan(pkg), module_level_only=False) == {frozenset({"pkg.a", "pkg.sub.c"})}
    assert violations(scan(pkg), ("pkg.b",), ("pyspark",)) == ["pkg.b:7 imports pyspark"]
    assert {"pkg.sub", "pkg.a"} <= set(reachable(scan(pkg), "pkg.sub.c"))  # through the parent package
    assert "pyspark" not in reachable(scan(pkg), "pkg.b")
    assert reachable(scan(pkg), "pkg.b", module_level_only=False)["pyspark"] == ["pkg.b", "pyspark"]


def test_scanner_sees_the_package():
    edges = {(i.source, i.target) for i in IMPORTS}
    assert ("tfos_nb.runtime.batches.results", "tfos_nb.runtime.batches.columns") in edges
    assert ("tfos_nb.runtime.protocol.channel", "tfos_nb.runtime.protocol.messages") in edges
    assert len({i.source for i in IMPORTS}) > 50


# -- the layer rules ----------------------------------------------------------------------------


def test_runtime_imports_no_notebook_layer():
    """The runtime runs in Spark tasks and plain Python: no IPython, magics, widgets or Jupyter server side."""
    assert violations(IMPORTS, (RUNTIME,), ("tfos_nb.magics", "tfos_nb.widgets", NOTEBOOK_TB, *PROXY, "IPython",
                                            "ipywidgets", "ipykernel", "jupyter_server")) == []


def test_executor_does_not_import_driver():
    """Executor code (Spark tasks, supervisors, nodes) reaches the driver only over the wire."""
    assert violations(IMPORTS, (EXECUTOR,), (DRIVER,)) == []


def test_protocol_imports_neither_side():
    assert violations(IMPORTS, (PROTOCOL,), (DRIVER, EXECUTOR)) == []


#: shared runtime modules allowed to import a side (none since issue 13)
KNOWN_SHARED_TO_SIDE: set[str] = set()


def test_shared_runtime_modules_import_neither_side():
    found = set(violations(IMPORTS, SHARED, (DRIVER, EXECUTOR)))
    assert found - KNOWN_SHARED_TO_SIDE == set()
    assert KNOWN_SHARED_TO_SIDE - found == set(), "fixed: remove it from KNOWN_SHARED_TO_SIDE"


def test_tbproxy_loads_neither_spark_nor_tensorflow():
    """The proxy runs inside the Jupyter server (and the rest of the notebook's TensorBoard package, which it
    shares, in the kernel): none imports either, directly or through tfos_nb modules."""
    heavy = ("pyspark", "tensorflow", "py4j", "tf_keras", "keras")
    assert violations(IMPORTS, (NOTEBOOK_TB, *PROXY), heavy) == []
    assert {f"{PROXY[0]}._handlers", PROXY[1]} <= {i.source for i in IMPORTS}
    for mod in sorted({i.source for i in IMPORTS if _under(i.source, (NOTEBOOK_TB, *PROXY))}):
        loaded = reachable(IMPORTS, mod)
        assert [path for name, path in loaded.items() if _under(name, heavy)] == [], mod


def test_the_coordinator_loads_neither_spark_nor_tensorflow():
    """Spark Connect's coordinator (``python -m tfos_nb.runtime coordinator``) is the driver's control plane in a
    bare process on an executor: its module-level imports, through other tfos_nb modules, load neither."""
    heavy = ("pyspark", "tensorflow", "py4j", "tf_keras", "keras")
    loaded = reachable(IMPORTS, f"{DRIVER}.connect.coordinator")
    assert f"{DRIVER}.control.controller" in loaded  # the scan sees it (a renamed module would make this pass vacuously)
    assert [path for name, path in loaded.items() if _under(name, heavy)] == []
    # nor the notebook's side of a cluster, even inside a function: it hosts the control plane, not a TFCluster
    everything = reachable(IMPORTS, f"{DRIVER}.connect.coordinator", module_level_only=False)
    assert [path for name, path in everything.items() if name in (f"{DRIVER}.cluster", f"{DRIVER}.launch.start")] == []


def _entry_points() -> dict[str, str]:
    """Role -> module of ``python -m tfos_nb.runtime ROLE``, read from ``runtime/__main__.py``'s dispatch."""
    roles = {}
    for node in ast.walk(ast.parse((PACKAGE / "runtime" / "__main__.py").read_text())):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            role = node.test.comparators[0]
            targets = [s.module for s in node.body if isinstance(s, ast.ImportFrom)]
            if isinstance(role, ast.Constant) and targets:
                roles[role.value] = targets[0]
    return roles


def test_subprocess_entry_points_load_no_notebook_layer_nor_tensorflow():
    """The runtime's own processes (supervisor, node, parallel run, Spark Connect's coordinator) start bare on
    executors: nothing they import, even inside functions, loads IPython, Jupyter or tfos_nb's notebook layer.
    The supervisor and the coordinator never load TensorFlow; a node and a run load it only when they run the
    user's code (TensorFlow fixes its devices and threads at its first import: the process sets them first)."""
    notebook = ("tfos_nb.magics", "tfos_nb.widgets", NOTEBOOK_TB, *PROXY, "IPython", "ipywidgets", "ipykernel",
                "jupyter_server", "jupyter_client", "jupyter_core")
    tensorflow = ("tensorflow", "tf_keras", "keras")
    roles = _entry_points()
    assert set(roles) == {"supervisor", "node", "run", "coordinator"}  # the dispatch as read; a new role: add it
    for role, module in roles.items():
        everything = reachable(IMPORTS, module, module_level_only=False)
        assert [path for name, path in everything.items() if _under(name, notebook)] == [], role
        loaded = reachable(IMPORTS, module) if role in ("node", "run") else everything
        assert [path for name, path in loaded.items() if _under(name, tensorflow)] == [], role


def test_widgets_are_views():
    """Widgets render frozen state: no Spark, no TensorFlow, no driver machinery.

    Of the runtime, a widget may import only ``tfos_nb.runtime.driver.control.state`` (the frozen
    ``ClusterView``/``NodeView`` it renders; today the widgets take them untyped and import no
    runtime module at all).  Of the rest of tfos_nb: itself and ``tfos_nb.tensorboard`` (links).
    """
    heavy = ("pyspark", "tensorflow", "py4j", "tf_keras", "keras")
    assert violations(IMPORTS, ("tfos_nb.widgets",), heavy) == []
    assert violations(IMPORTS, ("tfos_nb.widgets",), ("tfos_nb",),
                      allowed=("tfos_nb.widgets", "tfos_nb.runtime.driver.control.state", "tfos_nb.tensorboard")) == []
    for mod in sorted({i.source for i in IMPORTS if _under(i.source, ("tfos_nb.widgets",))}):
        loaded = reachable(IMPORTS, mod)
        assert [path for name, path in loaded.items() if _under(name, heavy)] == [], mod


def test_no_import_cycles():
    """Module-level imports inside tfos_nb form no cycle (``if TYPE_CHECKING`` imports excepted)."""
    assert cycles(IMPORTS) == set()


def test_no_dependency_cycles():
    """Nor do all imports, those inside functions included: a lazy import is no way around a cycle."""
    found = cycles(IMPORTS, module_level_only=False)
    assert found - KNOWN_CYCLES == set()
    assert KNOWN_CYCLES - found == set(), "a known cycle is gone: remove it from KNOWN_CYCLES"


def _sizes(root: Path) -> dict[str, int]:
    """Lines of each Python file under ``root``, by its path from the repository root."""
    return {str(p.relative_to(root.parent)): len(p.read_text().splitlines()) for p in root.rglob("*.py")}


def test_a_module_past_the_review_threshold_says_why():
    sizes = _sizes(PACKAGE)
    large = {p for p, n in sizes.items() if n > MAX_LINES}
    assert sorted((p, sizes[p]) for p in large - set(LONG_BECAUSE)) == [], "split it, or say why in LONG_BECAUSE"
    assert sorted(set(LONG_BECAUSE) - large) == [], "no longer long: remove it from LONG_BECAUSE"


def test_a_test_module_past_the_review_threshold_says_why():
    """The same threshold for the tests (test modules, ``conftest.py`` files, their helper modules)."""
    sizes = _sizes(TESTS)
    assert "tests/test_layers.py" in sizes  # the scan sees the tests (a moved folder would make this pass vacuously)
    large = {p for p, n in sizes.items() if n > MAX_LINES}
    assert sorted((p, sizes[p]) for p in large - set(LONG_TESTS_BECAUSE)) == [], \
        "split it along what it tests, or say why in LONG_TESTS_BECAUSE"
    assert sorted(set(LONG_TESTS_BECAUSE) - large) == [], "no longer long: remove it from LONG_TESTS_BECAUSE"
