"""What every benchmark does the same way: its Spark application, alternating rounds, spreads, tables, the report.

* ``spark_session``: the common setting (``spark.ui.enabled=false``, the executors' TensorFlow/OMP threads at 1,
  this interpreter and this source tree on the executors), plus what a benchmark adds;
* ``Rounds``: every variant once a round, in the same order, after a warm-up round that is not counted; a
  variant that fails is reported and not run again, the others go on; optionally a watchdog per run and, before
  each run, a wait for a quiet machine with the machine's CPU during the run recorded;
* ``Spread``: a variant's runs -- min, median, max, the fastest run -- and ``Ratio``: median against median
  and fastest against fastest;
* ``table``, ``every_run``, ``machine_lines``, ``command``, ``write_report``: the markdown report;
* ``write_runs``: every run's figures beside the report (``NAME.json`` next to ``NAME.md``): what
  ``benchmarks/table.py`` builds the one current table of the docs and the README from.

Benchmarks are scripts: this directory is on ``sys.path`` when one runs, so they ``import harness``.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# the executors' environment: 2 cores are shared by the JVMs, the Python workers and TensorFlow
NODE_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2"}

log = logging.getLogger("bench")


def setup_logging(verbose: bool = False) -> None:
    """The benchmark's log on stderr (py4j's and, unless ``verbose``, TensorFlowOnSpark's warnings only)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if not verbose:
        logging.getLogger("tensorflowonspark").setLevel(logging.WARNING)


# --------------------------------------------------------------------------------------
# Spark application
# --------------------------------------------------------------------------------------

def prepare_env(legacy_keras: bool = False) -> None:
    """This interpreter for Spark's Python workers, this source tree importable by them (tfos_nb need not be
    installed); ``legacy_keras``: ``tf.keras`` is tf_keras here, as on the nodes."""
    if legacy_keras:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    pp = os.environ.get("PYTHONPATH", "")
    if ROOT not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = ROOT + (os.pathsep + pp if pp else "")


def spark_session(master: str, app: str, *, conf: Mapping[str, str] | None = None,
                  executor_env: Mapping[str, str] = NODE_ENV, log_level: str = "ERROR") -> Any:
    """A SparkSession in the common setting; ``conf`` adds settings, ``executor_env`` is the executors' environment
    (``NODE_ENV`` unless a benchmark needs its own)."""
    from pyspark.sql import SparkSession

    prepare_env()
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    env = {"PYSPARK_PYTHON": sys.executable, "PYTHONPATH": os.environ["PYTHONPATH"], **executor_env}
    for k, v in env.items():
        b = b.config("spark.executorEnv." + k, v)
    t0 = time.perf_counter()
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    log.info("Spark %s session up in %.1fs (%s)", spark.version, time.perf_counter() - t0, master)
    return spark


def ship_by_value(*modules: ModuleType) -> None:
    """Functions of these modules reach the executors by value (they import tfos_nb, not this directory)."""
    import cloudpickle
    from pyspark import cloudpickle as spark_cloudpickle

    for m in modules:
        cloudpickle.register_pickle_by_value(m)
        spark_cloudpickle.register_pickle_by_value(m)


def shutdown(cluster: Any) -> None:
    """``cluster.shutdown()``; TensorFlowOnSpark leaves a 3-day SIGALRM armed after it: disarmed."""
    try:
        cluster.shutdown()
    finally:
        signal.alarm(0)


def stopped_by_tfos(spark: Any) -> bool:
    """Whether ``spark``'s context was stopped (TensorFlowOnSpark calls sc.stop() + sys.exit(1) on a node error);
    then TFoS's module-global error state, which poisons every later run, is cleared too."""
    sc = spark.sparkContext if spark is not None else None
    if sc is not None and getattr(sc, "_jsc", None) is not None:
        return False
    log.warning("Spark session was stopped (TFoS does that on errors): starting a new one")
    try:
        from tensorflowonspark import TFCluster

        TFCluster.tf_status.clear()
    except Exception:
        pass
    return True


