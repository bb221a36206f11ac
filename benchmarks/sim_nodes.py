#!/usr/bin/env python
"""Simulated nodes for the scale benchmark (B6): node supervisors that speak tfos_nb's control protocol without
TensorFlow, many to a process, against the real driver.

Each simulated node does what a node's supervisor does on the wire (``executor/process/supervisor.py``): it registers
(host, port, executor, pid), asks for its cluster spec until the cluster formed, then heartbeats every
``hb_interval`` s (the launch's, 0.5 s) carrying its progress reports since the last beat — a step every
``step_ms`` ms (drawn between the two bounds) with a loss and an accuracy — its clocks (``times``), and an output
line every ``log_every`` steps; it ends with a last heartbeat ``finished`` (its function's return value) when the
driver says stop, after ``steps`` steps, or ``failed`` ``fail_after`` s into training (node ``fail_node``); the nodes
in ``slow`` take four times as long a step.  ``stop_ends``: the driver's stop (``shutdown()``) ends a node as a
function that checks ``ctx.should_stop()`` would; without it, a node runs its ``steps`` and returns, as a
TensorFlow-mode function does while the cell waits for it.  Each heartbeat's
round trip (the driver decodes, records and answers it), with when it was sent, is printed as JSON at the end.

:class:`SimLaunch` stands in for the Spark launch stage (``runtime/driver/launching.Launch``) in the benchmark's
process: given the launch's meta, it starts the processes that host the nodes and reports each node started, as
the launch tasks would.  It is used by ``bench_sim.py`` only (patched in for the run); the runtime has no hook for it.

    python benchmarks/sim_nodes.py   # reads {"meta": ..., "nodes": [...], ...} as one JSON line on stdin
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _node(meta: Any, index: int, opts: dict[str, Any], go: threading.Event, rtts: list[tuple[float, float]],
          errors: list[str], failed: list[float]) -> None:
    from tfos_nb.runtime.protocol import messages
    from tfos_nb.runtime.protocol.channel import ControlClient

    client = ControlClient(messages.Codec(bytes.fromhex(meta.secret), meta.cluster_id, f"node{index}"), meta.address,
                           timeout=60)
    rng = random.Random(index)

    def request(msg: Any) -> Any:
        t0, w0 = time.perf_counter(), time.time()
        reply = client.request(msg)
        if isinstance(msg, messages.Heartbeat):  # (when it was sent, its round trip)
            rtts.append((w0, time.perf_counter() - t0))
        return reply

    try:
        go.wait()
        reply = request(messages.Register(node=index, host="127.0.0.1", port=30000 + index,
                                          executor_id=str(index), pid=os.getpid(), working_dir=os.getcwd()))
        if not reply.ok:
            raise RuntimeError(reply.error or "registration refused")
        while True:
            reply = request(messages.AwaitSpec(node=index))
            if reply.ok:
                break
            if reply.error:
                raise RuntimeError(reply.error)
            time.sleep(messages.Retry.from_dict(reply.body).retry)
        lo, hi = opts["step_ms"]
        if index in opts.get("slow", ()):  # a straggler: steps four times as long
            lo, hi = 4 * lo, 4 * hi
        steps, fail_after = opts["steps"], opts["fail_after"] if index == opts["fail_node"] else None
        step, t_step, t0 = 0, time.time(), time.time()
        outcome = None
        while outcome is None:
            now = time.time()
            reports, logs = [], []
            while step < steps and t_step <= now:
                step += 1
                t_step += rng.uniform(lo, hi) / 1000.0
                wall = t_step - t0
                reports.append({"step": step, "time": t_step, "metrics": {"loss": 1.0 / step, "accuracy": 0.5},
                                "times": {"wall": wall, "step": 0.9 * wall, "input": 0.1 * wall,
                                          "cpu": 0.5 * wall}})
                if opts["log_every"] and step % opts["log_every"] == 0:
                    logs.append(f"step {step}: loss {1.0 / step:.4f}")
            if fail_after is not None and now - t0 >= fail_after:
                outcome = "failed"
                failed.append(time.time())  # when its failure left: the benchmark times the driver's naming it
            if outcome is None and step >= steps:
                outcome = "finished"
            state = outcome or "running"
            beat = messages.Heartbeat(
                node=index, state=state, child_pid=os.getpid(), report=reports[-1] if reports else {},
                reports=reports, logs=logs, returned={"value": step} if state == "finished" else {},
                exit_code=None if state == "running" else (0 if state == "finished" else 1),
                error="RuntimeError: injected failure" if state == "failed" else None,
                tail=["Traceback (most recent call last):", "RuntimeError: injected failure"] if state == "failed" else [])
            reply = request(beat)
            if outcome is not None:
                break
            cmd = messages.BeatCommand.from_dict(reply.body) if reply.ok else messages.BeatCommand()
            if (cmd.stop and opts.get("stop_ends", True)) or cmd.kill:
                request(messages.Heartbeat(node=index, state="finished" if cmd.stop else "stopped",
                                           child_pid=os.getpid(), returned={"value": step} if cmd.stop else {},
                                           exit_code=0 if cmd.stop else -9))
                break
            time.sleep(max(0.0, meta.hb_interval - (time.time() - now)))
    except Exception as exc:  # a node's failure is counted, the others go on
        errors.append(f"node {index}: {type(exc).__name__}: {exc}")
        if len(errors) <= 3:
            print(errors[-1], file=sys.stderr, flush=True)
    finally:
        client.close()


def serve() -> int:
    """One host process: its nodes as threads, started together; prints ``started`` then, at the end, its stats."""
    sys.path.insert(0, ROOT)
    from tfos_nb.runtime.protocol import messages

    job = json.loads(sys.stdin.readline())
    meta = messages.LaunchMeta.parse(job["meta"])
    go = threading.Event()
    rtts: list[tuple[float, float]] = []
    errors: list[str] = []
    failed: list[float] = []
    threads = [threading.Thread(target=_node, args=(meta, i, job, go, rtts, errors, failed), daemon=True)
               for i in job["nodes"]]
    for t in threads:
        t.start()
    print("started", flush=True)
    go.set()
    for t in threads:
        t.join()
    print(json.dumps({"rtts": rtts, "errors": errors, "failed": failed}), flush=True)
    return 0


class SimLaunch:
    """In place of ``Launch``: the nodes of ``meta`` started in ``SimLaunch.processes`` processes (see the module)."""

    processes = 8
    options: dict[str, Any] = {"steps": 10**9, "step_ms": (50, 200), "log_every": 50, "fail_after": None,
                               "fail_node": -1, "slow": [], "stop_ends": True}
    started: list[subprocess.Popen] = []  # every host process of the run: the benchmark waits for them, or kills them

    def __init__(self, job: Any, meta: dict[str, Any], blob: bytes, stages: list[Any], *, barrier: bool,
                 labels: list[str]) -> None:
        self._meta = meta
        self._nodes = [i for s in stages for i in s.nodes]
        self._statuses: list[Any] = []

    def start(self) -> SimLaunch:
        from tfos_nb.runtime.protocol import messages

        groups = [self._nodes[k::self.processes] for k in range(self.processes)]
        env = {**os.environ, "PYTHONPATH": ROOT}
        for nodes in (g for g in groups if g):
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=env)
            SimLaunch.started.append(proc)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps({"meta": self._meta, "nodes": nodes, **self.options}) + "\n")
            proc.stdin.flush()
        for proc in SimLaunch.started[-len([g for g in groups if g]):]:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "started":
                raise RuntimeError("a simulated nodes' process did not start")
        self._statuses = [messages.LaunchStatus(node=i, ok=True, pid=0, host="127.0.0.1", port=30000 + i)
                          for i in self._nodes]
        return self

    @classmethod
    def kill_all(cls) -> None:
        """End every host process still running (a failed run's), and forget them."""
        for proc in cls.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    done = True
    error = None

    def result(self) -> list[Any]:
        return list(self._statuses)

    def waiting(self) -> str:
        return ""

    def forget(self) -> None:
        pass


if __name__ == "__main__":
    sys.exit(serve())
