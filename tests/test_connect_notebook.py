"""The notebook on Spark Connect (as Databricks serverless / standard access give it), in real kernels.

Each kernel starts its own local Spark Connect server through tfos_nb's embedded Spark
(``TFOS_NB_SPARK_CONNECT=1``, what ``bash quickstart.sh --connect`` sets): the notebook's ``spark``
is a ``pyspark.sql.connect`` session with no SparkContext, and everything reaches the executors
through Spark jobs only.
"""

from __future__ import annotations

import re
import time

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.conftest import KERNEL, end_notebook_kernel, wait_until
from tests.test_notebooks import ROOT, TRAINING_CELL, _alive, _describe, _runtime_procs, _text, run_quickstart_runner

pytestmark = pytest.mark.slow


@pytest.fixture
def connect_env(monkeypatch):
    monkeypatch.setenv("TFOS_NB_SPARK_CONNECT", "1")  # the kernels started below inherit it
    # ... but not the markers of the Connect server this test process may hold for its Connect modules
    for name in ("SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_quickstart_then_errors_interrupt_and_runs_in_one_connect_kernel(connect_env, kernel_specs, tmp_path):
    """The quickstart notebook on Spark Connect, then, in the same kernel (one Connect server started, not two):
    a node error, %tfos_logs, ■ during training, %%tfos_parallel, a follow-up Spark job."""
    path = ROOT / "notebooks" / "quickstart.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("print('session:', type(spark).__module__)"))
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    client = NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(path.parent)}})
    try:
        try:
            client.execute()  # the kernel is ours (km given): it lives on after the notebook
        finally:
            nbformat.write(nb, tmp_path / path.name)
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, [(e.ename, e.evalue) for e in errors]
        # a cell's last line may end with no newline (the text panel's status line): one cell's text per line
        text = "\n".join(_text(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
        assert "session: pyspark.sql.connect.session" in text
        assert "starting a local Spark Connect server and session" in text
        assert re.search(r"^accuracy: 0\.9\d\d", text, flags=re.M), text[-2000:]
        assert "[chief:0] Epoch 5/5" in text  # the nodes' output reaches the cell
        finals = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "display_data"
                  and o.get("data", {}).get("text/plain", "").startswith("digits: finished")]
        assert len(finals) == 1 and "chief:0 finished" in finals[0]["data"]["text/plain"]
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=120)
            reply = kc.execute_interactive("steps = {'steps': 100000}", timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
            _errors_interrupt_and_runs(km, kc)
        finally:
            kc.stop_channels()
    finally:
        end_notebook_kernel(client, km)


FAILING_CELL = """%%tfos_cluster --workers 2 --input-mode tensorflow --name failing
print("about to fail on", ctx.job_name, ctx.task_index, flush=True)
if ctx.job_name == "worker":
    raise ValueError("bad shape on purpose")
"""


def _errors_interrupt_and_runs(km: KernelManager, kc) -> None:
    """A node error, %tfos_logs, ■ during training, %%tfos_parallel and a Spark job in a Connect kernel."""
    kernel_pid = km.provisioner.pid
    # a node's error ends the cell with one message naming the node, its error and its last lines
    out: list[str] = []
    reply = kc.execute_interactive(FAILING_CELL, timeout=300, output_hook=lambda m: out.append(
        str(m["content"].get("text", m["content"].get("evalue", "")))))
    assert reply["content"]["status"] == "error"
    message = reply["content"]["evalue"]
    assert "worker:0" in message and "ValueError: bad shape on purpose" in message, message
    assert "about to fail on worker 0" in message, message  # the node's output tail
    wait_until(lambda: not [p for p in _runtime_procs(kernel_pid) if _alive(p)], 60)
    assert wait_until(lambda: kc.execute_interactive("pass", timeout=60)["content"]["status"] == "ok", 60,
                      interval=0.5)
    out.clear()  # %tfos_logs reads the notebook's mirror of the coordinator's state
    reply = kc.execute_interactive("%tfos_logs failing --node worker:0", timeout=60,
                                   output_hook=lambda m: out.append(str(m["content"].get("text", ""))))
    assert reply["content"]["status"] == "ok" and "about to fail on worker 0" in "".join(out), out

    # ■ during training tears the cluster down (nodes, supervisors, the coordinator) and the kernel lives
    msg_id = kc.execute(TRAINING_CELL.replace("--name looping", "--name looping --args steps"))
    seen: list[str] = []
    deadline = time.monotonic() + 300
    while not any("[chief:0] step 1" in s for s in seen):
        assert time.monotonic() < deadline, "no step reported: " + "".join(seen)[-2000:]
        msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen.append(msg["content"]["text"])
    procs = _runtime_procs(kernel_pid)
    assert any("coordinator" in _describe(p) for p in procs), [_describe(p) for p in procs]
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    wait_until(lambda: not [p for p in procs if _alive(p)], 90)
    assert not [p for p in procs if _alive(p)], [_describe(p) for p in procs if _alive(p)]
    assert not [p for p in _runtime_procs(kernel_pid) if _alive(p)]
    assert wait_until(lambda: kc.execute_interactive("pass", timeout=60)["content"]["status"] == "ok", 60,
                      interval=0.5), "the kernel does not take requests after the interrupt"
    # %%tfos_parallel on the same Connect session: two runs, results in grid order, the best one named
    out.clear()
    reply = kc.execute_interactive(
        "grid = [{'lr': 0.5}, {'lr': 2.0}]", timeout=60)
    reply = kc.execute_interactive(
        "%%tfos_parallel --grid grid --metric score --name sweep\nreturn {'score': args.lr * 10}", timeout=300,
        output_hook=lambda m: out.append(str(m["content"].get("text", m["content"].get("evalue", "")))))
    assert reply["content"]["status"] == "ok", (reply["content"], "".join(out)[-2000:])
    out.clear()
    reply = kc.execute_interactive("print('values:', sweep.values, 'best:', sweep.best.index)", timeout=60,
                                   output_hook=lambda m: out.append(m["content"].get("text", "")))
    assert reply["content"]["status"] == "ok" and "values: [{'score': 5.0}, {'score': 20.0}]" in "".join(out), out
    assert "best: 1" in "".join(out), out
    # no Spark job of the cluster is left running on the server
    out.clear()
    reply = kc.execute_interactive("print('active:', spark.range(4, numPartitions=2).count())", timeout=120,
                                   output_hook=lambda m: out.append(m["content"].get("text", "")))
    assert reply["content"]["status"] == "ok" and "active: 4" in "".join(out)


def test_quickstart_sh_connect_prints_its_accuracy_and_no_error(connect_env, tmp_path):
    """``bash quickstart.sh --connect`` as a newcomer runs it (``scripts/run_notebook.py``: its own kernel, shut down as
    a front-end does): the accuracy line and nothing at ERROR level, no Java stack.  The Connect server's JVM was in
    the kernel's process group, which ipykernel signals (SIGTERM) when asked to shut down, before its atexit
    handlers: the executors died under the running application ("Lost executor 0 … exited with code 143") and the
    workers' relaunches failed, 13 to 20 ERROR lines and their stacks after a run that had succeeded."""
    run_quickstart_runner(nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4), tmp_path)