def log_cluster_state(cluster: Any) -> None:
    """On a failure, log what a tfos_nb cluster knows (status + node log tails) for debugging."""
    for what in ("status", "logs"):
        try:
            fn = getattr(cluster, what, None)
            if fn is None:
                continue
            out = fn(tail=30) if what == "logs" else fn()
            if isinstance(out, dict):
                for node, lines in out.items():
                    log.error("tfos_nb %s[%s]:\n  %s", what, node, "\n  ".join(map(str, lines)))
            else:
                log.error("tfos_nb %s: %r", what, out)
        except Exception as e:  # diagnostics must never mask the failure
            log.error("tfos_nb %s unavailable: %s", what, e)


# --------------------------------------------------------------------------------------
# Alternating rounds
# --------------------------------------------------------------------------------------

def one_line(e: BaseException) -> str:
    """An error as one table cell: its type and first line."""
    s = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
    return s.replace("|", "/")[:200]


class Watchdog:
    """Calls ``cancel`` (Spark's jobs), then interrupts the main thread, if a run takes more than ``seconds``."""

    def __init__(self, seconds: float, label: str, cancel: Callable[[], None]):
        self.seconds, self.label, self.cancel = seconds, label, cancel
        self.fired = False
        self._done = threading.Event()

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.fired = True
        log.error("watchdog: %s exceeded %ss, cancelling Spark jobs", self.label, self.seconds)
        try:
            self.cancel()
        except Exception:
            pass
        if self._done.wait(60):
            return
        log.error("watchdog: %s still stuck, interrupting the main thread", self.label)
        os.kill(os.getpid(), signal.SIGINT)

    def __enter__(self) -> Watchdog:
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> bool:
        self._done.set()
        return False


