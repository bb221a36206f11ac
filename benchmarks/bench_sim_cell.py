#!/usr/bin/env python
"""B6, the notebook's side: a ``%%tfos_cluster`` cell of 512 simulated nodes in a real kernel, its panel on.

A real IPython kernel (jupyter_client, this interpreter) loads tfos_nb, starts a local Spark session, patches the
launch stage for :class:`sim_nodes.SimLaunch` (as ``bench_sim.py`` does) and runs ``%%tfos_cluster --workers N``
with the widget panel, as a notebook would.  Nodes 3 and 7 are slow (steps four times as long), so the panel has
nodes to list.  This process is the front-end: it reads every message the kernel publishes and, over ``--steady``
s of training, measures the kernel process's CPU (% of one core; the simulated nodes are other processes), the
panel's updates a second and their bytes a second (ipywidgets' comm messages, what a front-end receives), and the
nodes' output lines a second and their bytes (the cell's printed output).  One panel update's HTML is kept and
drawn by headless Chromium: ``--screenshot PATH``.

    .venv/bin/python benchmarks/bench_sim_cell.py --nodes 512 --screenshot docs/images/panel-512.png

Writes ``benchmarks/results/b6-cell.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import harness

SETUP = """
import sys
sys.path.insert(0, {bench!r})
from unittest import mock
import sim_nodes
from tfos_nb.runtime.driver import job as job_module
from tfos_nb.runtime.driver.launch import start as start_module
sim_nodes.SimLaunch.options = {{**sim_nodes.SimLaunch.options, "steps": {steps}, "slow": [3, 7],
                                "stop_ends": False}}
_sim_patches = [mock.patch.object(start_module, "Launch", sim_nodes.SimLaunch),
                mock.patch.object(job_module.DriverJob, "wait_for_slots", lambda self, needed, timeout: None)]
for _p in _sim_patches:
    _p.start()
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[{nodes}]").appName("tfos_nb-bench-sim-cell")
         .config("spark.ui.enabled", "false").getOrCreate())
%load_ext tfos_nb
%config TFOSMagics.renderer = {renderer!r}
%config TFOSMagics.log_lines = {log_lines!r}
"""
CELL = """%%tfos_cluster --workers {nodes} --name sim {background}
pass  # the simulated nodes do not run the cell's function
"""


def kernel(tmp: str):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = os.path.join(tmp, "kernels", "bench")
    os.makedirs(spec)
    with open(os.path.join(spec, "kernel.json"), "w") as f:
        json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "bench", "language": "python"}, f)
    km = KernelManager(kernel_name="bench", kernel_spec_manager=KernelSpecManager(kernel_dirs=[os.path.dirname(spec)]))
    km.start_kernel(cwd=harness.ROOT, env={**os.environ, "PYTHONPATH": harness.ROOT})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def run_cell(kc, pid: int, code: str, timeout: float, background: bool = False,
             ) -> tuple[list[tuple[float, str, int, dict]], list[tuple[float, float]], str]:
    """Execute ``code``; every iopub message of it as (time, type, bytes, content), the kernel's CPU seconds
    sampled every 0.25 s as (time, cpu), and the reply's status.  ``background``: the cell returns at once and its
    panel goes on from another thread; read until the panel's output shows the final table."""
    import psutil

    proc = psutil.Process(pid)
    msg_id = kc.execute(code)
    messages, cpu = [], []
    deadline = time.monotonic() + timeout
    next_sample = 0.0
    while time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_sample:
            cpu.append((now, sum(proc.cpu_times()[:2])))
            next_sample = now + 0.25
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except Exception:  # queue.Empty: nothing published
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle" and not background:
            break
        messages.append((time.monotonic(), kind, len(json.dumps(msg["content"])), msg["content"]))
        if background and kind == "update_display_data" and \
                msg["content"]["data"].get("text/plain", "").startswith(("sim: finished", "sim: failed")):
            break  # the --background panel's final table
    reply = kc.get_shell_msg(timeout=60)
    return messages, cpu, reply["content"]["status"]


def rate(samples: list[tuple[float, float]], t0: float, t1: float) -> float:
    inside = [(t, c) for t, c in samples if t0 <= t <= t1]
    (ta, ca), (tb, cb) = inside[0], inside[-1]
    return 100.0 * (cb - ca) / (tb - ta)


