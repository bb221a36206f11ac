"""How many TensorFlow threads a node or run process gets by default.

Spark gives a task ``spark.task.cpus`` cores of its executor (and sets
``OMP_NUM_THREADS`` to that for Python workers); a node or a parallel run is
one such task for its whole life, so its TensorFlow gets that many intra-op
threads (inter-op one more), at most the executor's cores and the CPUs this
process may run on.  On the embedded ``local-cluster[N,1,...]`` that is 1; on
a cluster with ``spark.task.cpus`` = ``spark.executor.cores`` (one node per
executor, TensorFlowOnSpark's advice) it is the whole executor.

Overrides, in order: ``TF_NUM_INTRAOP_THREADS`` already in the environment
(``spark.executorEnv.*``, ``run(env=...)``, ``TFOSMagics.tf_threads``) is kept;
``TFOS_TF_THREADS=N`` asks for N threads, ``TFOS_TF_THREADS=0`` for
TensorFlow's own default (every core of the machine).
"""

from __future__ import annotations

import os
from typing import Any

from ... import procs

ENV_VAR = "TFOS_TF_THREADS"


def executor_cores(jvm_pid: int | None) -> int | None:
    """The executor's cores from its JVM's command line (``--cores N`` of Spark's executor backends)."""
    if jvm_pid is None:
        return None
    try:
        with open(f"/proc/{jvm_pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    return cores_from_cmdline(args)


def cores_from_cmdline(args: list[bytes]) -> int | None:
    for i, arg in enumerate(args[:-1]):
        if arg == b"--cores":
            try:
                return int(args[i + 1]) or None
            except ValueError:
                return None
    return None


def derive(task_cpus: int | None, exec_cores: int | None, usable_cpus: int) -> int:
    """Intra-op threads for a process that holds one task of ``task_cpus`` cores."""
    threads = max(1, int(task_cpus or 1))
    if exec_cores:
        threads = min(threads, exec_cores)
    return max(1, min(threads, usable_cpus))


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def thread_env(env: dict[str, str], task_cpus: int | None) -> dict[str, str]:
    """What to add to a TensorFlow child's ``env`` for its thread pools (nothing when it is set already)."""
    if "TF_NUM_INTRAOP_THREADS" in env:
        return {}
    asked = env.get(ENV_VAR, "").strip()
    if asked == "0":
        return {}
    if asked:
        threads = max(1, int(asked))
    else:
        threads = derive(task_cpus, executor_cores(procs.executor_jvm_pid()), usable_cpus())
    out = {"TF_NUM_INTRAOP_THREADS": str(threads), "TF_NUM_INTEROP_THREADS": str(threads + 1)}
    if "OMP_NUM_THREADS" not in env:
        out["OMP_NUM_THREADS"] = str(threads)
    return out


def task_cpus(tctx: Any) -> int | None:
    """``spark.task.cpus`` as the running task sees it (``TaskContext.cpus()``, PySpark 3.3+)."""
    try:
        return int(tctx.cpus())
    except Exception:  # noqa: BLE001 - an older PySpark: derive() takes 1
        return None