def _cpu_seconds() -> tuple[float, float]:
    """The machine's CPU time so far (s, all CPUs): busy (user, nice, system, irq, softirq) and stolen by the host
    (``steal``: this VM's vCPUs waiting for a physical CPU)."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq, t.steal


def settle(window: float = 1.0, busy_below: float = 0.1, deadline: float = 60.0) -> float:
    """Wait until a ``window`` in which the machine's CPUs were busy less than ``busy_below`` of the window, all
    CPUs together (what the previous run left running -- JVM collections, exiting processes -- has ended), for at
    most ``deadline`` s; returns the seconds waited.  A run that starts on a busy machine is reported as such."""
    t0 = time.monotonic()
    while True:
        b0, _ = _cpu_seconds()
        time.sleep(window)
        busy = _cpu_seconds()[0] - b0
        if busy < busy_below * window or time.monotonic() - t0 > deadline:
            return time.monotonic() - t0


class Rounds:
    """Each variant once a round, in the same order every round, after a warm-up round (not counted).

    ``measure(key, label)`` runs one variant and returns its metrics (name -> number).  A variant that fails is
    not run again (it could hang again): its reason is ``failures[key]``.  ``timeout``: a ``Watchdog`` per run
    (``cancel`` on expiry).  ``settle``: each run waits for a quiet machine first and records ``settle s``,
    ``cpu busy %`` and ``cpu steal %`` (the machine's CPU during it, as a share of all CPUs' time)."""

    def __init__(self, runs: int, warmup: bool = True, *, settle: bool = False, timeout: float | None = None,
                 cancel: Callable[[], None] = lambda: None, describe: Callable[[BaseException], str] = one_line):
        self.labels = (["warm-up"] if warmup else []) + ["run %d" % i for i in range(1, runs + 1)]
        self.settle, self.timeout, self.cancel, self.describe = settle, timeout, cancel, describe
        self.results: dict[str, dict[str, list[float]]] = {}
        self.failures: dict[str, str] = {}
        self.runs: list[tuple[str, str, dict[str, Any]]] = []  # (key, label, metrics) in the order they ran

    def run(self, keys: Sequence[str], measure: Callable[[str, str], dict[str, Any]],
            before: Callable[[], None] | None = None) -> None:
        """Every round; ``before()`` runs before each variant's run, outside its watchdog."""
        for label in self.labels:
            for key in keys:
                if key in self.failures:
                    continue
                if before is not None:
                    before()
                self.one(key, label, measure)

    def one(self, key: str, label: str, measure: Callable[[str, str], dict[str, Any]]) -> dict[str, Any] | None:
        log.info("---- %s [%s]", key, label)
        waited = settle() if self.settle else 0.0
        cpu0, steal0 = _cpu_seconds() if self.settle else (0.0, 0.0)
        t0 = time.perf_counter()
        wd = Watchdog(self.timeout, "%s [%s]" % (key, label), self.cancel) if self.timeout else None
        try:
            if wd is None:
                m = measure(key, label)
            else:
                with wd:
                    m = measure(key, label)
        except KeyboardInterrupt:
            if wd is None or not wd.fired:
                raise
            self.failures[key] = "timeout after %ss (watchdog)" % self.timeout
            log.error("%s [%s]: FAILED (timeout)", key, label)
            return None
        except SystemExit as e:  # TFoS sys.exit(1)s after node errors (and stops the SparkContext)
            self.failures[key] = "SystemExit(%s) from the framework (TFoS stops Spark on node errors)" % e.code
            log.error("%s [%s]: FAILED\n%s", key, label, traceback.format_exc())
            return None
        except Exception as e:  # one variant's failure must not hide the others
            fired = wd is not None and wd.fired
            self.failures[key] = ("timeout after %ss (watchdog): " % self.timeout if fired else "") + self.describe(e)
            log.error("%s [%s]: FAILED\n%s", key, label, traceback.format_exc())
            return None
        if self.settle:
            cpu1, steal1 = _cpu_seconds()
            span = (time.perf_counter() - t0) * (os.cpu_count() or 1)
            m.update({"settle s": waited, "cpu s": cpu1 - cpu0, "cpu busy %": 100 * (cpu1 - cpu0) / span,
                      "cpu steal %": 100 * (steal1 - steal0) / span})
        log.info("%s [%s]: %s", key, label, ", ".join("%s=%.3f" % kv for kv in m.items() if kv[1] is not None))
        self.runs.append((key, label, m))
        if label != "warm-up":
            self.add(key, m)
        return m

    def add(self, key: str, metrics: Mapping[str, Any]) -> None:
        for k, v in metrics.items():
            self.results.setdefault(key, {}).setdefault(k, []).append(v)

    def median(self, key: str, metric: str) -> float | None:
        return median(self.results.get(key, {}).get(metric, []))

    def spread(self, key: str, metric: str, higher_is_better: bool = False) -> Spread | None:
        xs = self.results.get(key, {}).get(metric)
        return Spread(xs, higher_is_better) if xs else None


# --------------------------------------------------------------------------------------
# Spread and ratios
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ratio:
    median: float
    fastest: float


class Spread:
    """A variant's runs of one metric: min, median, max and the fastest run (the least disturbed on a shared
    machine: the lowest time, or the highest rate when ``higher_is_better``)."""

    def __init__(self, values: Iterable[float | None], higher_is_better: bool = False):
        self.values = [v for v in values if v is not None]
        if not self.values:
            raise ValueError("a spread of no runs")
        self.higher_is_better = higher_is_better

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def fastest(self) -> float:
        return self.max if self.higher_is_better else self.min

    def ratio(self, ref: Spread) -> Ratio:
        """This spread against ``ref``'s: median against median, fastest against fastest."""
        return Ratio(self.median / ref.median, self.fastest / ref.fastest)


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------

