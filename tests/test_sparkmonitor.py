"""sparkmonitor beside tfos_nb in one real kernel: both load, a cluster runs, both show their output.

sparkmonitor (swan-cern) has a kernel extension (``%load_ext sparkmonitor.kernelextension``)
that puts a ``SparkConf`` named ``conf`` in the notebook, carrying its JVM listener jar; Spark
started with that conf sends job/stage/task events to the kernel, which forwards them to the
front-end over a comm with target ``SparkMonitor``.  Here the test client plays the front-end:
it opens that comm, as sparkmonitor's JupyterLab extension does, and reads what arrives.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import kernel_spec_manager

pytestmark = pytest.mark.slow

KERNEL = "tfos-nb-sparkmonitor-test"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

CELLS = [
    "%load_ext sparkmonitor.kernelextension",
    # sparkmonitor's documented way: build the session from the conf it put in the notebook
    """\
from pyspark.sql import SparkSession
conf.setMaster("local-cluster[2,1,1024]").setAppName("tfos-sparkmonitor").set("spark.ui.enabled", "false")
for key, value in {"TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1"}.items():
    conf.set(f"spark.executorEnv.{key}", value)
spark = SparkSession.builder.config(conf=conf).getOrCreate()
print("listeners:", spark.sparkContext.getConf().get("spark.extraListeners"))
""",
    "%load_ext tfos_nb",
    """\
%%tfos_cluster --workers 2 --name both
for i in range(1, 31):
    ctx.report(step=i, total_steps=30, loss=1.0 / i)
print("done", ctx.job_name, ctx.task_index)
""",
    "print(both.state)",
]


def _kernel(tmp_path: Path):
    from jupyter_client.manager import KernelManager

    # SIGUSR1 makes the kernel print every thread's stack to its stderr (the test's output), if a cell ever gets
    # no message for 300 s again (it happened one run in five, even for "%load_ext tfos_nb", while _run sent the
    # next request without reading the execute_reply: the main thread idle, the request unread)
    dump = "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True)"
    specs = kernel_spec_manager(tmp_path / "kernels", f"--IPKernelApp.exec_lines={[dump]!r}", name=KERNEL)
    import pyspark

    env = dict(os.environ)
    # sparkmonitor picks its listener jar from SPARK_HOME/jars/spark-core_<scala>-<spark>.jar:
    # a pip-installed pyspark's home is its package directory.
    env["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
    km.start_kernel(env=env)
    return km


def _run(kc, code: str, timeout: float = 300, km=None) -> list[dict]:
    """Execute ``code``; every iopub message of that execution (and the SparkMonitor comm's), in order.

    Silent for ``timeout`` s: the kernel (``km``) prints its threads' stacks, and the test fails."""
    msg_id = kc.execute(code)
    msgs = []
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            if km is not None and km.has_kernel:
                os.kill(km.provisioner.pid, signal.SIGUSR1)
            raise AssertionError(f"no reply from the kernel within {timeout}s to {code[:60]!r}; "
                                 f"after {len(msgs)} message(s): {[m['msg_type'] for m in msgs][-10:]}") from None
        msgs.append(msg)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    # and its execute_reply, as a front-end reads it, before the next request: ipykernel 7 sends shell replies
    # raw on the ROUTER socket, and a request arriving while one is sent can go unread (ipython/ipykernel#1554)
    deadline = time.monotonic() + timeout
    while kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.1))["parent_header"].get("msg_id") != msg_id:
        pass
    return msgs


def _events(msgs: list[dict], comm_id: str) -> list[dict]:
    """Spark's events as sparkmonitor forwarded them on its comm."""
    events = []
    for m in msgs:
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id:
            data = m["content"]["data"]
            if data.get("msgtype") == "fromscala":
                events.append(json.loads(data["msg"]))
    return events


def _cluster_seen(events: list[dict]) -> bool:
    kinds = {e.get("msgtype") for e in events}
    completed = any(e.get("msgtype") == "sparkJobEnd" and e.get("status") == "COMPLETED" for e in events)
    return {"sparkJobStart", "sparkJobEnd", "sparkTaskEnd"} <= kinds and completed


def _read_until(kc, msgs: list[dict], done, timeout: float) -> None:
    """Append the kernel's iopub messages to ``msgs`` until ``done(msgs)`` or ``timeout`` s pass.

    Spark's listener bus is asynchronous and sparkmonitor's listener queues task events and
    sends them from a timer thread: they reach the kernel (and its comm) on their own
    schedule, possibly after the cell that ran the job is idle.
    """
    deadline = time.monotonic() + timeout
    while not done(msgs):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            msgs.append(kc.get_iopub_msg(timeout=min(left, 1.0)))
        except queue.Empty:
            pass


def test_sparkmonitor_and_tfos_panel_in_one_kernel(tmp_path):
    km = _kernel(tmp_path)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        outputs: list[dict] = []
        outputs += _run(kc, CELLS[0], km=km)
        # the front-end side of sparkmonitor: open its comm
        comm_id = uuid.uuid4().hex
        kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": "SparkMonitor", "data": {}}))
        for code in CELLS[1:]:
            last = _run(kc, code, km=km)
            outputs += last
        late: list[dict] = []  # what sparkmonitor forwards after the cells are done
        _read_until(kc, late, lambda msgs: _cluster_seen(_events(outputs + msgs, comm_id)), timeout=120)
        _run(kc, "spark.stop()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)

    errors = [m["content"] for m in outputs if m["msg_type"] == "error"]
    assert not errors, errors
    streams = "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream")
    # the one traceback allowed: logging's report of sparkmonitor 3.3.0's own malformed log call
    # (kernelextension.configure: logger.info('...port:', str(port))), printed when it loads
    known = "Message: 'SparkConf Configured, Starting to listen on port:'"
    assert streams.count("Traceback") == streams.count("--- Logging error ---") == streams.count(known), streams[-3000:]
    assert "Exception in thread" not in streams, streams[-3000:]  # its socket thread lives (needs ipykernel >= 7.1)
    assert "listeners: sparkmonitor.listener.JupyterSparkMonitorListener" in streams
    assert "[chief:0] done chief 0" in streams and "[worker:0] done worker 0" in streams
    # print(both.state): the cell's own line (the kernel also forwards what the JVM writes to stderr, on its schedule)
    printed = "".join(m["content"]["text"] for m in last if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
    assert "finished" in [line.strip() for line in printed.splitlines()], printed

    # tfos_nb's output: the live panel (a widget) and its static snapshot of the final state
    displays = [m["content"] for m in outputs if m["msg_type"] in ("display_data", "update_display_data")]
    assert any(WIDGET_VIEW in d["data"] for d in displays)
    snapshot = [d["data"]["text/html"] for d in displays if "text/html" in d["data"] and "tfos-panel" in d["data"]["text/html"]]
    assert snapshot and ">finished</span>" in snapshot[-1] and "30/30" in snapshot[-1]
    assert "chief:0" in snapshot[-1] and "worker:0" in snapshot[-1]

    # sparkmonitor's output: Spark's events for the cluster's jobs, on its comm
    events = _events(outputs + late, comm_id)
    kinds = {e.get("msgtype") for e in events}
    assert {"sparkJobStart", "sparkJobEnd", "sparkTaskEnd"} <= kinds, kinds
    assert any(e.get("msgtype") == "sparkJobEnd" and e.get("status") == "COMPLETED" for e in events), events[-5:]
