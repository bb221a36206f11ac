"""The executor side of parallel runs: the Spark task that owns one run, and the run's process.

One Spark task per run.  The task (in Spark's Python worker) registers the run
with the driver's control server, starts the run's own process
(``python -m tfos_nb.runtime run``), relays its output and ``ctx.report``
progress in heartbeats, kills it when the driver says so, and returns the
run's outcome and its pickled return value as the task's result.

Why a process per run and not the Python worker itself: TensorFlow's
configuration is fixed at its first import (thread pools from
``TF_NUM_INTRAOP_THREADS``, ``TF_USE_LEGACY_KERAS``, visible GPUs), its global
state (Keras' graph and name counters, seeds, allocated GPU memory) cannot be
undone, and Spark reuses Python workers between tasks: a run in the worker
would leave all of that to the next run on the executor.  A child process
starts clean every time, gives its memory back when it ends, and a crash in
TensorFlow (segfault, out-of-memory kill) fails only that run, reported with
its last output lines.  It costs a process start and a TensorFlow import per
run — seconds, which is small next to a training run.

Nothing of a run outlives its owners: the child is in a session of its own
and kills its whole process group when its stdin (held by the task) closes,
i.e. when the task's Python worker dies (Spark cancelled the job, the executor
was lost); the task kills it when the driver stops answering.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .. import net, procs
from ..protocol import messages as m
from ..protocol.channel import ControlClient
from . import gpus as gpu_mod
from .context import NodeContext, Reporter
from .launch import _child_env, executor_id
from .node import read_blob, read_events, write_blob

TAIL_LINES = 100
LOG_BYTES_PER_BEAT = 64 * 1024
LINGER_S = 5.0  # a run whose function returned but whose process lingers (TensorFlow's threads) is ended


# ---------------------------------------------------------------------------
# The Spark task
# ---------------------------------------------------------------------------


def make_run_task(meta: dict[str, Any], blob: bytes, barrier: bool) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The task body for ``mapPartitions``: partition ``i`` runs run ``i``; yields ``(i, status, value)``."""

    def task(_: Iterable[Any]) -> Iterator[Any]:
        from pyspark import BarrierTaskContext, TaskContext

        tctx = BarrierTaskContext.get() if barrier else TaskContext.get()
        index = tctx.partitionId()
        res = tctx.resources().get("gpu")
        spark_gpus = list(res.addresses) if res is not None else []
        peers: list[str] = []
        if barrier:
            peers = [t.address.rsplit(":", 1)[0] for t in tctx.getTaskInfos()]
        run = _RunTask(meta, index, tctx.attemptNumber(), spark_gpus, peers)
        try:
            status, value = run.run(blob)
        except Exception as exc:  # noqa: BLE001 - the driver reports it; Spark must not retry
            status = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "tail": list(run.tail)}
            value = None
        status.update(index=index, host=run.host, executor_id=run.executor_id)
        yield index, json.dumps(status), value

    return task


