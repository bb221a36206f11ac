"""Patching a module as it is imported: how a node keeps MLflow's hands off what it must not touch.

:func:`patch_modules` runs a function on each module of a set right after the module executes (and on those
imported already), through one finder at the head of ``sys.meta_path``.  The node's MLflow rules use it
(:mod:`.tracking.node`: autologging off on nodes that do not log; :mod:`.tracking.datasets`: no iteration of a
stream-fed dataset): nothing of MLflow is imported until the node's own code imports it.  The patches replace
functions with :func:`replace_once` (also :mod:`.keras_node.epochs` and :mod:`.keras3_mwms`, Keras' repairs).
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ORIGINAL", "patch_modules", "replace_once"]

Patch = Callable[[Any], object]  # what it returns is ignored
ORIGINAL = "_tfos_nb_original"  # on a replacement: the function it replaced


def replace_once(owner: Any, name: str, repair: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Set ``owner.name`` to ``repair(function)`` unless it is a replacement already (which keeps the function it
    replaced as :data:`ORIGINAL`, its docstring too); False when ``owner`` has no such function."""
    try:
        original = getattr(owner, name, None)
    except Exception:  # noqa: BLE001 - a lazy attribute that fails to load: nothing to replace
        return False
    if not callable(original):
        return False
    if not hasattr(original, ORIGINAL):
        fn = repair(original)
        fn.__doc__ = original.__doc__
        setattr(fn, ORIGINAL, original)
        setattr(owner, name, fn)
    return True


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs each registered patch on a module right after it executes, for the modules the patch wants."""

    def __init__(self) -> None:
        self.patches: list[tuple[Callable[[str], bool], Patch]] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        wanted = [patch for wants, patch in self.patches if wants(fullname)]
        if not wanted:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is not None:
            def exec_module(module: Any) -> None:
                run(module)
                for patch in wanted:
                    patch(module)

            loader.exec_module = exec_module  # type: ignore[union-attr,method-assign]  # this spec's own loader instance
        return spec


_ON_IMPORT = _PatchOnImport()  # the one finder: patches never search each other


def patch_modules(wants: Callable[[str], bool], patch: Patch) -> None:
    """From now on in this process, ``patch`` every module whose name ``wants`` accepts as it is imported, and
    those imported already (once per ``patch``)."""
    if _ON_IMPORT not in sys.meta_path:
        sys.meta_path.insert(0, _ON_IMPORT)
    if all(p is not patch for _, p in _ON_IMPORT.patches):
        _ON_IMPORT.patches.append((wants, patch))
    for name, module in list(sys.modules.items()):
        if module is not None and wants(name):
            patch(module)
