"""How many Spark task slots the application has, will have, and waiting for enough of them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ...sessions import is_connect

EXECUTOR_SETTLE_S = 5.0


def available_slots(sc: Any) -> tuple[int, int]:
    """(task slots, executors) the application has right now."""
    jsc = sc._jsc.sc()
    try:
        slots = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - older or newer Spark: fall back to the core count
        slots = int(sc.defaultParallelism)
    executors = max(0, len(jsc.statusTracker().getExecutorInfos()) - 1)  # the JVM's: pyspark < 4 has no Python one
    if sc.master.startswith("local") and not sc.master.startswith("local-cluster"):
        executors = 1
    return slots, executors


def fixed_slots(sc: Any) -> int | None:
    """Task slots of a master whose size is in its name (local-cluster[N,C,M], local[N], local)."""
    return master_slots(str(getattr(sc, "master", "")))


def conf_value(spark: Any, key: str) -> str | None:
    """A setting of a SparkContext, or of a SparkSession (classic or Spark Connect); None: unset, or hidden by a
    hosted session."""
    try:
        value = spark.getConf().get(key, None) if hasattr(spark, "getConf") else spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a hosted session may hide it
        return None
    return None if value is None else str(value)



def dynamic_allocation(spark: Any) -> bool:
    """Whether the session's executors come and go (``spark.dynamicAllocation.enabled``)."""
    return dynamic_in(lambda key: conf_value(spark, key))


def dynamic_in(conf: Callable[[str], str | None]) -> bool:
    """:func:`dynamic_allocation` from a reader of settings (a session's, or a test's dict)."""
    return str(conf("spark.dynamicAllocation.enabled") or "false").lower() == "true"


def connect_slots(spark: Any) -> tuple[int, int] | None:
    """(task slots, executors) as the session's configuration gives them, or None when it does not say.

    A Connect client cannot ask the scheduler, so this reads the master URL (``local[N]``,
    ``local-cluster[N,C,M]``) or a fixed ``spark.executor.instances`` × ``spark.executor.cores``.
    """
    if dynamic_allocation(spark):
        return None
    master = conf_value(spark, "spark.master") or ""
    cpus = max(1, int(conf_value(spark, "spark.task.cpus") or 1))
    match = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if match:
        return int(match.group(1)) * (int(match.group(2)) // cpus), int(match.group(1))
    match = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    if match:
        return int(match.group(1)) // cpus, 1
    if master == "local":
        return 1, 1
    instances, cores = conf_value(spark, "spark.executor.instances"), conf_value(spark, "spark.executor.cores")
    if instances and cores and instances.isdigit() and cores.isdigit():
        return int(instances) * (int(cores) // cpus), int(instances)
    return None


def session_master(spark: Any) -> str:
    """The master URL of a SparkContext, or of a Spark Connect session as its configuration says ("" if hidden)."""
    master = getattr(spark, "master", None)
    return str(master) if isinstance(master, str) else (conf_value(spark, "spark.master") or "")


def master_slots(master: str) -> int | None:
    match = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if match:
        return int(match.group(1)) * int(match.group(2))
    match = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    if match:
        return int(match.group(1))
    return 1 if master == "local" else None


def expected_slots(sc: Any) -> int | None:
    """Task slots this application will have once its executors are up, if the configuration says."""
    fixed = fixed_slots(sc)
    if fixed is not None:
        return fixed
    conf = sc.getConf()
    instances, cores = conf.get("spark.executor.instances", None), conf.get("spark.executor.cores", None)
    if instances and cores and str(instances).isdigit() and str(cores).isdigit():
        return int(instances) * int(cores) // max(1, int(conf.get("spark.task.cpus", "1") or 1))
    return None


def not_enough_executors(needed: int, slots: int, executors: str) -> str:
    return (
        f"not enough executors: asked for {needed} nodes, {slots} task slot(s) available "
        f"on {executors} executor(s). Start Spark with at least {needed} executor slots "
        "(e.g. --num-executors/--total-executor-cores, or master local-cluster[N,1,MB])."
    )


def settled_slots(sc: Any, needed: int, timeout: float,
                  cancelled: Callable[[], bool] = lambda: False) -> tuple[int, int]:
    """(task slots, executors) once ``needed`` tasks can run at once, or once no more will come.

    Executors register one by one, seconds apart on a busy machine: when the configuration
    says how many slots will come, wait for all of them (up to ``timeout``); otherwise until
    some executor is up and their number has stopped changing for ``EXECUTOR_SETTLE_S``
    (a standalone or YARN application that does not say its size).  Returns early when
    ``cancelled()``.
    """
    expected = expected_slots(sc)
    deadline = time.monotonic() + timeout
    last = None
    stable_since = time.monotonic()
    while True:
        slots, executors = available_slots(sc)
        if slots >= needed or cancelled():
            return slots, executors
        if (slots, executors) != last:
            last, stable_since = (slots, executors), time.monotonic()
        now = time.monotonic()
        if expected is not None:
            settled = slots >= expected  # every promised executor is up, and they are too few
        else:
            settled = executors > 0 and now - stable_since > EXECUTOR_SETTLE_S
        if settled or now > deadline:
            return slots, executors
        time.sleep(0.2)


def wait_for_slots(sc: Any, needed: int, timeout: float, cancelled: Callable[[], bool] = lambda: False) -> None:
    """Return when ``needed`` tasks can run at once; fail fast when they never will (see :func:`settled_slots`).

    Returns early when ``cancelled()`` (the caller then sees its job cancelled).
    """
    slots, executors = settled_slots(sc, needed, timeout, cancelled)
    if slots < needed and not cancelled():
        raise RuntimeError(not_enough_executors(needed, slots, str(executors)))


def driver_host(sc: Any) -> str:
    from ...net import resolve

    host = sc.getConf().get("spark.driver.host", None) or "127.0.0.1"
    return resolve(host)


def spark_context(spark: Any) -> Any:
    """The SparkContext of a classic SparkSession; anything else as it is."""
    if is_connect(spark):
        return spark
    inner = getattr(spark, "sparkContext", None)
    return inner if inner is not None and getattr(spark, "parallelize", None) is None else spark


def require_classic(sc: Any, needs: str) -> None:
    """tfos_nb runs on a classic SparkContext, not on Spark Connect."""
    if getattr(sc, "_jsc", None) is None:
        msg = (
            f"tfos_nb needs a classic SparkContext ({needs}); this session has none "
            "(Spark Connect?). Use a cluster with a full Spark driver."
        )
        raise TypeError(msg)


def spark_session(sc: Any) -> Any:
    """The SparkSession of ``sc`` (a Spark Connect session is one already), for the DataFrame stages both
    backends run alike (a barrier ``mapInArrow``)."""
    if is_connect(sc):
        return sc
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()  # the running SparkContext's (one per process)