def screenshot(html: str, path: str) -> None:
    page = ('<html><body style="margin:8px;background:#fff">' + html + "</body></html>")
    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as f:
        f.write(page)
    try:
        subprocess.run(["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={os.path.abspath(path)}", "--window-size=1400,200", f"file://{f.name}"],
                       check=True, capture_output=True, timeout=120)
    finally:
        os.unlink(f.name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--nodes", type=int, default=512)
    p.add_argument("--steady", type=float, default=15.0, help="seconds of training measured")
    p.add_argument("--renderer", default="widget", help="TFOSMagics.renderer (none: what the panel costs)")
    p.add_argument("--no-log-lines", action="store_true", help="TFOSMagics.log_lines = False (what printing costs)")
    p.add_argument("--background", action="store_true", help="a --background cell (its panel fed by the handle)")
    p.add_argument("--screenshot", default="", help="draw one live panel update (PNG) here")
    p.add_argument("--out", default=os.path.join(harness.HERE, "results", "b6-cell.md"))
    opts = p.parse_args(argv)
    steps = int((opts.steady + 25) / 0.125)  # a step every 125 ms on average: the run outlasts the window
    with tempfile.TemporaryDirectory() as tmp:
        km, kc = kernel(tmp)
        try:
            reply = kc.execute_interactive(SETUP.format(bench=harness.HERE, steps=steps, nodes=opts.nodes,
                                                     renderer=opts.renderer, log_lines=not opts.no_log_lines), timeout=300)
            assert reply["content"]["status"] == "ok", reply["content"]
            t0 = time.monotonic()
            messages, cpu, status = run_cell(kc, km.provisioner.process.pid, CELL.format(nodes=opts.nodes,
                                                                                background="--background" if opts.background else ""),
                                             timeout=opts.steady + 240, background=opts.background)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    with open(os.path.join(tempfile.gettempdir(), "bench_sim_cell.messages.json"), "w") as f:
        json.dump(messages, f)  # for a look when the window is not found
    assert status == "ok", [m[3] for m in messages if m[1] == "error"]
    updates = [m for m in messages if m[1] == "comm_msg" and m[3]["data"].get("method") == "update"
               and "value" in m[3]["data"].get("state", {})]
    header = re.compile(r"<b>sim</b> &middot; <span[^>]*>running</span>")  # the cluster runs: every node does
    running = next((t for t, _, _, c in updates if header.search(c["data"]["state"]["value"])), None)
    if running is None:  # no panel (--renderer none): the nodes run 10 s after the cell started, at 512
        assert opts.renderer != "widget", "the panel never showed the nodes running"
        running = t0 + 7.0
    w0, w1 = running + 3.0, running + 3.0 + opts.steady
    inside = [m for m in messages if w0 <= m[0] <= w1]
    panel = [m for m in inside if m in updates]
    lines = [m for m in inside if m[1] == "stream"]
    row = {
        "nodes": opts.nodes,
        "panel": opts.renderer + (" --background" if opts.background else ""),
        "output lines": not opts.no_log_lines,
        "up s": running - t0,
        "kernel cpu %": rate(cpu, w0, w1),
        "panel updates/s": len(panel) / opts.steady,
        "panel kB/s": sum(m[2] for m in panel) / opts.steady / 1000,
        "largest update kB": max((m[2] for m in panel), default=0) / 1000,
        "output messages/s": len(lines) / opts.steady,
        "output lines/s": sum(m[3]["text"].count("\n") for m in lines) / opts.steady,
        "output kB/s": sum(m[2] for m in lines) / opts.steady / 1000,
        "all iopub kB/s": sum(m[2] for m in inside) / opts.steady / 1000,
    }
    print(json.dumps(row), flush=True)
    if opts.screenshot:
        screenshot(max(panel, key=lambda m: m[2])[3]["data"]["state"]["value"], opts.screenshot)
    keys = list(row)
    lines_out = ["B6 a %%tfos_cluster cell of simulated nodes in a real kernel, widget panel on — %s, %s cores, %s" % (
        harness.now_utc(), os.cpu_count(), platform.machine()), "",
        "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
        "| " + " | ".join(f"{row[k]:.2f}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |",
        "", "command: " + harness.command(argv)]
    harness.write_report("\n".join(lines_out) + "\n", opts.out)
    harness.write_runs(opts.out, "B6 cell", [(f"{row['nodes']} nodes", "run 1", row)],
                       {f"{row['nodes']} nodes": f"{row['nodes']} simulated nodes, a %%tfos_cluster cell"},
                       setting=f"{opts.steady:g} s steady, nodes 3 and 7 slow", command_line=harness.command(argv))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
