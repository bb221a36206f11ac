"""The doctor's Spark side: the session's facts, and one barrier stage of probes (``doctor/probe.py``).

:func:`doctor`, the entry (``tfos_nb.doctor``), collects plain dicts; ``verdicts.py`` turns them into verdicts.  The stage is
a barrier ``mapPartitions`` on a classic session and a barrier ``mapInArrow`` on Spark
Connect; it runs under a job group (tag) of its own and is cancelled at its deadline.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import sys
import threading
import time
from importlib import metadata
from typing import Any

from ..driver.launch.resources import Resources, problems
from ..driver.launch.slots import conf_value, connect_slots, driver_host, expected_slots, settled_slots, spark_context
from ..sessions import is_connect
from . import Report
from .verdicts import verdicts

SLOTS_WAIT_S = 30.0  # executors still registering: wait at most this long for them (slots.settled_slots)


def driver_facts() -> dict[str, Any]:
    """This Python's versions (read from package metadata: TensorFlow is not imported here)."""
    package = sys.modules[__name__.split(".")[0]]  # tfos_nb, imported already (no import: no package cycle)
    out: dict[str, Any] = {"python": "%d.%d.%d" % sys.version_info[:3], "tfos_nb": package.__version__,
                           "executable": sys.executable, "pyspark_python_env": os.environ.get("PYSPARK_PYTHON")}
    for dist in ("tensorflow", "tensorflow-cpu", "keras", "tf_keras", "pyspark"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def session_facts(spark: Any, nodes: int) -> dict[str, Any]:
    """What the session says about its slots and settings (waits up to ``SLOTS_WAIT_S`` for executors still registering)."""
    sc = spark_context(spark)
    connect = is_connect(sc)
    keys = ("spark.master", "spark.dynamicAllocation.enabled", "spark.task.cpus", "spark.executor.cores",
            "spark.pyspark.python", "spark.executorEnv.PYSPARK_PYTHON", "spark.task.resource.gpu.amount",
            "spark.executor.resource.gpu.amount")
    out: dict[str, Any] = {"backend": "connect" if connect else "classic", "conf": {k: conf_value(sc, k) for k in keys}}
    if connect:
        found = connect_slots(sc)
        out["slots"], out["executors"] = found if found is not None else (None, None)
        out["default_fs"] = conf_value(sc, "spark.hadoop.fs.defaultFS") or "file:///"
        return out
    out["conf"]["spark.master"] = str(sc.master)
    expected = expected_slots(sc)
    slots, executors = settled_slots(sc, max(nodes, expected or 0), SLOTS_WAIT_S)
    out.update(slots=slots, executors=executors, expected_slots=expected)
    try:
        out["default_fs"] = sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    except Exception:  # noqa: BLE001
        out["default_fs"] = "file:///"
    return out


class DriverListener:
    """A listener on the driver's address that accepts and closes: can the executors reach the driver?

    It listens where the cluster's control server will (``spark.driver.host``), for the few
    seconds of the probe; it reads nothing.  ``with`` it; ``stop()`` is idempotent.
    """

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.bind((host, 0))
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            raise
        self.address = (host, int(self._sock.getsockname()[1]))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tfos-doctor-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.2)
            if ready:
                try:
                    conn, _ = self._sock.accept()
                    conn.close()
                except OSError:
                    continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> DriverListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ship_probe_by_value() -> Any:
    """The probe module, registered with cloudpickle (and pyspark's copy) to travel by value, with the one module
    it takes from tfos_nb (the executor's id): it runs where tfos_nb is missing, or is another version."""
    import cloudpickle

    from ..executor import identity
    from . import probe

    for module in (probe, identity):
        cloudpickle.register_pickle_by_value(module)
    try:
        from pyspark import cloudpickle as spark_cloudpickle

        for module in (probe, identity):
            spark_cloudpickle.register_pickle_by_value(module)
    except (ImportError, AttributeError):
        pass
    return probe


