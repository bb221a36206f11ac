"""A node's supervisor: registers with the driver, owns the TensorFlow process.

One supervisor per node, started by the Spark launch task (which then returns,
freeing the executor's slot for feeding tasks).  It

* registers the node (host, port, executor, pid, GPUs) and waits for the
  cluster spec;
* starts the node process (``node.py``) with ``TF_CONFIG`` and its GPUs, and
  TensorBoard on the chief when asked;
* heartbeats to the driver twice a second, carrying progress reports and new
  output lines, and relays the driver's commands (end of epoch, stop, kill);
* is bound to the lives of the driver (no answer for ``driver_timeout`` s) and of
  its executor JVM: when either dies, it kills its process group and exits.
  Nothing of a node survives its owners.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from .. import net, procs
from ..protocol import messages as m
from ..protocol.channel import ControlClient
from . import gpus as gpu_mod
from .node import read_blob, read_events, write_blob

LOG_BYTES_PER_BEAT = 64 * 1024
REPORT_BYTES_PER_BEAT = 256 * 1024  # the metric history; the rest goes with the next beats
REPORTS_KEPT = 20000
TAIL_LINES = 100


class Supervisor:
    def __init__(self, meta: dict[str, Any], blob: bytes) -> None:
        self.meta = meta
        self.blob = blob
        # run(env=...) applies to the whole node, GPU discovery (PATH to nvidia-smi) included.
        os.environ.update({k: str(v) for k, v in meta.get("env", {}).items()})
        self.index: int = meta["node"]
        self.job_name, self.task_index = meta["roles"][self.index]
        self.label = f"{self.job_name}:{self.task_index}"
        secret = bytes.fromhex(meta["secret"])
        self.secret = secret
        control = (meta["control"][0], int(meta["control"][1]))
        self.client = ControlClient(m.Codec(secret, meta["cluster_id"], f"node{self.index}"), control, timeout=10)
        self.host = net.local_ip_towards(*control)
        self.port = net.free_port(self.host)
        # Held until the node's function runs (TensorFlowOnSpark's ctx.tmp_socket / release_port).
        self.port_socket = net.reserve_port(self.port)
        self.hb_interval = float(meta.get("hb_interval", 0.5))
        self.driver_timeout = float(meta.get("driver_timeout", 15.0))
        self.jvm_pid = procs.executor_jvm_pid() if meta.get("watch_jvm", True) else None
        self.child: subprocess.Popen | None = None
        self.tensorboard: subprocess.Popen | None = None
        self.tb_url: str | None = None
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pending_logs: collections.deque[str] = collections.deque()
        self.pending_bytes = 0
        self.dropped = 0
        self.report: dict[str, Any] = {}
        self.reports: collections.deque[dict[str, Any]] = collections.deque(maxlen=REPORTS_KEPT)  # not sent yet
        self.value: Any = None
        self.data_port: int | None = None
        self.error: str | None = None
        self.running = False
        self.finished = False
        self.feed_closed = False  # the function stopped reading data (terminate() or returned)
        self.gpus: list[dict] = []
        self._output_thread: threading.Thread | None = None

    # -- registration ---------------------------------------------------------
    def register(self) -> None:
        available = gpu_mod.query()
        reply = self.client.request(
            m.Register(
                node=self.index,
                host=self.host,
                port=self.port,
                executor_id=str(self.meta.get("executor_id", "")),
                pid=os.getpid(),
                gpus=available,
                spark_gpus=list(self.meta.get("spark_gpus", [])),
                working_dir=self.meta.get("working_dir", os.getcwd()),
                attempt=int(self.meta.get("attempt", 0)),
            )
        )
        if not reply.ok:
            raise RuntimeError(reply.error or "registration refused")

    def await_spec(self) -> dict[str, Any]:
        deadline = time.monotonic() + float(self.meta.get("reservation_timeout", 600))
        while time.monotonic() < deadline:
            reply = self.client.request(m.AwaitSpec(node=self.index))
            if reply.ok:
                return m.NodeSpec.from_dict(reply.body).to_dict()
            if reply.error:
                raise RuntimeError(reply.error)
            self.wake.wait(m.Retry.from_dict(reply.body).retry)
        raise TimeoutError("timed out waiting for the cluster spec")

    # -- the node process -------------------------------------------------------
    def start_child(self, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env.update({k: str(v) for k, v in self.meta.get("env", {}).items()})
        env["TF_CONFIG"] = json.dumps(spec["tf_config"])
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONUNBUFFERED"] = "1"
        if self.meta.get("keras", "tf_keras") == "tf_keras":
            env["TF_USE_LEGACY_KERAS"] = "1"
        self.gpus = spec.get("gpus", [])
        if self.meta.get("spark_gpus") or self.gpus or spec.get("host_has_gpus"):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g["index"]) for g in self.gpus)
        read_fd, write_fd = os.pipe()
        env["TFOS_REPORT_FD"] = str(write_fd)
        info = {
            "node": self.index,
            "job_name": self.job_name,
            "task_index": self.task_index,
            "cluster_spec": spec["cluster_spec"],
            "executor_id": self.meta.get("executor_id", ""),
            "default_fs": self.meta.get("default_fs", "file:///"),
            "working_dir": self.meta.get("working_dir", os.getcwd()),
            "log_dir": spec.get("log_dir"),
            "gpus": self.gpus,
            "feed": bool(spec.get("feed")),
            "secret": self.meta["secret"],
            "host": self.host,
            "cluster_id": self.meta["cluster_id"],
            "release_port": bool(self.meta.get("release_port", True)),
        }
        fds = (write_fd,)
        if self.port_socket is not None:
            info["port_fd"] = self.port_socket.fileno()
            fds += (info["port_fd"],)
        self.child = subprocess.Popen(
            [sys.executable, "-m", "tfos_nb.runtime", "node", self.meta["cluster_id"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
            env=env,
            cwd=self.meta.get("working_dir") or None,
            start_new_session=True,
        )
        os.close(write_fd)
        if self.port_socket is not None:  # the node process holds the reservation now
            self.port_socket.close()
            self.port_socket = None
        assert self.child.stdin is not None
        write_blob(self.child.stdin, self.blob)
        write_blob(self.child.stdin, json.dumps(info).encode())
        self.child.stdin.flush()
        self._output_thread = threading.Thread(target=self._read_output, name="tfos-sup-output", daemon=True)
        self._output_thread.start()
        threading.Thread(target=self._read_reports, args=(read_fd,), name="tfos-sup-reports", daemon=True).start()
        threading.Thread(target=self._wait_child, name="tfos-sup-wait", daemon=True).start()

    def start_tensorboard(self, logdir: str) -> None:
        port = net.free_port(self.host)
        os.makedirs(logdir, exist_ok=True)
        self.tensorboard = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", self.host, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.tb_url = f"http://{net.hostport(self.host, port)}"

    def _read_output(self) -> None:
        assert self.child is not None and self.child.stdout is not None
        for raw in self.child.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")[:4000]
            sys.stderr.write(f"[{self.label}] {line}\n")
            with self.lock:
                self.tail.append(line)
                if self.pending_bytes + len(line) > 4 * LOG_BYTES_PER_BEAT:
                    self.dropped += 1
                else:
                    self.pending_logs.append(line)
                    self.pending_bytes += len(line)

    def _read_reports(self, fd: int) -> None:
        for kind, ev in read_events(fd):
            with self.lock:
                if kind == "ready":
                    self.data_port = ev.get("data_port")
                    self.running = True
                elif kind == "report":
                    batch = ev.pop("batch", None)
                    self.report = ev
                    self.reports.extend(batch if isinstance(batch, list) else [ev])
                elif kind == "error":
                    self.error = str(ev.get("error"))[:2000]
                elif kind == "finished":
                    self.finished = True
                    self.value = ev.get("value")
                elif kind == "feed_closed":
                    self.feed_closed = True
            self.wake.set()

    def _wait_child(self) -> None:
        assert self.child is not None
        self.child.wait()
        self.wake.set()

    def send_control(self, obj: dict[str, Any]) -> None:
        if self.child is None or self.child.stdin is None:
            return
        try:
            self.child.stdin.write((json.dumps(obj) + "\n").encode())
            self.child.stdin.flush()
        except (OSError, ValueError):
            pass

    # -- heartbeats -----------------------------------------------------------
    def _heartbeat(self, state: str, exit_code: int | None = None, final: bool = False) -> m.Reply:
        with self.lock:
            logs, size = [], 0
            while self.pending_logs and size < LOG_BYTES_PER_BEAT:
                line = self.pending_logs.popleft()
                size += len(line)
                logs.append(line)
            self.pending_bytes -= size
            dropped, self.dropped = self.dropped, 0
            report = dict(self.report)
            reports, size = [], 0
            while self.reports and size < REPORT_BYTES_PER_BEAT:
                reports.append(self.reports.popleft())
                size += len(json.dumps(reports[-1]))
            error = self.error
            # A node whose function failed is not "done reading": feeders that lost it wait for its failure.
            feed = {"closed": True} if self.feed_closed and error is None else {}
            tail = list(self.tail) if (final and state == "failed") else []
        if self.gpus and self.gpus[0].get("index") is not None and not final:
            report["gpus"] = self._gpu_usage()
        return self.client.request(
            m.Heartbeat(
                node=self.index,
                state=state,
                child_pid=self.child.pid if self.child else None,
                data_port=self.data_port,
                tensorboard=self.tb_url,
                report=report,
                reports=reports,
                returned={"value": self.value} if final and self.value is not None else {},
                feed=feed,
                logs=logs,
                logs_dropped=dropped,
                exit_code=exit_code,
                error=error if state == "failed" else None,
                tail=tail,
            )
        )

    _gpu_checked = 0.0

    def _gpu_usage(self) -> list[dict]:
        now = time.monotonic()
        if now - self._gpu_checked > 5:
            self._gpu_checked = now
            fresh = gpu_mod.query([str(g["index"]) for g in self.gpus])
            if fresh:
                self.gpus = fresh
        return self.gpus

    def run(self) -> int:
        spec = self.await_spec()
        if spec.get("tensorboard"):
            self.start_tensorboard(spec["log_dir"])
        self.start_child(spec)
        assert self.child is not None
        last_ok = time.monotonic()
        sent_gen, sent_stop = 0, False
        finished_at: float | None = None
        outcome = "running"
        code: int | None = None
        try:
            while True:
                code = self.child.poll()
                with self.lock:
                    running, finished, error = self.running, self.finished, self.error
                if finished and code is None:
                    # The function returned but the process lingers (TensorFlow's
                    # threads at exit): give it a moment, then end it.
                    finished_at = finished_at or time.monotonic()
                    if time.monotonic() - finished_at > 10:
                        procs.kill_tree(self.child, grace=1)
                        code = self.child.returncode
                if code is not None:
                    outcome = "finished" if (finished and error is None) else "failed"
                    if outcome == "failed" and error is None:
                        with self.lock:
                            self.error = f"the node process {procs.describe_exit(code)}"
                    break
                if self.jvm_pid and not procs.pid_alive(self.jvm_pid):
                    with self.lock:
                        self.error = f"executor {self.meta.get('executor_id')} (JVM pid {self.jvm_pid}) died"
                    procs.kill_tree(self.child, grace=1)
                    code = self.child.returncode
                    outcome = "failed"
                    break
                try:
                    reply = self._heartbeat("running" if running else "starting")
                    last_ok = time.monotonic()
                except (OSError, m.ProtocolError):
                    if time.monotonic() - last_ok > self.driver_timeout:
                        procs.kill_tree(self.child, grace=1)
                        return 2  # the driver is gone; nobody to report to
                    self.wake.wait(self.hb_interval)
                    self.wake.clear()
                    continue
                cmd = m.BeatCommand.from_dict(reply.body)
                gen = cmd.epoch_done
                if gen > sent_gen:
                    sent_gen = gen
                    self.send_control({"op": "gen_done", "gen": gen})
                if cmd.stop and not sent_stop:
                    sent_stop = True
                    self.send_control({"op": "stop"})
                if cmd.kill:
                    procs.kill_tree(self.child, grace=cmd.grace)
                    code = self.child.returncode
                    with self.lock:
                        done = self.finished and self.error is None
                    outcome = "finished" if done else "stopped"
                    break
                self.wake.wait(self.hb_interval)
                self.wake.clear()
        finally:
            if self.child.poll() is None:
                procs.kill_tree(self.child, grace=1)
            if self.tensorboard is not None:
                procs.kill_tree(self.tensorboard, grace=1)
        # The final report carries the last lines: let the reader reach EOF first.
        if self._output_thread is not None:
            self._output_thread.join(timeout=2)
        for _ in range(3):
            try:
                self._heartbeat(outcome, exit_code=code, final=True)
                break
            except (OSError, m.ProtocolError):
                self.wake.wait(0.2)
        return 0


def main() -> int:
    stdin = sys.stdin.buffer
    meta = json.loads(read_blob(stdin))
    blob = read_blob(stdin)
    out = sys.stdout
    try:
        sup = Supervisor(meta, blob)
        sup.register()
    except Exception as exc:  # noqa: BLE001 - reported to the launch task
        out.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ok": True, "pid": os.getpid(), "host": sup.host, "port": sup.port}) + "\n")
    out.flush()
    # The launch task stops listening now; keep nothing pointing at its pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        return sup.run()
    except Exception as exc:  # noqa: BLE001 - tell the driver, then end
        sys.stderr.write(f"tfos_nb supervisor of {sup.label} failed: {type(exc).__name__}: {exc}\n")
        with sup.lock:
            sup.error = sup.error or f"supervisor: {type(exc).__name__}: {exc}"
        try:
            sup._heartbeat("failed", final=True)
        except (OSError, m.ProtocolError):
            pass
        if sup.child is not None and sup.child.poll() is None:
            procs.kill_tree(sup.child, grace=1)
        return 1