class _RunTask:
    """Owns one run's process for the length of the Spark task."""

    def __init__(self, meta: dict[str, Any], index: int, attempt: int, spark_gpus: list[str],
                 peers: list[str]) -> None:
        self.meta = meta
        self.index = index
        self.label = f"run:{index}"
        self.attempt = attempt
        self.spark_gpus = spark_gpus
        self.peers = peers
        control = (meta["control"][0], int(meta["control"][1]))
        codec = m.Codec(bytes.fromhex(meta["secret"]), meta["cluster_id"], f"run{index}")
        self.client = ControlClient(codec, control, timeout=10)
        self.host = net.local_ip_towards(*control)
        self.executor_id = executor_id()
        self.hb_interval = float(meta.get("hb_interval", 0.5))
        self.driver_timeout = float(meta.get("driver_timeout", 10.0))
        self.child: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pending: collections.deque[str] = collections.deque()
        self.pending_bytes = 0
        self.dropped = 0
        self.report: dict[str, Any] = {}
        self.error: str | None = None
        self.running = False
        self.finished = False
        self.gpus: list[dict] = []
        self._threads: list[threading.Thread] = []

    # -- devices ----------------------------------------------------------------
    def _pick_gpus(self) -> list[dict]:
        """Spark's task GPUs; else, in a barrier stage, a share of the host's GPUs; else none pinned."""
        available = gpu_mod.query()
        if self.spark_gpus:
            known = {g["index"]: g for g in available}
            return [known.get(a, {"index": a, "name": "GPU"}) for a in self.spark_gpus]
        if available and self.peers:
            mine = self.peers[self.index] if self.index < len(self.peers) else ""
            local = [i for i, host in enumerate(self.peers) if host == mine]
            rank = local.index(self.index) if self.index in local else 0
            return gpu_mod.assign(available, rank, len(local), int(self.meta.get("num_gpus", 1)))
        return []

    # -- the run ------------------------------------------------------------------
    def run(self, blob: bytes) -> tuple[dict[str, Any], bytes | None]:
        self.gpus = self._pick_gpus()
        reply = self.client.request(
            m.Register(node=self.index, host=self.host, port=0, executor_id=self.executor_id, pid=os.getpid(),
                       gpus=self.gpus, spark_gpus=self.spark_gpus, working_dir=os.getcwd(), attempt=self.attempt)
        )
        if not reply.ok:
            self.client.close()
            return {"ok": False, "refused": True, "error": reply.error or "refused"}, None
        workdir = tempfile.mkdtemp(prefix=f"tfos_nb-{self.meta['cluster_id']}-run{self.index}-")
        result_path = os.path.join(workdir, "result.pkl")
        started = time.monotonic()
        try:
            self._start_child(blob, result_path)
            outcome, code = self._supervise()
            for t in self._threads:
                t.join(timeout=2)  # the readers reach EOF once the process is gone
            value = None
            if outcome == "finished":
                try:
                    with open(result_path, "rb") as f:
                        value = f.read()
                except OSError:
                    outcome = "failed"
                    with self.lock:
                        self.error = "the run finished but left no result (its process was killed?)"
            self._final_heartbeat(outcome, code)
            with self.lock:
                status = {
                    "ok": outcome == "finished",
                    "state": outcome,
                    "error": self.error if outcome == "failed" else None,
                    "exit_code": code,
                    "tail": list(self.tail) if outcome == "failed" else [],
                    "report": dict(self.report),
                    "elapsed": time.monotonic() - started,
                }
            return status, value
        finally:
            if self.child is not None and self.child.poll() is None:
                procs.kill_tree(self.child, grace=1)
            self.client.close()
            shutil.rmtree(workdir, ignore_errors=True)

    def _start_child(self, blob: bytes, result_path: str) -> None:
        meta = self.meta
        env = _child_env(meta)
        env.update({k: str(v) for k, v in meta.get("env", {}).items()})
        env.pop("TF_CONFIG", None)  # a single-node run: no cluster for TensorFlow to join
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONUNBUFFERED"] = "1"
        if meta.get("keras", "tf_keras") == "tf_keras":
            env["TF_USE_LEGACY_KERAS"] = "1"
        if self.gpus or self.spark_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g["index"]) for g in self.gpus)
        read_fd, write_fd = os.pipe()
        env["TFOS_REPORT_FD"] = str(write_fd)
        info = {
            "index": self.index,
            "num_runs": meta["num_runs"],
            "executor_id": self.executor_id,
            "host": self.host,
            "default_fs": meta.get("default_fs", "file:///"),
            "working_dir": os.getcwd(),
            "gpus": self.gpus,
            "cluster_id": meta["cluster_id"],
            "result_path": result_path,
        }
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "tfos_nb.runtime", "run", meta["cluster_id"]],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        assert self.child.stdin is not None
        write_blob(self.child.stdin, blob)
        write_blob(self.child.stdin, json.dumps(info).encode())
        self.child.stdin.flush()  # kept open: its end is the run's signal that its owner is gone
        for target, args in ((self._read_output, ()), (self._read_reports, (read_fd,))):
            t = threading.Thread(target=target, args=args, name=f"tfos-run{self.index}-io", daemon=True)
            t.start()
            self._threads.append(t)

    def _read_output(self) -> None:
        assert self.child is not None and self.child.stdout is not None
        for raw in self.child.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")[:4000]
            with self.lock:
                self.tail.append(line)
                if self.pending_bytes + len(line) > 4 * LOG_BYTES_PER_BEAT:
                    self.dropped += 1
                else:
                    self.pending.append(line)
                    self.pending_bytes += len(line)
        self.child.stdout.close()
        self.wake.set()

    def _read_reports(self, fd: int) -> None:
        for kind, ev in read_events(fd):
            with self.lock:
                if kind == "ready":
                    self.running = True
                elif kind == "report":
                    ev.pop("batch", None)  # every report since the last write: only clusters keep a history
                    self.report = ev
                elif kind == "error":
                    self.error = str(ev.get("error"))[:2000]
                elif kind == "finished":
                    self.finished = True
            self.wake.set()

    def _heartbeat(self, state: str, exit_code: int | None = None, final: bool = False) -> m.Reply:
        with self.lock:
            logs, size = [], 0
            while self.pending and size < LOG_BYTES_PER_BEAT:
                line = self.pending.popleft()
                size += len(line)
                logs.append(line)
            self.pending_bytes -= size
            dropped, self.dropped = self.dropped, 0
            failed = final and state == "failed"
            return self.client.request(
                m.Heartbeat(node=self.index, state=state, child_pid=self.child.pid if self.child else None,
                            report=dict(self.report), logs=logs, logs_dropped=dropped, exit_code=exit_code,
                            error=self.error if failed else None, tail=list(self.tail) if failed else [])
            )

    def _supervise(self) -> tuple[str, int | None]:
        """Heartbeat until the run ends, is killed by the driver, or the driver is gone."""
        assert self.child is not None
        last_ok = time.monotonic()
        finished_at: float | None = None
        while True:
            code = self.child.poll()
            with self.lock:
                running, finished, error = self.running, self.finished, self.error
            if finished and code is None:
                finished_at = finished_at or time.monotonic()
                if time.monotonic() - finished_at > LINGER_S:
                    code = procs.kill_tree(self.child, grace=1)
            if code is not None:
                if finished and error is None:
                    return "finished", code
                with self.lock:
                    self.error = self.error or f"the run's process {procs.describe_exit(code)}"
                return "failed", code
            try:
                reply = self._heartbeat("running" if running else "starting")
                last_ok = time.monotonic()
            except (OSError, m.ProtocolError):
                if time.monotonic() - last_ok > self.driver_timeout:
                    code = procs.kill_tree(self.child, grace=1)
                    with self.lock:
                        self.error = f"the driver stopped answering for {self.driver_timeout:.0f} s"
                    return "failed", code
                reply = None
            cmd = m.BeatCommand.from_dict(reply.body) if reply is not None else None
            if cmd is not None and cmd.kill:
                code = procs.kill_tree(self.child, grace=cmd.grace)
                with self.lock:
                    done = self.finished and self.error is None
                return ("finished" if done else "stopped"), code
            self.wake.wait(self.hb_interval)
            self.wake.clear()

    def _final_heartbeat(self, outcome: str, code: int | None) -> None:
        for _ in range(3):
            try:
                self._heartbeat(outcome, exit_code=code, final=True)
                return
            except (OSError, m.ProtocolError):
                time.sleep(0.2)


