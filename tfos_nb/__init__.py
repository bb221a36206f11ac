"""tfos_nb: distributed TensorFlow on Apache Spark, driven from Python or a notebook.

``from tfos_nb import TFCluster, TFNode, TFParallel`` gives TensorFlowOnSpark's API on the
bundled runtime.  Submodules load lazily, so importing tfos_nb (as the node
processes do) pulls in neither pyspark nor TensorFlow nor IPython.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from .runtime import logs as _logs  # stdlib only: the level set by TFOS_NB_LOG_LEVEL, if any

_logs.from_env()
__all__ = ["TFCluster", "TFNode", "TFParallel", "compat", "dfutil", "doctor", "util", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "doctor":  # the pre-flight checks: tfos_nb.doctor(spark, nodes=N)
        from .runtime.doctor.job import doctor

        return doctor
    if name in ("TFCluster", "TFNode", "TFParallel", "compat", "dfutil", "util"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext tfos_nb``: the ``%%tfos_cluster`` magics (IPython is imported only now)."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext tfos_nb``: stop this kernel's clusters and remove the magics."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)
