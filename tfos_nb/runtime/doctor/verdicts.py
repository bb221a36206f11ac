"""The doctor's verdicts: OK / WARN / FAIL, where, and the fix, from the facts the doctor collected.

Pure functions of plain dicts (the session's facts, the driver's versions, and one dict per
probe task, as ``probe.py`` returns them): testable without Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FAIL", "OK", "WARN", "Check", "verdicts"]

OK, WARN, FAIL = "OK", "WARN", "FAIL"
SLOW_IMPORT_S = 30.0


@dataclass(frozen=True)
class Check:
    """One verdict: ``area`` (slots, settings, python, tfos_nb, tensorflow, ...), ``where`` (cluster, executor, host)."""

    area: str
    where: str
    status: str
    detail: str
    fix: str = ""


def verdicts(session: dict[str, Any], driver: dict[str, Any], executors: list[dict[str, Any]], *, nodes: int,
             feeders: int = 0, export_dir: str | None = None, num_gpus: int | None = None,
             stage_error: str | None = None, resources: tuple[str, list[tuple[str, str]]] | None = None) -> list[Check]:
    """Every check, from the session's facts, the driver's and each probe task's (pure: no Spark).

    ``resources``: the resources per role asked (their text) and what the session cannot give of them
    (``driver.launch.resources.problems``: ``(what, fix)`` pairs).
    """
    checks = _slots(session, nodes, feeders, len(executors), stage_error)
    checks += _settings(session)
    if resources is not None:
        asked, found = resources
        checks += [Check("resources", "cluster", FAIL, what, fix) for what, fix in found] or \
            [Check("resources", "cluster", OK, f"resources per role ({asked}): the configuration can give them")]
    firsts = _per_executor(executors)
    for facts in firsts:
        checks += _versions(driver, facts)
    if not executors:  # the probe stage did not run: nothing is known of the executors
        areas = ["gpus", "network"] + (["storage"] if export_dir else [])
        checks += [Check(a, "cluster", WARN, "not checked: no probe task ran (see the barrier check)") for a in areas]
        return _merged(checks)
    checks += _gpus(executors, num_gpus)
    checks += _network(executors, session["backend"])
    if export_dir:
        checks += _storage(executors, export_dir)
    return _merged(checks)


def _where(facts: dict[str, Any]) -> str:
    return f"executor {facts.get('executor', '?')} ({facts.get('host', '?')})"


def _per_executor(executors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for f in executors:
        seen.setdefault((str(f.get("executor")), str(f.get("host"))), f)
    return list(seen.values())


def _merged(checks: list[Check]) -> list[Check]:
    """Checks alike but for their executor become one row naming them all (a 50-executor cluster stays readable)."""
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for c in checks:
        groups.setdefault((c.area, c.status, c.detail, c.fix), []).append(c.where)
    out = []
    for (area, status, detail, fix), wheres in groups.items():
        if len(wheres) > 1 and all(w.startswith("executor ") for w in wheres):
            where = "executors " + ", ".join(sorted(w[len("executor "):] for w in wheres))
        else:
            where = "; ".join(dict.fromkeys(wheres))
        out.append(Check(area, where, status, detail, fix))
    order = {FAIL: 0, WARN: 1, OK: 2}
    areas = {c.area: i for i, c in reversed(list(enumerate(out)))}  # each area's first row
    return sorted(out, key=lambda c: (order.get(c.status, 3), areas[c.area]))


def _slots(session: dict[str, Any], nodes: int, feeders: int, probed: int, stage_error: str | None) -> list[Check]:
    slots, executors = session.get("slots"), session.get("executors")
    conf = session["conf"]
    out = []
    if slots is None:
        if stage_error is None and probed >= nodes:
            out.append(Check("slots", "cluster", OK, f"the session does not say its slots; a barrier stage of {nodes} "
                             "tasks ran"))
        else:
            out.append(Check("slots", "cluster", FAIL, f"a barrier stage of {nodes} tasks could not run: {stage_error}",
                             f"give the application at least {nodes} task slots, or ask for fewer nodes"))
    elif slots < nodes:
        out.append(Check("slots", "cluster", FAIL,
                         f"{nodes} nodes need {nodes} task slots; this application has {slots} on {executors} executor(s)",
                         f"give Spark at least {nodes} slots (more executors or spark.executor.cores; "
                         f"master local-cluster[{nodes},1,MB] locally), or ask for fewer nodes"))
    else:
        out.append(Check("slots", "cluster", OK, f"{slots} task slots on {executors} executor(s) for {nodes} nodes"))
    if feeders and slots is not None:
        spare = 1 if session["backend"] == "connect" else 0  # the notebook's status jobs need a slot of their own
        if slots < feeders + spare:
            out.append(Check("slots", "cluster", WARN, f"{feeders} feeding tasks per epoch, {slots} slots: they run in "
                             "waves" + ("; the panel's status jobs wait for a free slot" if spare else ""),
                             "repartition the data to at most "
                             f"{max(1, slots - spare)} partitions, or add executors"))
        else:
            out.append(Check("slots", "cluster", OK, f"the {feeders} feeding tasks of an epoch run at once"))
    if stage_error is not None and slots is not None:
        out.append(Check("barrier", "cluster", FAIL, stage_error,
                         "see the executors' logs (spark.task.maxFailures, an executor that dies at start); executors must "
                         "reach each other: each fetches the stage's task from the driver or a peer executor"))
    elif stage_error is None:
        out.append(Check("barrier", "cluster", OK,
                         f"a barrier stage of {probed} task(s) ran on {conf.get('spark.master') or 'the master'}"))
    return out


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _settings(session: dict[str, Any]) -> list[Check]:
    conf = session["conf"]
    out = []
    if str(conf.get("spark.dynamicAllocation.enabled") or "false").lower() == "true":
        out.append(Check("settings", "cluster", FAIL, "spark.dynamicAllocation.enabled=true: executors come and go, "
                         "and barrier stages are refused", "set spark.dynamicAllocation.enabled=false"))
    else:
        out.append(Check("settings", "cluster", OK, "dynamic allocation is off"))
    cpus, cores = _int(conf.get("spark.task.cpus")) or 1, _int(conf.get("spark.executor.cores"))
    if cores is not None and cpus > cores:
        out.append(Check("settings", "cluster", FAIL, f"spark.task.cpus={cpus} > spark.executor.cores={cores}: no task "
                         "can run", f"set spark.task.cpus to at most {cores}"))
    elif cores is not None and cores % cpus:
        out.append(Check("settings", "cluster", WARN, f"spark.executor.cores={cores} is not a multiple of "
                         f"spark.task.cpus={cpus}: {cores % cpus} core(s) per executor idle",
                         f"make spark.executor.cores a multiple of {cpus}"))
    else:
        per = f", {cores // cpus} node(s) per executor" if cores else ""
        out.append(Check("settings", "cluster", OK, f"spark.task.cpus={cpus} (TensorFlow threads per node){per}"))
    if session["backend"] == "connect":
        out.append(Check("session", "cluster", OK, "Spark Connect: no RDDs or SparkContext; nodes start from a barrier "
                         "mapInArrow stage and the coordinator runs on an executor (the notebook is not reached)"))
    return out


def _major_minor(v: str | None) -> str | None:
    return None if not v else ".".join(str(v).split(".")[:2])


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:2] if x.isdigit())


def _python_of(facts: dict[str, Any]) -> str:
    env = facts.get("pyspark_python_env")
    return f"{facts.get('executable') or facts.get('python_executable')}" + (f" (PYSPARK_PYTHON={env})" if env else "")


def _versions(driver: dict[str, Any], f: dict[str, Any]) -> list[Check]:
    where, py = _where(f), _python_of(f)
    if f.get("versions_error"):
        return [Check("python", where, FAIL, f"{f['versions_error']}",
                      "set PYSPARK_PYTHON (spark.pyspark.python) to a working Python on every executor")]
    out = []
    if _major_minor(f.get("python")) != _major_minor(driver["python"]):
        out.append(Check("python", where, FAIL, f"Python {f.get('python')} ({py}); the driver has {driver['python']}: "
                         "functions pickled on the driver do not load there",
                         f"set PYSPARK_PYTHON (spark.pyspark.python) to a Python {_major_minor(driver['python'])} "
                         "on every executor"))
    else:
        out.append(Check("python", where, OK, f"Python {f.get('python')}: {py}"))
    if f.get("tfos_nb") is None:
        out.append(Check("tfos_nb", where, FAIL, f"tfos_nb cannot be imported by {py}: {f.get('tfos_nb_error')}",
                         f"pip install tfos_nb=={driver['tfos_nb']} into that Python, or ship it with --py-files"))
    elif f["tfos_nb"] != driver["tfos_nb"]:
        out.append(Check("tfos_nb", where, FAIL, f"tfos_nb {f['tfos_nb']} from {f.get('tfos_nb_path')}; the driver has "
                         f"{driver['tfos_nb']}: driver and nodes must speak the same protocol",
                         f"install tfos_nb=={driver['tfos_nb']} on the executors (or remove the other copy from their "
                         "PYTHONPATH / --py-files)"))
    else:
        out.append(Check("tfos_nb", where, OK, f"tfos_nb {f['tfos_nb']}, as on the driver"))
    drv_tf = driver.get("tensorflow") or driver.get("tensorflow-cpu")
    want = f"tensorflow=={drv_tf}" if drv_tf else "tensorflow"
    if f.get("tf_error"):
        out.append(Check("tensorflow", where, FAIL, f"TensorFlow cannot be imported by {py}: {f['tf_error']}",
                         f"pip install {want} into that Python, or point PYSPARK_PYTHON at a Python that has it"))
    else:
        took, tf = float(f.get("tf_import_s") or 0), f.get("tf_module")
        if drv_tf and tf and _major_minor(tf) != _major_minor(drv_tf):
            out.append(Check("tensorflow", where, WARN, f"TensorFlow {tf}; the driver has {drv_tf}",
                             f"pip install {want} on the executors (a model saved by one may not load in the other)"))
        elif took > SLOW_IMPORT_S:
            out.append(Check("tensorflow", where, WARN, f"TensorFlow {tf} takes {took:.0f} s to import",
                             "install TensorFlow on local disk rather than a network file system"))
        else:
            out.append(Check("tensorflow", where, OK, f"TensorFlow {tf} imports in {took:.1f} s"))
        out += _keras(driver, f, where, tf)
    drv_ps, ps = driver.get("pyspark"), f.get("pyspark_module")
    if drv_ps and ps and _major_minor(drv_ps) != _major_minor(ps):
        out.append(Check("pyspark", where, WARN, f"pyspark {ps} on the executor; the driver has {drv_ps}",
                         f"use pyspark=={ps} (the cluster's Spark) on the driver"))
    elif ps:
        out.append(Check("pyspark", where, OK, f"pyspark {ps}"))
    return out


def _keras(driver: dict[str, Any], f: dict[str, Any], where: str, tf: str | None) -> list[Check]:
    legacy_needed = tf is not None and _version_tuple(tf) >= (2, 16)
    if legacy_needed and not f.get("tf_keras"):
        return [Check("keras", where, FAIL, f"TensorFlow {tf} without tf_keras: keras='tf_keras' (the default) needs it",
                      f"pip install tf_keras{'==' + driver['tf_keras'] if driver.get('tf_keras') else ''} on the "
                      "executors (or run with keras='keras3')")]
    tk = f.get("tf_keras")
    if legacy_needed and tk and tf and _major_minor(tk) != _major_minor(tf):
        mm = _major_minor(tf)
        return [Check("keras", where, FAIL, f"tf_keras {tk} with TensorFlow {tf}: each tf_keras release works with "
                      "its own TensorFlow minor only", f"pip install 'tf-keras~={mm}.0' on the executors")]
    for dist in ("tf_keras", "keras"):
        if driver.get(dist) and f.get(dist) and _major_minor(driver[dist]) != _major_minor(f[dist]):
            return [Check("keras", where, WARN, f"{dist} {f[dist]}; the driver has {driver[dist]}",
                          f"pip install {dist}=={driver[dist]} on the executors")]
    return [Check("keras", where, OK, f"keras {f.get('keras')}, tf_keras {f.get('tf_keras')}")]


def _gpus(executors: list[dict[str, Any]], num_gpus: int | None) -> list[Check]:
    out = []
    by_host: dict[str, dict[str, set[str]]] = {}
    any_gpu = False
    for f in executors:
        spark_gpus, smi = [str(a) for a in f.get("spark_gpus") or []], f.get("nvidia_smi")
        any_gpu = any_gpu or bool(spark_gpus or smi)
        for a in spark_gpus:
            by_host.setdefault(str(f.get("host")), {}).setdefault(a, set()).add(str(f.get("executor")))
        if smi is not None and spark_gpus:
            visible = {str(g.get("index")) for g in smi} | {str(g.get("uuid")) for g in smi}
            missing = [a for a in spark_gpus if a not in visible]
            if missing:
                out.append(Check("gpus", _where(f), FAIL, f"Spark assigns GPU(s) {', '.join(missing)} that nvidia-smi "
                                 f"does not show (it shows {', '.join(sorted(visible)) or 'none'})",
                                 "fix the executors' GPU discovery script (spark.executor.resource.gpu.discoveryScript)"))
        if f.get("nvidia_smi_error"):
            out.append(Check("gpus", _where(f), WARN, f"nvidia-smi failed: {f['nvidia_smi_error']}",
                             "check the NVIDIA driver on that host"))
    for host, gpus in sorted(by_host.items()):
        for addr, owners in sorted(gpus.items()):
            if len(owners) > 1:
                out.append(Check("gpus", f"host {host}", FAIL,
                                 f"GPU {addr} is assigned to executors {', '.join(sorted(owners))} at once: their nodes "
                                 "would share one GPU",
                                 "make each executor's discovery script report only its own GPUs "
                                 "(spark.worker.resource.gpu.amount with Spark's getGpusResources.sh on standalone, "
                                 "or a per-executor CUDA_VISIBLE_DEVICES)"))
    if not out:
        if any_gpu:
            n = sum(len(g) for g in by_host.values())
            out.append(Check("gpus", "cluster", OK, f"{n} GPU(s) assigned by Spark, no GPU given to two executors"
                             if n else "GPUs seen by nvidia-smi; the nodes split each host's GPUs among them"))
        elif num_gpus:
            out.append(Check("gpus", "cluster", WARN, f"num_gpus={num_gpus} but no executor has a GPU: the nodes run "
                             "on CPU", "set spark.task.resource.gpu.amount and a discovery script, or num_gpus=0"))
        else:
            out.append(Check("gpus", "cluster", OK, "no GPUs: the nodes run on CPU"))
    return out


def _network(executors: list[dict[str, Any]], backend: str) -> list[Check]:
    out = []
    by_task = {str(f.get("task")): f for f in executors}
    pairs = 0
    for f in executors:
        if f.get("listen_error"):
            out.append(Check("network", _where(f), FAIL, f"cannot listen on {f.get('host')}: {f['listen_error']}",
                             "the node's host address must be an address of that machine"))
        for task, err in sorted((f.get("reach") or {}).items()):
            pairs += 1
            if err is not None:
                peer = by_task.get(task, {})
                out.append(Check("network", _where(f), FAIL,
                                 f"node {f.get('task')} cannot open a TCP connection to node {task} on executor "
                                 f"{peer.get('executor', '?')} at {peer.get('host', '?')}:{peer.get('port', '?')} ({err})",
                                 "let the executors' hosts reach each other on TCP ports (the nodes pick ports below the "
                                 "ephemeral range): firewall rules, security groups, routes"))
        if f.get("driver_error"):
            out.append(Check("network", _where(f), FAIL, f"cannot reach the driver's address ({f['driver_error']})",
                             "set spark.driver.host to an address the executors can reach, and open the driver's "
                             "TCP ports to them"))
    if not out:
        driver = ", and the driver" if backend == "classic" else ""
        out.append(Check("network", "cluster", OK, f"every node reached every other ({pairs} connections){driver}"))
    return out


def _storage(executors: list[dict[str, Any]], export_dir: str) -> list[Check]:
    out = []
    by_task = {str(f.get("task")): f for f in executors}
    for f in executors:
        path = f.get("export_path", export_dir)
        if f.get("export_remote"):
            hdfs = str(path).startswith(("hdfs://", "viewfs://"))
            # TensorFlow >= 2.6 reads hdfs:// and s3:// only through tensorflow-io's file systems
            io_needed = (hdfs or str(path).startswith("s3://")) and not f.get("tensorflow-io") and \
                _version_tuple(str(f.get("tf_module") or f.get("tensorflow") or "2.6")) >= (2, 6)
            missing = [what for what, ok in (("CLASSPATH with Hadoop's jars", f.get("classpath_set")),
                                             ("libhdfs.so", f.get("libhdfs")), ("JAVA_HOME", f.get("java_home")))
                       if hdfs and not ok] + (["the tensorflow-io package"] if io_needed else [])
            if missing:
                fixes = (["set spark.executorEnv.CLASSPATH=$(hadoop classpath --glob), HADOOP_HDFS_HOME (its "
                          "lib/native has libhdfs.so) and JAVA_HOME"] if len(missing) > io_needed else [])
                fixes += (["pip install tensorflow-io (the release that matches the executors' TensorFlow) on the "
                           "executors, and `import tensorflow_io` in the node function before the path is used"]
                          if io_needed else [])
                out.append(Check("storage", _where(f), FAIL, f"{path}: TensorFlow's {'HDFS' if hdfs else 'S3'} "
                                 f"support needs {', '.join(missing)} in the executor's environment",
                                 "; ".join(fixes)))
                continue
            out.append(Check("storage", _where(f), OK, f"{path}: not written by the doctor (remote file system)"))
            continue
        if f.get("write_error"):
            out.append(Check("storage", _where(f), FAIL, f"cannot write {path}: {f['write_error']}",
                             "make it writable by the executors' user on that host, or choose a directory on storage "
                             "every executor mounts read-write"))
            continue
        for task, err in sorted((f.get("seen") or {}).items()):
            if err is not None:
                peer = by_task.get(task, {})
                out.append(Check("storage", _where(f), FAIL,
                                 f"does not see what executor {peer.get('executor', '?')} ({peer.get('host', '?')}) "
                                 f"wrote to {path} ({err}): not one shared directory",
                                 "use shared storage (HDFS, NFS, an object store; dbfs:/ or /Volumes on Databricks), "
                                 "as an absolute path"))
    if not out:
        out.append(Check("storage", "cluster", OK, f"{export_dir}: written on every executor and read on every other"))
    return out