# ---------------------------------------------------------------------------
# The run's process: python -m tfos_nb.runtime run
# ---------------------------------------------------------------------------


class RunContext(NodeContext):
    """What a parallel run's function sees as ``ctx`` (TensorFlowOnSpark's ``TFParallel`` context).

    ``worker_num`` and ``executor_id`` are the run's index (0 … ``num_workers``-1),
    as in TensorFlowOnSpark, so a run can take its shard of a data set;
    ``num_workers`` is the number of runs; ``job_name`` is ``"worker"``,
    ``task_index`` the index, ``cluster_spec`` is empty (no cluster) and
    ``is_chief`` is true for run 0 only.  Also ``run_index``, ``num_runs``,
    ``spark_executor_id`` (the Spark executor it runs on), ``host``, ``gpus``,
    ``report(step=…, **metrics)`` and ``progress_callback()``.
    """

    def __init__(self, info: dict[str, Any], reporter: Reporter | None) -> None:
        index = int(info["index"])
        super().__init__(
            {
                "job_name": "worker",
                "task_index": index,
                "node": index,
                "cluster_spec": {},
                "executor_id": index,
                "default_fs": info.get("default_fs", "file:///"),
                "working_dir": info.get("working_dir"),
                "gpus": info.get("gpus", []),
                "cluster_id": info.get("cluster_id", ""),
            },
            None,
            reporter,
        )
        self.run_index = index
        self.num_runs = self.num_workers = int(info["num_runs"])
        self.spark_executor_id: str = str(info.get("executor_id", ""))
        self.host: str = str(info.get("host", ""))

    def get_data_feed(self, *args: Any, **kwargs: Any) -> Any:
        msg = (
            "parallel runs have no data feed: read the data in the function, e.g. the shard "
            "ctx.worker_num of ctx.num_workers"
        )
        raise RuntimeError(msg)