def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str], rows: Iterable[str]) -> list[str]:
    """A markdown table's lines: the header, its rule, the rows (made with ``row``)."""
    return [row(*header), "|" + "---|" * len(header), *rows]


def every_run(rounds: Rounds, metrics: Sequence[str] = ("wall s", "fit s")) -> str:
    """Each run in the order it ran, with the machine's CPU during it (``Rounds(settle=True)``): a slow run on a
    machine busy with something else, or one the host took CPU from (steal), tells noise from cost."""
    lines = ["Every run, in order (settle: s waited for a quiet machine before it; CPU: the machine's busy and "
             "stolen time during the run, %% of its %d CPUs):" % (os.cpu_count() or 1), ""]
    lines += table(["variant", "run", *metrics, "settle s", "CPU busy", "CPU steal"], (
        row(key, label, *("%.1f" % m[k] if m.get(k) is not None else "" for k in metrics), "%.1f" % m["settle s"],
            "%.0f %%" % m["cpu busy %"], "%.1f %%" % m["cpu steal %"]) for key, label, m in rounds.runs))
    return "\n".join(lines)


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def command(argv: Sequence[str] | None = None) -> str:
    """The command that ran this benchmark, from the repository's root."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(shlex.quote(a) for a in [os.path.relpath(os.path.abspath(sys.argv[0]), ROOT), *args])


def machine_lines(modules: Sequence[str]) -> list[str]:
    """The report's first lines: date, machine, the versions of ``modules``, the exact command."""
    try:
        mem_kb = int([ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal")][0].split()[1])
        mem = "%.1f GiB" % (mem_kb / 1024 / 1024)
    except Exception:
        mem = "?"
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except Exception:
        java = "?"
    vers = []
    for mod in modules:
        try:
            from importlib.metadata import version

            vers.append("%s %s" % (mod, version(mod)))
        except Exception:
            if mod == "tfos_nb":
                try:
                    from tfos_nb import TFCluster  # noqa: F401

                    vers.append("tfos_nb (source tree)")
                except Exception as e:
                    vers.append("tfos_nb not importable (%s)" % one_line(e))
    try:
        cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except Exception:
        cpu = platform.processor() or "?"
    cmd = os.environ.get("BENCH_CMD") or " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    return [
        "- date: %s" % _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "- machine: `nproc`=%d (%s), memory %s, %s, Python %s, %s" % (
            os.cpu_count() or 0, cpu, mem, platform.platform(terse=True), platform.python_version(), java),
        "- versions: %s" % ", ".join(vers),
        "- command: `%s`" % cmd,
    ]


def memory_gib() -> float:
    import psutil

    return float(psutil.virtual_memory().total / (1 << 30))


def write_report(text: str, path: str) -> None:
    """Print the report and write it to ``path``."""
    print(text, flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def write_runs(report_path: str, benchmark: str, rounds: Rounds | Sequence[tuple[str, str, Mapping[str, Any]]],
               labels: Mapping[str, str], *, setting: str, command_line: str) -> str:
    """Every run (``rounds``, or ``(variant, run, metrics)`` in the order they ran; warm-ups labelled "warm-up"),
    as JSON beside the markdown report (``x.md`` -> ``x.json``); returns its path.  ``labels``: each variant's name
    in words."""
    path = os.path.splitext(report_path)[0] + ".json"
    done = rounds.runs if isinstance(rounds, Rounds) else list(rounds)
    doc = {
        "benchmark": benchmark,
        "date": now_utc(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(terse=True),
                    "python": platform.python_version()},
        "setting": setting,
        "command": command_line,
        "variants": {k: labels.get(k, k) for k in dict.fromkeys(key for key, _, _ in done)},
        "runs": [{"variant": key, "run": label, "metrics": {k: v for k, v in m.items() if isinstance(v, (int, float))}}
                 for key, label, m in done],
        "failures": dict(rounds.failures) if isinstance(rounds, Rounds) else {},
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return path
