#!/usr/bin/env python
"""Two users on one JupyterHub, one shared Spark standalone cluster: what sharing costs, and what the hub adds.

The setting of ``tests/test_jupyterhub.py`` (``tests/hub_fixture.py``: a real JupyterHub with its proxy, two Unix
users, a master and two workers of 2 cores, run as root), then per round:

- **alone**: tfosalice runs the quickstart's training cell while tfosbob's kernel sits idle;
- **together**: both run it at the same moment (each has their own Spark application, 2 executors of 1 core);

each timed as the client sees it (``wall``: the execute request to its reply) and on the chief (``fit``: around
``model.fit``, printed by the node).  Then the panel's path: the kernel sends 200 display updates, 20 ms apart,
each carrying its send time; the client reads them over the kernel's websocket **through the hub's proxy**
(``/user/NAME/api/kernels/…``) and **direct** to the user's server (its own port, the same token), and keeps each
update's latency (receive − send, one machine's clock).

    flock /tmp/tfos-heavy.lock .venv/bin/python benchmarks/bench_hub.py [--rounds 3]    # as root
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, ROOT)
import harness  # noqa: E402 - the benchmarks' own helpers, beside this script

from tests.hub_fixture import SPARK_USER, USERS, Hub, Kernel  # noqa: E402
from tests.hub_notebook import SESSION  # noqa: E402

UPDATES = """\
import time
from IPython.display import display
handle = display("0", display_id=True)
for i in range(200):
    handle.update(repr(time.time()))
    time.sleep(0.02)
"""


def cells(export_root: str) -> tuple[list[str], str]:
    """The quickstart's cells before its training cell, and the training cell timing ``model.fit``; the model is
    exported to ``export_root`` (a folder the nodes' account writes: the quickstart's own, a temporary folder of
    the user's, is closed to the executors' service account, as the hub guide says)."""
    nb = json.load(open(os.path.join(ROOT, "notebooks", "quickstart.ipynb")))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    train = next(i for i, c in enumerate(code) if c.startswith("%%tfos_cluster"))
    export = 'tempfile.mkdtemp(prefix="tfos-digits-")'
    assert export in code[train - 1], code[train - 1]
    code[train - 1] = code[train - 1].replace(export, repr(export_root))
    cell = code[train].replace("model.fit(", "import time as _t\n_t0 = _t.time()\nmodel.fit(").replace(
        "callbacks=[ctx.progress_callback()])", "callbacks=[ctx.progress_callback()])\nprint('FIT', _t.time() - _t0)")
    assert "FIT" in cell, code[train]
    return [SESSION, *code[:train]], cell


def timed(kernel: Kernel, cell: str, out: dict[str, float]) -> None:
    t0 = time.monotonic()
    result = kernel.execute(cell)
    out["wall s"] = time.monotonic() - t0
    fit = [line for line in result["stdout"].splitlines() if line.startswith("[chief:0] FIT ")]
    out["fit s"] = float(fit[0].split()[-1])


def latencies(hub: Hub, user: str, token: str, kernel_id: str, url: str) -> list[float]:
    """Run :data:`UPDATES` in the kernel over a websocket at ``url``; each update's latency (ms)."""
    import websocket

    ws = websocket.create_connection(f"{url}api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}",
                                     header=[f"Authorization: token {token}"], timeout=120)
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex,
                                   "msg_type": "execute_request", "version": "5.3"},
                        "parent_header": {}, "metadata": {}, "buffers": [], "channel": "shell",
                        "content": {"code": UPDATES, "silent": False, "store_history": False,
                                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
    seen: list[float] = []
    while True:
        raw = ws.recv()
        now = time.time()
        if isinstance(raw, bytes):
            continue
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "update_display_data":
            seen.append((now - float(msg["content"]["data"]["text/plain"].strip("'"))) * 1000)
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    ws.close()
    return seen


def server_url(hub: Hub, user: str) -> str:
    """The user's server on its own port, not through the proxy."""
    import psutil

    ports = [c.laddr.port for c in psutil.Process(hub.server_pid(user)).net_connections("tcp")
             if c.status == psutil.CONN_LISTEN]
    return f"ws://127.0.0.1:{ports[0]}/user/{user}/"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "b7-hub.md"))
    opts = ap.parse_args()
    hub = Hub().start()
    runs: list[tuple[str, str, dict[str, float]]] = []
    try:
        kernels = {}
        for user in USERS:
            token = hub.start_server(user)
            kernels[user] = Kernel(hub, user, token, path="bench.ipynb")
        for user, k in kernels.items():
            exports = hub.root / "exports" / user
            exports.mkdir(parents=True)
            os.chown(exports, hub.uid(SPARK_USER), -1)  # the nodes (Spark's account) write there
            setup, train = cells(str(exports))
            for cell in setup:
                k.execute(cell)
        alice, bob = USERS
        for n in range(opts.rounds + 1):  # the first round is a warm-up of both
            label = "warm-up" if n == 0 else f"run {n}"
            alone: dict[str, float] = {}
            timed(kernels[alice], train, alone)
            runs.append(("alone", label, alone))
            both = {u: {} for u in USERS}
            threads = [threading.Thread(target=timed, args=(kernels[u], train, both[u])) for u in USERS]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            runs += [(f"together-{u.removeprefix('tfos')}", label, both[u]) for u in USERS]
            for way, url in (("proxy", f"ws://127.0.0.1:{hub.port}/user/{alice}/"), ("direct", server_url(hub, alice))):
                ms = latencies(hub, alice, kernels[alice].token, kernels[alice].kernel_id, url)
                runs.append((way, label, {"median ms": statistics.median(ms), "p95 ms": sorted(ms)[int(len(ms) * .95)],
                                          "updates": len(ms)}))
            print(label, [(v, m) for v, lab, m in runs if lab == label], flush=True)
        for k in kernels.values():
            k.close()
    finally:
        hub.stop()
    report(opts.out, runs)


