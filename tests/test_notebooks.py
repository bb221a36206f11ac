"""Every notebook in notebooks/ run headless in a real kernel; and ■ (interrupt) during training."""

from __future__ import annotations

import queue
import re
import socket
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.conftest import KERNEL, end_notebook_kernel, run_notebook, wait_until
from tfos_nb.magics._cell_panel import INTERRUPT_GRACE_S

ROOT = Path(__file__).resolve().parent.parent
# parallel_runs.ipynb runs (with more checks) in tests/test_parallel.py; every other notebook runs here
OWN_TEST = {"parallel_runs.ipynb"}
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb") if p.name not in OWN_TEST)


def _text(outputs) -> str:
    parts = []
    for o in outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            parts.append(str(o.get("data", {}).get("text/plain", "")))
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_headless(path, kernel_specs, tmp_path):
    nb = nbformat.read(path, as_version=4)
    if path.name == "quickstart.ipynb":
        nb = _run_as_quickstart_sh_does(nb, tmp_path)
    else:
        run_notebook(nb, kernel_specs, path.parent, tmp_path / path.name)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, [(e.ename, e.evalue) for e in errors]
    # a cell's last line may end with no newline (the text panel's status line): one cell's text per line
    text = "\n".join(_text(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    for match in re.finditer(r"^accuracy: (\d\.\d+)", text, flags=re.M):  # the notebooks' result lines
        assert float(match.group(1)) >= 0.9, match.group(0)
    if path.name == "keras3.ipynb":  # the model was Keras 3's, and it scored the test rows from its .keras file
        assert re.search(r"^\[chief:0\] saved .*digits\.keras with Keras 3\.", text, flags=re.M), text[-2000:]
        assert re.search(r"^accuracy: 0\.9\d\d on \d+ test digits", text, flags=re.M), text[-2000:]
        assert "cuInit" not in text and "absl::InitializeLog" not in text  # Keras 3 is loaded in a worker, not here
    if path.name == "pipeline.ipynb":
        # the extension shows a panel for the cluster TFEstimator.fit starts; its final snapshot is saved
        html = [o["data"]["text/html"] for c in nb.cells for o in c.get("outputs", [])
                if o.output_type == "display_data" and "text/html" in o.get("data", {})]
        assert any(".fit</b>" in h and "chief:0" in h and "worker:0" in h and "finished" in h for h in html), html
    if path.name == "quickstart.ipynb":
        assert re.search(r"^accuracy: 0\.9\d\d", text, flags=re.M), text[-2000:]
        assert "[chief:0] Epoch 5/5" in text
        _assert_history_is_the_models(nb.cells[-1])
        # the pictures: the loss curve (from digits.history) and the confusion matrix, as PNGs in the outputs
        figures = {}
        for c in nb.cells:
            for o in c.get("outputs", []):
                if o.output_type == "display_data" and "image/png" in o.get("data", {}):
                    figures[c.source.splitlines()[0]] = o["data"]["image/png"]
        assert set(figures) == {"import matplotlib.pyplot as plt",
                                'counts = predictions.groupBy("label", "prediction").count().toPandas()'}, list(figures)
        assert all(len(png) > 5000 for png in figures.values())  # base64 PNGs of real plots, not empty canvases
        # the nodes' native TensorFlow start-up lines stay out of the cell; the panel's final table is there once
        assert "cuInit" not in text and "absl::InitializeLog" not in text
        finals = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "display_data"
                  and o.get("data", {}).get("text/plain", "").startswith("digits: finished")]
        assert len(finals) == 1 and "chief:0 finished" in finals[0]["data"]["text/plain"]


def _run_as_quickstart_sh_does(nb, tmp_path: Path):
    """Run the quickstart as ``bash quickstart.sh`` does (``scripts/run_notebook.py``, its own kernel, shut down
    as a front-end does) and check what it prints: the accuracy line, and nothing at ERROR level — no Java
    stack either (the embedded Spark's workers used to relaunch executors while the kernel's shutdown killed
    the JVM: ~40 ERROR lines after a run that had succeeded).  Returns the executed notebook."""
    nb.cells.append(nbformat.v4.new_code_cell(HISTORY_DUMP))  # one more cell: the plotted history, as JSON
    run_quickstart_runner(nb, tmp_path)
    return nbformat.read(tmp_path / "build" / "quickstart.ipynb", as_version=4)


def run_quickstart_runner(nb, tmp_path: Path) -> None:
    """Run ``nb`` with ``scripts/run_notebook.py`` (what ``bash quickstart.sh`` runs, with this process's environment)
    from ``tmp_path/notebooks``; assert it printed the accuracy line and nothing at ERROR level, no Java stack."""
    import subprocess
    import sys

    (tmp_path / "notebooks").mkdir()
    nbformat.write(nb, tmp_path / "notebooks" / "quickstart.ipynb")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(tmp_path / "notebooks" / "quickstart.ipynb")],
                         capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert re.search(r"^accuracy: 0\.9\d\d on \d+ test digits$", run.stdout, flags=re.M), out[-2000:]
    noise = [line for line in out.splitlines() if re.search(r"\bERROR\b|^\s+at [\w$.]+\(|Exception\b", line)]
    assert not noise, "\n".join(noise[:20])


HISTORY_DUMP = 'print("HISTORY", digits.history.to_json(orient="records"))'


