#!/usr/bin/env python
"""B4c: what the live panel sends to the browser during a training run.

Simulates a run's state updates at a high rate (every node reporting ``--rate`` steps/s,
the renderer's ``update()`` called on every report, as the runtime's listener could)
through the real widget renderer and a real ipywidgets panel whose comm only counts, and
prints the comm messages and their bytes.  No Spark, no kernel.  The target: a 60 s run
sends no more than ~120 updates (≤ 2/s), whatever the step rate.

    .venv/bin/python benchmarks/bench_widget.py                  # 60 s simulated (fake clock), 4 nodes, 1,000 steps/s
    .venv/bin/python benchmarks/bench_widget.py --real --seconds 5   # real time, for the wall-clock cost
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfos_nb.runtime.driver.control.state import ClusterView, NodeView
from tfos_nb.widgets import JobProgress, make_renderer


class CountingComm:
    comm_id = "bench"
    kernel = "Truthy"
    messages: list[tuple[float, int]] = []
    clock = time.monotonic

    def __init__(self, **kwargs) -> None:
        pass

    def open(self, *a, **k) -> None:
        pass

    def on_msg(self, *a, **k) -> None:
        pass

    def close(self, *a, **k) -> None:
        pass

    def send(self, data=None, buffers=None, **kwargs) -> None:
        CountingComm.messages.append((CountingComm.clock(), len(json.dumps(data).encode())))


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class NullDisplay:
    def __call__(self, obj, **kw):
        return self

    def update(self, obj, **kw):
        pass


def view(t: float, rate: int, nodes: int, seconds: float, state: str = "running") -> ClusterView:
    roles = [("chief", 0)] + [("worker", i) for i in range(nodes - 1)]
    step = int(t * rate)
    total = int(seconds * rate)
    done = state == "finished"
    return ClusterView(
        cluster_id="bench",
        name="bench",
        state=state,
        started_at=0.0,
        elapsed=t,
        job_group="tfos-bench",
        nodes=tuple(
            NodeView(
                index=i,
                job_name=job,
                task_index=idx,
                state="finished" if done else "running",
                host=f"10.0.0.{i + 1}",
                executor_id=str(i),
                device="NVIDIA A100 (1234/81920 MiB)",
                step=step,
                total_steps=total,
                steps_per_sec=float(rate),
                metrics={"loss": 1.0 / (step + 1), "accuracy": min(1.0, step / total), "epoch": step * 5 // total},
                last_heartbeat_age=0.3,
            )
            for i, (job, idx) in enumerate(roles)
        ),
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rate", type=int, default=1000, help="steps/s reported by each node")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--real", action="store_true", help="real time instead of a simulated clock")
    opts = p.parse_args()

    import comm

    comm.create_comm = lambda **kw: CountingComm(**kw)
    clock = time.monotonic if opts.real else FakeClock()
    CountingComm.clock = clock
    renderer = make_renderer("widget", display=NullDisplay(), clock=clock)
    created = len(CountingComm.messages)
    reports = opts.rate * opts.nodes
    calls = 0
    t0 = time.monotonic()
    start = clock()
    while True:
        t = clock() - start
        if t >= opts.seconds:
            break
        renderer.update(view(t, opts.rate, opts.nodes, opts.seconds), JobProgress(int(t), int(opts.seconds)))
        calls += 1
        if opts.real:
            time.sleep(1 / reports)
        else:
            clock.t += 1 / reports
    renderer.finish(view(opts.seconds, opts.rate, opts.nodes, opts.seconds, "finished"))
    wall = time.monotonic() - t0
    msgs = CountingComm.messages[created:]
    per_s: dict[int, int] = {}
    for at, _ in msgs:
        per_s[int(at - start)] = per_s.get(int(at - start), 0) + 1
    total_bytes = sum(b for _, b in msgs)
    print(f"B4c widget panel: {opts.seconds:g} s {'real' if opts.real else 'simulated'} run, {opts.nodes} nodes x {opts.rate} steps/s")
    print(f"  renderer.update() calls      {calls}")
    print(f"  renderer pushes              {renderer.pushes}")
    print(f"  comm messages                {len(msgs)}  (target <= {int(2 * opts.seconds)} + final)")
    print(f"  comm bytes (JSON)            {total_bytes}  ({total_bytes / max(len(msgs), 1):.0f} B/message)")
    print(f"  max messages in one second   {max(per_s.values()) if per_s else 0}")
    print(f"  wall time                    {wall:.2f} s")
    ok = len(msgs) <= 2 * opts.seconds + 2 and max(per_s.values(), default=0) <= 2
    print("  PASS" if ok else "  FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
