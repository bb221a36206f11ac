"""Which Spark executor this Python worker runs on, from what Spark tells its workers.

A module of its own, importing only the standard library: the doctor's probe travels *by value*
(``cloudpickle.register_pickle_by_value``) to executors that may lack tfos_nb, and takes this
function along by value too.
"""

from __future__ import annotations

import os
import re


def executor_id() -> str:
    """This executor's id, from what Spark tells its Python workers (or "" if unknown)."""
    for var in ("SPARK_LOG_URL_STDERR", "SPARK_LOG_URL_STDOUT"):
        match = re.search(r"executorId=([^&]+)", os.environ.get(var, ""))
        if match:
            return match.group(1)
    base = os.path.basename(os.getcwd())
    if base.isdigit():
        return base
    if os.environ.get("CONTAINER_ID"):  # YARN
        return os.environ["CONTAINER_ID"].rsplit("_", 1)[-1]
    return "driver" if os.environ.get("SPARK_PYTHON_RUNTIME") is None else ""
