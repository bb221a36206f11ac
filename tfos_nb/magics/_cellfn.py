"""Turn a ``%%tfos_cluster`` cell into a node function ``(args, ctx)`` shipped by value.

The cell body is compiled as the body of ``def <cell>(args, ctx)``.  The
notebook names it reads are found from the bytecode (``LOAD_GLOBAL``), followed
into functions defined in the notebook, and each one is pickled on its own so
that an object that cannot travel is reported by name.  The function is then
pickled once, at cell time: the nodes run a snapshot of the notebook, not
whatever the names hold when a background cluster gets to start.

This module is also imported on the nodes (``CellFunction`` is unpickled
there), so it imports nothing from IPython.
"""

from __future__ import annotations

import ast
import builtins
import dis
import linecache
import types
from collections.abc import Iterator, Mapping
from typing import Any

CELL_FUNCTION = "tfos_cell"
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})


class CellError(ValueError):
    """The cell cannot become a node function; the message says why (shown as a UsageError)."""


class CellFunction:
    """What the nodes call: unpickles the cell's function and runs it.

    Carrying the source lets node tracebacks show the cell's lines.
    """

    def __init__(self, blob: bytes, filename: str, source: str) -> None:
        self.blob = blob
        self.filename = filename
        self.source = source

    def __call__(self, args: Any, ctx: Any) -> Any:
        import cloudpickle

        lines = self.source.splitlines(True)
        linecache.cache[self.filename] = (len(self.source), None, lines, self.filename)
        fn = cloudpickle.loads(self.blob)
        return fn(args, ctx)

    def __repr__(self) -> str:
        return f"<node function {self.filename}, {len(self.blob)} bytes>"


def global_names(code: types.CodeType) -> set[str]:
    """Names ``code`` (and every function, class or comprehension inside it) reads as globals."""
    names: set[str] = set()
    for c in _walk_code(code):
        for ins in dis.get_instructions(c):
            if ins.opname in _GLOBAL_OPS and isinstance(ins.argval, str):
                names.add(ins.argval)
    return names


def _walk_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk_code(const)


def compile_cell(source: str, filename: str) -> types.CodeType:
    """The module code that defines ``tfos_cell(args, ctx)`` with the cell as its body."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        msg = f"the cell is not valid Python: line {exc.lineno}: {exc.msg}"
        raise CellError(msg) from None
    if not tree.body:
        msg = "the cell is empty: write the node function's body (it sees `args` and `ctx`) below the magic line"
        raise CellError(msg)
    wrapper = ast.parse(f"def {CELL_FUNCTION}(args, ctx):\n    pass\n")
    fn_def = wrapper.body[0]
    assert isinstance(fn_def, ast.FunctionDef)
    fn_def.body = tree.body
    ast.fix_missing_locations(wrapper)
    try:
        return compile(wrapper, filename, "exec")
    except SyntaxError as exc:  # e.g. a `nonlocal` at top level
        msg = f"the cell cannot be a function body: line {exc.lineno}: {exc.msg}"
        raise CellError(msg) from None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _describe(value: Any) -> str:
    if isinstance(value, type):
        return "a class"
    if isinstance(value, types.FunctionType):
        return "a function"
    cls = type(value)
    return f"a {cls.__qualname__}" if cls.__module__ == "builtins" else f"a {cls.__module__}.{cls.__qualname__}"


def snapshot(names: set[str], namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook values the cell needs, each checked to pickle; raises CellError naming the culprit.

    Functions defined in the notebook are followed, so a helper that uses an
    unpicklable global is reported as ``x (used by helper)``.
    """
    import cloudpickle

    taken: dict[str, Any] = {}
    checked: set[str] = set()

    def check(name: str, user: str | None) -> None:
        if name in checked or name not in namespace:
            return  # a builtin, or a NameError the node will report like Python would
        checked.add(name)
        value = namespace[name]
        fn_code = getattr(value, "__code__", None)
        if isinstance(fn_code, types.CodeType) and getattr(value, "__globals__", None) is namespace:
            for inner in sorted(global_names(fn_code)):
                check(inner, name)  # name the innermost culprit, not the function that uses it
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
            who = f"`{name}`" + (f" (used by `{user}`)" if user else "")
            msg = (
                f"cannot ship {who} to the nodes: {_describe(value)} cannot be pickled ({_reason(exc)}); "
                "create it inside the cell instead"
            )
            raise CellError(msg) from None

    for name in sorted(names):
        check(name, None)
        if name in namespace:
            taken[name] = namespace[name]
    return taken


def build(source: str, namespace: Mapping[str, Any], label: str, magic: str = "tfos_cluster") -> tuple[CellFunction, list[str]]:
    """The node function for a cell, and the notebook names it took along (tracebacks show ``<%%magic label>``)."""
    import cloudpickle

    filename = f"<%%{magic} {label}>"
    code = compile_cell(source, filename)
    names = global_names(code) - {CELL_FUNCTION}
    taken = snapshot(names, namespace)
    glb: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins, **taken}
    exec(code, glb)  # noqa: S102 - defines the function only; the body runs on the nodes
    fn = glb[CELL_FUNCTION]
    try:
        blob = cloudpickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001
        msg = f"cannot ship the cell to the nodes: {_reason(exc)}"
        raise CellError(msg) from None
    return CellFunction(blob, filename, source), sorted(taken)