def _watch_owner(fd: int) -> None:
    """EOF on stdin: the task that owns this run is gone; so is this run, children included."""
    while os.read(fd, 4096):
        pass
    os.killpg(os.getpgid(0), signal.SIGKILL)


_OWN_MODULES = ("tfos_nb.runtime.executor.parallel_task", "tfos_nb.magics._cellfn")


def _print_user_traceback(exc: BaseException) -> None:
    """The traceback from the user's function down: our own calling frames only hide the cause."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_globals.get("__name__") in _OWN_MODULES:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def main() -> int:
    import cloudpickle

    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    blob = read_blob(stdin)
    info = json.loads(read_blob(stdin))
    stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - user code must not read the owner's pipe
    reporter = Reporter(os.fdopen(int(os.environ["TFOS_REPORT_FD"]), "w", buffering=1))
    threading.Thread(target=_watch_owner, args=(0,), name="tfos-run-owner", daemon=True).start()
    label = f"run:{info['index']}"
    try:
        fn, all_args = cloudpickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - reported to the driver as the run's error
        traceback.print_exc()
        reporter.event({"t": "error", "error": f"cannot load the run's function: {type(exc).__name__}: {exc}"})
        return 1
    ctx = RunContext(info, reporter)
    reporter.event({"t": "ready"})
    try:
        value = fn(all_args[info["index"]], ctx)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is an error too
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            _print_user_traceback(exc)
            sys.stderr.flush()
            first = str(exc).strip().splitlines()
            reporter.event({"t": "error", "error": f"{type(exc).__name__}: {first[0] if first else ''}".rstrip(": ")})
            return 1
        value = None
    finally:
        reporter.flush()
    try:
        data = cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001
        msg = f"the value {label} returned cannot be pickled ({type(exc).__name__}: {exc}); return plain data"
        print(msg, file=sys.stderr, flush=True)
        reporter.event({"t": "error", "error": msg})
        return 1
    with open(info["result_path"], "wb") as f:
        f.write(data)
    sys.stdout.flush()
    sys.stderr.flush()
    reporter.event({"t": "finished"})
    return 0
