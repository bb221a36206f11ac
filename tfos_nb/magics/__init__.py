"""The IPython layer: ``%load_ext tfos_nb`` gives ``%%tfos_cluster``, ``%%tfos_parallel`` and friends.

Importing this package is light (the nodes import ``tfos_nb.magics._cellfn``
to run a cell's function); IPython is imported only by ``TFOSMagics``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ClusterFailed", "ClusterHandle", "ParallelFailed", "ParallelHandle", "RunFailed", "RunHandle", "TFOSMagics",
           "load_ipython_extension", "spark_session", "unload_ipython_extension"]

_LAZY = {
    "TFOSMagics": "._magics",
    "ClusterHandle": "._cluster_handle",
    "ClusterFailed": "._cluster_handle",
    "ParallelHandle": "._parallel_handle",
    "ParallelFailed": "._parallel_handle",
    "RunHandle": "._run_handle",
    "RunFailed": "._run_handle",
    "spark_session": "._spark",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and make ``TFOSMagics`` configurable (``%config``, ipython_config.py)."""
    from ._magics import TFOSMagics

    if "TFOSMagics" in ipython.magics_manager.registry:
        return
    ipython.register_magics(TFOSMagics(shell=ipython))


def unload_ipython_extension(ipython: Any) -> None:
    """Stop this kernel's clusters and remove the magics."""
    import atexit

    magics = ipython.magics_manager.registry.pop("TFOSMagics", None)
    if magics is None:
        return
    magics.shutdown_all()
    magics.detach()
    atexit.unregister(magics.shutdown_all)
    for kind, names in magics.magics.items():
        for name in names:
            ipython.magics_manager.magics[kind].pop(name, None)
    if magics in ipython.configurables:
        ipython.configurables.remove(magics)