def report(path: str, runs: list[tuple[str, str, dict[str, float]]]) -> None:
    labels = {"alone": "tfosalice alone (tfosbob's kernel idle)", "together-alice": "tfosalice, both at once",
              "together-bob": "tfosbob, both at once", "proxy": "a display update through the hub's proxy",
              "direct": "a display update straight from the user's server"}
    harness.write_runs(path, "B7 two users on one hub", runs, labels,
                       setting="JupyterHub 6.1.1 + configurable-http-proxy 5.3.0, Spark standalone: 2 workers x 2 "
                               "cores, each user's application 2 executors x 1 core; quickstart training cell",
                       command_line="flock /tmp/tfos-heavy.lock .venv/bin/python benchmarks/bench_hub.py --rounds 3")
    counted = [r for r in runs if r[1] != "warm-up"]
    lines = ["# B7: two users on one JupyterHub, one shared Spark cluster", "",
             f"{harness.now_utc()}, {os.cpu_count()} CPUs. Every run below (warm-up first, not counted).", "",
             "| variant | metric | every run (in order) | median (min–max) |", "|---|---|---|---|"]
    for variant, label in labels.items():
        for metric in ("wall s", "fit s", "median ms", "p95 ms"):
            values = [m[metric] for v, _, m in counted if v == variant and metric in m]
            if values:
                every = " · ".join(f"{m[metric]:.2f}" for v, _, m in runs if v == variant and metric in m)
                lines.append(f"| {label} | {metric} | {every} | {statistics.median(values):.2f} "
                             f"({min(values):.2f}–{max(values):.2f}) |")
    med = {(v, k): statistics.median([m[k] for vv, _, m in counted if vv == v]) for v in labels
           for k in ("wall s", "fit s", "median ms", "p95 ms") if any(k in m for vv, _, m in counted if vv == v)}
    lines += ["", "Ratios (median / median):", ""]
    for k in ("wall s", "fit s"):
        for u in ("alice", "bob"):
            lines.append(f"- {k}, {u} both at once / alice alone: {med[(f'together-{u}', k)] / med[('alone', k)]:.2f}×")
    for k in ("median ms", "p95 ms"):
        lines.append(f"- display update latency {k}, through the proxy / direct: "
                     f"{med[('proxy', k)] / med[('direct', k)]:.2f}× ({med[('proxy', k)] - med[('direct', k)]:+.2f} ms)")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
