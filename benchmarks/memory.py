"""The memory of a Spark application's processes, by kind: a process-tree RSS sampler and the JVMs' GC logs.

A ``Sampler`` thread in the driver walks the driver's process tree every ``interval`` s with psutil and classifies
processes by command line: the driver (this Python), the driver JVM (it also hosts local-cluster's master and
worker), each executor JVM, each Python worker forked by ``pyspark.daemon`` (the feeding tasks run there), each
node's supervisor and each node process (``python -m tfos_nb.runtime node``).  A process, once seen, is followed
until it exits even if it is re-parented.  Peak = the largest sampled RSS; the kernel's own high-water mark
(``VmHWM`` in /proc/PID/status, which catches peaks between samples) is kept beside it.

``gc_by_kind`` reads the JVMs' ``-Xlog:gc`` files: each one's heap after a collection (what is still live) and
its committed heap, so that a JVM's RSS growth can be told apart from data it keeps.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time

from harness import median

MIB = 1 << 20

log = logging.getLogger("bench")


def reset_hwm() -> None:
    """This process's VmHWM from here on (``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def gc_log_option(gc_dir: str) -> str:
    """A JVM option writing each JVM's collections to ``gc_dir/gc-PID.log`` (read by ``gc_by_kind``)."""
    return "-Xlog:gc:file=%s/gc-%%p.log" % gc_dir