def _assert_history_is_the_models(cell) -> None:
    """``digits.history`` (what the loss picture and the panel draw) holds the model's values, not replica sums.

    The Keras callback reports every step and, at each epoch's end, the epoch's logs (``model.fit``'s history)
    at the same step: the two rows of that step must agree.  Under MultiWorkerMirroredStrategy on 2 nodes the
    per-step rows used to read twice the loss and accuracy (a first loss of ~4.7 for 10 classes).
    """
    import json

    line = next(t for t in _text(cell.outputs).splitlines() if t.startswith("HISTORY "))
    rows = [r for r in json.loads(line[len("HISTORY "):]) if r.get("loss") is not None]
    assert rows and all(0.0 <= r["accuracy"] <= 1.0 for r in rows), [r for r in rows if r["accuracy"] > 1][:3]
    ends = 0
    for node in {r["node"] for r in rows}:
        by_step: dict[int, list[dict]] = {}
        for r in rows:
            if r["node"] == node:
                by_step.setdefault(r["step"], []).append(r)
        first = by_step[min(by_step)][0]
        # a 10-class cross-entropy starts near ln(10) = 2.3 (3.06 seen from an unlucky initialisation); the sum
        # over 2 replicas this guards against starts near 4.6, and no lower than 2 x 2.0
        assert first["loss"] < 3.8, first
        for step, pair in by_step.items():
            if len(pair) == 2:  # the step's own report, then the epoch's
                ends += 1
                for name in ("loss", "accuracy"):
                    assert pair[0][name] == pytest.approx(pair[1][name], rel=1e-4), (node, step, name, pair)
    assert ends == 2 * 5, ends  # 2 nodes x 5 epochs


def _runtime_procs(root_pid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(root_pid).children(recursive=True):
        try:
            if "tfos_nb.runtime" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    """Running, not a zombie: an exited process its (Spark worker) parent has not reaped yet is gone."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error as exc:
        return repr(exc)


TRAINING_CELL = """%%tfos_cluster --workers 2 --name looping
import time
for step in range(1, args.steps + 1):
    ctx.report(step=step, loss=1.0 / step)
    if ctx.is_chief:
        print("step", step, flush=True)
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_interrupt_stops_the_cluster_and_the_kernel_lives(kernel_specs):
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    km.start_kernel(cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive("%load_ext tfos_nb\nsteps = {'steps': 100000}", timeout=120)
        assert reply["content"]["status"] == "ok"

        msg_id = kc.execute(TRAINING_CELL.replace("--name looping", "--name looping --args steps"))
        seen = []
        deadline = time.monotonic() + 240
        while not any("[chief:0] step 1" in s for s in seen):
            assert time.monotonic() < deadline, "no step reported: " + "".join(seen)[-2000:]
            msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                seen.append(msg["content"]["text"])
        kernel_pid = km.provisioner.pid
        procs = _runtime_procs(kernel_pid)
        assert len(procs) >= 2, "expected a supervisor and a node process per node"

        # the interrupt ends the cell and tears the cluster down (not a hang, nothing left): the cell waits at
        # most INTERRUPT_GRACE_S for the teardown, then raises; the bound has room for a loaded machine (issue 18)
        limit = 4 * INTERRUPT_GRACE_S
        bound = time.monotonic() + limit
        km.interrupt_kernel()
        reply: dict = {}
        while reply.get("parent_header", {}).get("msg_id") != msg_id:
            try:
                reply = kc.get_shell_msg(timeout=max(0.1, bound - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the interrupted cell did not reply within {limit:g} s "
                                     f"(its teardown waits {INTERRUPT_GRACE_S:g} s at most)") from None
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        wait_until(lambda: not [p for p in procs if _alive(p)], 60)
        assert not [p for p in procs if _alive(p)], [_describe(p) for p in procs if _alive(p)]
        assert not [p for p in _runtime_procs(kernel_pid) if _alive(p)]

        # the kernel lives, and the same cell runs again. After an error reply ipykernel aborts the requests
        # that reach it before its own "stop aborting" marker (a race a fast client wins on a loaded machine:
        # status "aborted", issue 18): wait, with a deadline, until it takes requests again
        assert wait_until(lambda: kc.execute_interactive("pass", timeout=60)["content"]["status"] == "ok", 60,
                          interval=0.5), "the kernel does not take requests after the interrupt"
        out = []
        reply = kc.execute_interactive("print(6 * 7)", timeout=60,
                                       output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok" and "42" in "".join(out)
        out.clear()
        reply = kc.execute_interactive(
            TRAINING_CELL.replace("--name looping", "--name looping --args \"{'steps': 3}\""), timeout=240,
            output_hook=lambda m: out.append(str(m["content"].get("text", m["content"].get("data", "")))),
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "[chief:0] step 3" in "".join(out)
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def _greetings_on(ports: list[int], seconds: float) -> dict[int, bytes]:
    """Listen on ``ports`` for ``seconds``: the first bytes of each connection that arrives, by port."""
    servers, got = [], {}
    for port in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(5)
        s.settimeout(0.05)
        servers.append((port, s))
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and len(got) < len(servers):
            for port, s in servers:
                try:
                    conn, _ = s.accept()
                except OSError:
                    continue
                with conn:
                    conn.settimeout(1)
                    got[port] = conn.recv(10)
    finally:
        for _, s in servers:
            s.close()
    return got


@pytest.mark.slow
def test_a_notebook_run_leaves_no_kernel_channels_reconnecting(kernel_specs):
    """After ``end_notebook_kernel`` nothing connects to the dead kernel's ports.

    (nbclient, given our kernel manager, leaves its channels open: their ZeroMQ sockets reconnect to those ports
    every 0.1 s, and a Spark barrier task's server that later gets one reads the greeting (FF 00 00 00 ...) and
    takes its executor down.  Whether nbclient still does is not this project's to assert.)"""
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    client = NotebookClient(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), km=km, timeout=120)
    client.execute()
    ports = [km.shell_port, km.iopub_port, km.stdin_port, km.control_port]
    end_notebook_kernel(client, km)
    assert _greetings_on(ports, 2.0) == {}  # ZeroMQ retries every 0.1 s: 20 chances to show up