def probe_executors(spark: Any, tasks: int, *, export_dir: str | None, default_fs: str, timeout: float,
                    import_timeout: float) -> tuple[list[dict[str, Any]], str | None]:
    """Run ``tasks`` probes in one barrier stage: (their facts, None) or ([], why the stage did not run)."""
    doctor_probe = ship_probe_by_value()
    sc = spark_context(spark)
    plan: dict[str, Any] = {"run": secrets.token_hex(4), "export_dir": export_dir, "default_fs": default_fs,
                            "import_timeout": import_timeout}
    group = f"tfos_nb-doctor-{plan['run']}"
    if is_connect(sc):
        from ..driver.connect.spark_jobs import ConnectSparkJob

        plan["towards"] = conf_value(sc, "spark.driver.host")  # Spark's driver, beside the server: executors reach it
        task = doctor_probe.connect_task(plan)

        def action() -> list[str]:
            rows = sc.range(0, tasks, 1, tasks).mapInArrow(task, "s string", barrier=True).collect()
            return [r["s"] for r in rows]

        return _run(ConnectSparkJob(sc, group, "tfos_nb doctor", action), timeout, tasks)
    from ..driver.launch.sparkjob import SparkJob

    with DriverListener(driver_host(sc)) as listener:
        plan["driver"] = list(listener.address)
        classic = doctor_probe.classic_task(plan)

        def rdd_action() -> list[str]:
            return list(sc.parallelize(range(tasks), tasks).barrier().mapPartitions(classic).collect())

        return _run(SparkJob(sc, group, "tfos_nb doctor", rdd_action), timeout, tasks)


def _run(job: Any, timeout: float, tasks: int) -> tuple[list[dict[str, Any]], str | None]:
    job.start()
    try:
        if not job.wait(timeout):
            job.cancel()
            return [], (f"the doctor's barrier stage of {tasks} task(s) did not finish in {timeout:.0f} s "
                        "(not enough free task slots, an executor hangs, or one cannot reach another)")
    except BaseException:
        job.cancel()
        raise
    if job.error is not None:
        from ..driver.errors import python_error_line

        return [], f"the doctor's barrier stage failed: {python_error_line(job.error)}"
    return sorted((json.loads(s) for s in job.result()), key=lambda f: int(f["task"])), None


def doctor(spark: Any, nodes: int = 2, *, feeders: int = 0, export_dir: str | None = None,
           num_gpus: int | None = None, resources: Any = None, timeout: float = 120.0,
           import_timeout: float = 60.0) -> Report:
    """Check ``spark`` (a SparkSession, SparkContext or Spark Connect session) for a cluster of ``nodes`` nodes.

    Runs one barrier stage of ``nodes`` tasks (fewer when there are fewer slots) that starts
    no TensorFlow cluster, and returns a :class:`Report` (``print(report)``; ``report.ok``;
    ``report.raise_for_failures()``).  ``feeders``: the feeding tasks of an epoch
    (InputMode.SPARK), checked against the slots.  ``export_dir``: a directory the nodes
    will write (export, checkpoints, logs), checked writable on every executor and shared by
    all, as ``ctx.absolute_path`` maps it.  ``num_gpus``: GPUs each node should get.  ``resources``: the
    resources per role the job will ask (``TFCluster.run(resources=...)``), checked against the session's
    configuration (executors' cores and resources, dynamic allocation).
    """
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        msg = f"nodes must be a positive integer, got {nodes!r}"
        raise ValueError(msg)
    asked = Resources.of(resources)  # a ValueError for bad input, before any Spark job
    t0 = time.monotonic()
    session = session_facts(spark, nodes)
    slots = session.get("slots")
    tasks = nodes if slots is None else max(1, min(nodes, int(slots)))
    executors, stage_error = probe_executors(spark, tasks, export_dir=export_dir, default_fs=session["default_fs"],
                                             timeout=timeout, import_timeout=import_timeout)
    sc = spark_context(spark)
    found = None if asked is None else (asked.text(), problems(asked, None, lambda key: conf_value(sc, key),
                                                               str(session["conf"].get("spark.master") or "")))
    checks = verdicts(session, driver_facts(), executors, nodes=nodes, feeders=feeders, export_dir=export_dir,
                      num_gpus=num_gpus, stage_error=stage_error, resources=found)
    return Report(nodes, tuple(checks), session["backend"], str(session["conf"].get("spark.master") or ""),
                  time.monotonic() - t0, tuple(executors))