def _hwm(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def classify(proc, root_pid: int) -> str | None:
    """The kind of one process of the Spark application, from its command line (None: not one we report)."""
    import psutil

    if proc.pid == root_pid:
        return "driver (Python)"
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    line = " ".join(cmd)
    if "CoarseGrainedExecutorBackend" in line:
        eid = cmd[cmd.index("--executor-id") + 1] if "--executor-id" in cmd else "?"
        return "executor JVM %s" % eid
    if "SparkSubmit" in line:  # the JVM itself, not spark-submit's bash nor its launcher.Main
        return "driver JVM" if os.path.basename(cmd[0]) == "java" and "launcher.Main" not in line else None
    if "tfos_nb.runtime" in line:
        role = cmd[cmd.index("tfos_nb.runtime") + 1] if "tfos_nb.runtime" in cmd[:-1] else "?"
        return {"node": "node process", "supervisor": "node supervisor"}.get(role, "tfos_nb " + role)
    if "pyspark.daemon" in line:
        try:
            parent = " ".join(proc.parent().cmdline())
        except Exception:
            parent = ""
        return "Python worker" if "pyspark.daemon" in parent else "pyspark.daemon"
    if any(os.path.basename(a) == "native.py" for a in cmd):
        return "native worker"
    return "other: " + os.path.basename(cmd[0]) if cmd else None


#: the CPU report's groups of kinds: who trains, who feeds, the JVMs, the driver
CPU_GROUPS = (("nodes", ("node process", "node supervisor", "native worker")),
              ("feeders", ("Python worker", "pyspark.daemon")),
              ("JVMs", ("executor JVM", "driver JVM")),
              ("driver", ("driver (Python)",)))


#: the JVMs' threads by what they do, from their names (``/proc/PID/task/TID/comm``, 15 characters): Spark's task
#: threads (reading the cache, writing Arrow to the Python workers), the JIT compilers, the garbage collectors; the
#: rest (RPC, heartbeats, the scheduler, py4j) is "other"
JVM_THREADS = (("tasks", ("Executor task",)), ("JIT", ("C1 CompilerThre", "C2 CompilerThre", "Sweeper thread")),
               ("GC", ("GC Thread", "G1 ")))


def _spark_jvms() -> list[int]:
    """This process's Spark JVMs: the driver's and the executors' (descendants that are ``java``)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process().children(recursive=True) if p.name() == "java"]
    except psutil.Error:
        return []


def jvm_threads() -> dict[str, float]:
    """CPU seconds so far of the Spark JVMs' threads, summed by :data:`JVM_THREADS` class (and ``other``)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {name: 0.0 for name, _ in JVM_THREADS} | {"other": 0.0}
    for pid in _spark_jvms():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended
                continue
            kind = next((k for k, prefixes in JVM_THREADS if name.startswith(prefixes)), "other")
            out[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def jvm_threads_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The JVMs' CPU between two :func:`jvm_threads` readings, as ``cpu JVM KIND s`` metrics (a thread that ended
    in between is not counted: Spark's task and compiler threads live as long as their JVM)."""
    return {f"cpu JVM {k} s": max(0.0, after[k] - before.get(k, 0.0)) for k in after}


class Sampler(threading.Thread):
    """Every ``interval`` s: the driver's descendants, classified; each one's largest RSS and last VmHWM."""

    def __init__(self, interval: float = 0.2):
        super().__init__(name="rss-sampler", daemon=True)
        import psutil

        self.interval = interval
        self.root = psutil.Process(os.getpid())
        self.procs: dict[int, dict] = {}
        self.stop_event = threading.Event()
        self.samples = 0
        self._first_walk = True  # processes already there count only the CPU they use from here on

    def _walk(self):
        import psutil

        try:
            kids = self.root.children(recursive=True)
        except psutil.Error:
            kids = []
        for p in [self.root, *kids]:
            if p.pid not in self.procs:
                kind = classify(p, self.root.pid)
                if kind is None:
                    continue
                self.procs[p.pid] = {"kind": kind, "proc": p, "peak": 0, "hwm": 0, "first": time.time(),
                                     "exec": self._executor_of(p), "cpu0": None if self._first_walk else 0.0}
        self._first_walk = False
        for pid, info in self.procs.items():
            if info.get("gone"):
                continue
            try:
                rss = info["proc"].memory_info().rss
                times = info["proc"].cpu_times()
            except psutil.Error:
                info["gone"] = True
                continue
            info["cpu"] = times.user + times.system  # its last reading: what it used after it is lost
            if info["cpu0"] is None:
                info["cpu0"] = info["cpu"]
            info["peak"] = max(info["peak"], rss)
            info["hwm"] = max(info["hwm"], _hwm(pid))
            info["last"] = time.time()

    def _executor_of(self, p) -> str:
        """The executor JVM a process descends from (its ``--executor-id``), '' for the driver side."""
        try:
            for a in p.parents():
                cmd = a.cmdline()
                if "--executor-id" in cmd:
                    return cmd[cmd.index("--executor-id") + 1]
        except Exception:
            pass
        return ""

    def run(self):
        while not self.stop_event.is_set():
            self._walk()
            self.samples += 1
            self.stop_event.wait(self.interval)

    def stop(self):
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        self.join(timeout=10)
        self._walk()

    def cpu_by_group(self) -> dict[str, float]:
        """CPU seconds (user + system) each group of :data:`CPU_GROUPS` used while sampled, as ``cpu GROUP s``; a
        process's CPU after its last sample (at most one interval's) is not counted."""
        out = {f"cpu {name} s": 0.0 for name, _ in CPU_GROUPS}
        for info in self.procs.values():
            for name, kinds in CPU_GROUPS:
                if info["kind"].startswith(kinds) and info.get("cpu") is not None:
                    out[f"cpu {name} s"] += info["cpu"] - (info["cpu0"] or 0.0)
        return out

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds each kind of process (``classify``) used while sampled, for the log."""
        out: dict[str, float] = {}
        for info in self.procs.values():
            if info.get("cpu") is not None:
                kind = info["kind"].split(" JVM ")[0] + (" JVM" if " JVM " in info["kind"] else "")
                out[kind] = out.get(kind, 0.0) + info["cpu"] - (info["cpu0"] or 0.0)
        return out

    def report(self) -> list[dict]:
        return [{"kind": i["kind"], "exec": i["exec"], "pid": pid, "peak": i["peak"], "hwm": i["hwm"]}
                for pid, i in sorted(self.procs.items())]


# --------------------------------------------------------------------------------------
# One measurement = one Spark application


_GC_LINE = re.compile(r"GC\(\d+\) Pause .*? (\d+)M->(\d+)M\((\d+)M\)")


def gc_by_kind(gc_dir: str, procs: list[dict]) -> dict[str, dict]:
    """Each JVM's collections from its ``-Xlog:gc`` file, by kind: the largest heap left after a collection (an upper
    bound of what it keeps live), the largest committed heap, and the number of pauses."""
    kinds = {p["pid"]: p["kind"] for p in procs}
    out: dict[str, dict] = {}
    for name in os.listdir(gc_dir):
        m = re.match(r"gc-(\d+)\.log", name)
        kind = kinds.get(int(m.group(1))) if m else None
        if kind is None:
            log.info("GC log %s: not a JVM the sampler saw", name)
            continue
        after, committed, pauses = 0, 0, 0
        with open(os.path.join(gc_dir, name)) as f:
            for line in f:
                g = _GC_LINE.search(line)
                if g:
                    pauses += 1
                    after, committed = max(after, int(g.group(2))), max(committed, int(g.group(3)))
        d = out.setdefault(kind, {"after": 0, "committed": 0, "pauses": 0})
        d["after"], d["committed"] = max(d["after"], after), max(d["committed"], committed)
        d["pauses"] += pauses
    return out


KIND_ORDER = ["node process", "node supervisor", "Python worker", "pyspark.daemon", "executor JVM",
              "driver JVM", "driver (Python)"]


def kind_key(kind: str) -> tuple:
    base = kind.rsplit(" ", 1)[0] if kind.startswith("executor JVM") else kind
    return (KIND_ORDER.index(base) if base in KIND_ORDER else len(KIND_ORDER), kind)


def peaks_by_kind(res: dict) -> dict[str, dict]:
    """kind -> {count, peak (largest sampled RSS of the kind's processes), hwm}, executor JVMs and nodes one by one."""
    out: dict[str, dict] = {}
    by_node = {}
    for p in res["procs"]:
        kind = p["kind"]
        if kind == "node process":
            by_node.setdefault(p["exec"], []).append(p)
        if kind.startswith("other"):
            continue
        d = out.setdefault(kind if kind != "node process" else "node process", {"count": 0, "peak": 0, "hwm": 0})
        d["count"] += 1
        d["peak"] = max(d["peak"], p["peak"])
        d["hwm"] = max(d["hwm"], p["hwm"])
    for eid, ps in by_node.items():  # each node apart too (on executor eid)
        out["node process (executor %s)" % eid] = {"count": len(ps), "peak": max(p["peak"] for p in ps),
                                                   "hwm": max(p["hwm"] for p in ps)}
    return out



def heap_rows(program: str, before: list[dict], after: list[dict]) -> list[str]:
    """A program's rows of the JVM-heap table (MiB): each JVM kind's median largest heap left after a collection and
    largest committed heap, and its collections, ``before`` → ``after`` (each a list of runs' ``gc_by_kind``)."""
    rows = []
    for k in sorted({k for gs in (before, after) for g in gs for k in g}, key=kind_key):
        def cell(runs, field, k=k):
            return median([g[k][field] for g in runs if k in g])
        cells = []
        for field in ("after", "committed"):
            a, b = cell(before, field), cell(after, field)
            cells.append("%s → %s%s" % ("%.0f" % a if a is not None else "–", "%.0f" % b if b is not None else "–",
                                        " (%.2f×)" % (b / a) if a and b else ""))
        rows.append("| %s | %s | %s | %s |" % (program, k, " | ".join(cells), " → ".join(
            "%.0f" % v for v in (cell(before, "pauses"), cell(after, "pauses")) if v is not None)))
    return rows


def peak_rows(before: list[dict], after: list[dict]) -> list[str]:
    """The peak-RSS table's rows (MiB): each kind's count and median largest sampled RSS (VmHWM beside it),
    ``before`` and ``after`` (each a list of runs' results, with their ``procs``), and their ratio."""
    per_rows = [[peaks_by_kind(r) for r in runs] for runs in (before, after)]
    rows = []
    for k in sorted({k for rs in per_rows for r in rs for k in r}, key=kind_key):
        def cell(i, field, k=k):
            return median([r[k][field] for r in per_rows[i] if k in r])
        a, b = cell(0, "peak"), cell(1, "peak")
        ah, bh = cell(0, "hwm"), cell(1, "hwm")
        cnt = "/".join(str(int(c)) for c in (cell(0, "count"), cell(1, "count")) if c is not None)
        rows.append("| %s | %s | %s | %s | %s |" % (
            k, cnt, "%.0f (%.0f)" % (a / MIB, ah / MIB) if a else "–", "%.0f (%.0f)" % (b / MIB, bh / MIB) if b else "–",
            "%.2f×" % (b / a) if a and b else ""))
    return rows
