"""What a cell shows: quiet node output, smoothed steps/s, metric history and return value, and the final table
on a front-end that drops widget messages and display updates (a real kernel).  TensorBoard's frame is
``test_notebook_tensorboard.py``."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import import_or_skip, wait_until
from tfos_nb.magics._quiet import is_native_noise, quiet_lines
from tfos_nb.runtime.driver.control.state import CURVE_POINTS, ClusterState, window_rate
from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.executor.context import NodeContext, Reporter
from tfos_nb.runtime.executor.process.node import plain_value
from tfos_nb.runtime.protocol.bodies import BeatReport

DATA = Path(__file__).resolve().parent / "data"

# -- native log noise ------------------------------------------------------------------------------------
NOISE = [
    "I0000 00:00:1795340575.021916   12546 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
    "E0000 00:00:1795340587.521278   12553 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call "
    "to cuInit: UNKNOWN ERROR (303)",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "E1122 09:41:58.123456  777 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to register factory for "
    "plugin cuDNN when one has already been registered",
    "W1122 09:41:58.123456    5 gpu_device.cc:2344] Cannot dlopen some GPU libraries.",
    "2026-11-22 09:41:58.123456: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors from different computation orders.",
    "2026-11-22 09:41:58.654321: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    "appropriate compiler flags.",
    "[worker:1] I0000 00:00:1795340575.021916   12546 cudart_stub.cc:31] Could not find cuda drivers",
    "[run:3] 2026-11-22 09:41:58.123456: W external/local_xla/xla/tsl/lib/monitoring/collection_registry.cc:81] x",
    # the two unprefixed lines ending an absl "Failed to send heartbeat" record of a worker whose chief exited first
    # (captured from a B5 run: a successful MultiWorkerMirroredStrategy fit, 2026-11-24)
    "[worker:0] Additional GRPC error information from remote target /job:chief/replica:0/task:0 while calling "
    "/tensorflow.CoordinationService/Heartbeat:",
    '[worker:0] :UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all addresses; last error: '
    'UNKNOWN: ipv4:192.0.2.2:23852: Failed to connect to remote host: Connection refused", grpc_status:14}',
    # gloo, as JAX's processes join (keras.distribution.initialize() on tfos_nb's nodes, 2026-11-25)
    "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1",
]
KEPT = [
    "user print chief",
    "Epoch 1/5",
    "15/15 - 1s - 40ms/step - accuracy: 0.7521 - loss: 0.8410",
    "Traceback (most recent call last):",
    '  File "<cell>", line 3, in <module>',
    "ValueError: E0000 is not a step",
    "F0000 00:00:1795340575.021916   12546 cuda_executor.cc:9] Check failed: device ok",  # fatal: kept
    "I0000 is my step counter: 00:00:17 elapsed",
    "WARNING:tensorflow:5 out of the last 5 calls to <function> triggered tf.function retracing.",
    "[tfos] chief:0 failed; starting again (attempt 2 of 2)",
    "2026-11-22 09:41:58 loss 0.3",
    "Error received from peer: retrying in 5 s",
    "",
]


@pytest.mark.parametrize("line", NOISE)
def test_native_log_lines_are_noise(line):
    assert is_native_noise(line)
    if not line.startswith("["):
        assert is_native_noise(f"[chief:0] {line}")


@pytest.mark.parametrize("line", KEPT)
def test_user_output_and_errors_are_kept(line):
    assert not is_native_noise(line)
    assert not is_native_noise(f"[chief:0] {line}")


def test_real_node_output_keeps_only_the_users_lines():
    """Output of a real 2-node cluster on a CPU machine (TensorFlow 2.21), as the handle tags it."""
    lines = (DATA / "node_output_cpu_tf221.txt").read_text().splitlines()
    assert any("cuInit" in line for line in lines) and len(lines) == 12
    assert quiet_lines(lines) == ["[chief:0] user print chief", "[worker:0] user print worker"]


# -- steps/s, history, curve, value (the runtime state, fed reports with the nodes' own timestamps) --------
def test_window_rate():
    assert window_rate([]) is None and window_rate([(0.0, 5)]) is None
    assert window_rate([(0.0, 0), (1.0, 100), (2.0, 200)]) == 100.0
    assert window_rate([(0.0, 0), (10.0, 50), (20.0, 100)], window=5.0) == 5.0  # sparse: the last two
    assert window_rate([(0.0, 0), (4.0, 400), (7.0, 1000)], window=5.0) == 200.0  # only the last 5 s
    assert window_rate([(1.0, 10), (1.0, 20)]) is None  # no time passed


def test_lock_step_nodes_show_the_same_smoothed_rate_whatever_the_arrival_jitter():
    """Two nodes at 100 steps/s; their reports reach the driver in bursts of different sizes (heartbeats)."""
    st = ClusterState("c1", "t", [("chief", 0), ("worker", 0)])
    chief, worker = st.nodes
    reports = [BeatReport(step=s, time=1000.0 + s / 100, metrics={"loss": 1 / s}) for s in range(1, 601)]
    rates = {0: [], 1: []}
    for node, burst in ((chief, 7), (worker, 53)):
        for i in range(0, len(reports), burst):
            st.record_reports(node, reports[i:i + burst])
            rates[node.index].append(node.rate)
    assert all(r is None or abs(r - 100.0) < 1e-6 for r in rates[0] + rates[1]), rates
    assert chief.rate == pytest.approx(worker.rate) == pytest.approx(100.0)
    view = st.snapshot()
    assert view.nodes[0].steps_per_sec == pytest.approx(100.0)
    # the loss curve: the whole run, thinned to evenly spaced points, always ending at the latest value
    curve = view.nodes[0].curve
    assert CURVE_POINTS // 2 <= len(curve) <= CURVE_POINTS + 1 and view.nodes[0].curve_metric == "loss"
    assert curve[0] == 1.0 and curve[-1] == pytest.approx(1 / 600)
    history = st.history()
    assert len(history) == 1200 and history[0][:5] == ("chief", 0, 0, 1000.01, 1) and history[0][5] == {"loss": 1.0}


def test_reporter_batches_every_report_and_drops_non_finite_values():
    out = io.StringIO()
    reporter = Reporter(out, max_rate=1000.0)
    ctx = NodeContext({"job_name": "chief", "task_index": 0, "node": 0, "cluster_spec": {"chief": ["h:1"]}}, None,
                      reporter)
    reporter._last = time.monotonic() + 3600  # nothing written until the flush: every report in one batch
    for step in range(1, 6):
        ctx.report(step=step, total_steps=5, loss=float("nan") if step == 3 else 1.0 / step, epoch=0)
    reporter.flush()
    (line,) = out.getvalue().splitlines()
    event = json.loads(line)  # the supervisor reads it; its heartbeat must encode as strict JSON
    json.dumps(event, allow_nan=False)
    assert event["t"] == "report" and event["step"] == 5 and event["total_steps"] == 5
    assert [r["step"] for r in event["batch"]] == [1, 2, 3, 4, 5]
    assert event["batch"][2]["metrics"] == {"loss": None, "epoch": 0}
    assert all(isinstance(r["time"], float) for r in event["batch"])


def test_reporter_writes_a_held_back_report_when_its_interval_ends():
    """A burst of reports, then silence (an evaluator waiting for its next checkpoint, until shutdown stops it): the
    reports held back by the rate limit are written at the end of the interval, not with a next report that never comes."""
    out = io.StringIO()
    reporter = Reporter(out, max_rate=10.0)
    for step in (1, 2, 3):
        reporter.progress({"step": step, "time": time.time(), "metrics": {"val_loss": 1.0 / step}})
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 1  # the first at once, the next two held back
    # held back for at most the interval (0.1 s): the deadline leaves a loaded machine ample room
    wait_until(lambda: len(out.getvalue().splitlines()) == 2, 10, what="the held-back reports")
    held = json.loads(out.getvalue().splitlines()[1])
    assert held["step"] == 3 and [r["step"] for r in held["batch"]] == [2, 3]
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "tfos-report-flush"], 10,
               what="the timer's thread to end")


class _Ctx:
    job_name, task_index = "chief", 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ({"accuracy": 0.9, "steps": [1, 2], "name": "m"}, {"accuracy": 0.9, "steps": [1, 2], "name": "m"}),
        ((1, 2.5, True), [1, 2.5, True]),
    ],
)
def test_plain_values_go_back(value, expected, capsys):
    assert plain_value(value, _Ctx()) == expected
    assert capsys.readouterr().err == ""


def test_numpy_values_go_back_and_others_are_dropped_with_a_line(capsys):
    np = import_or_skip("numpy")
    assert plain_value({"acc": np.float32(0.5), "cm": np.eye(2, dtype=np.int64)}, _Ctx()) == {"acc": 0.5, "cm": [[1, 0], [0, 1]]}
    assert plain_value(object(), _Ctx()) is None
    err = capsys.readouterr().err
    assert "tfos_nb: the value chief:0 returned is not sent to the driver: it is a builtins.object" in err
    assert plain_value({1: "x"}, _Ctx()) is None
    assert plain_value("x" * (300 * 1024), _Ctx()) is None
    assert "bytes as JSON (at most 262144)" in capsys.readouterr().err


# -- a real kernel, read by a client that drops what hosted notebooks drop ------------------------------
QUIET_CELL = """%%tfos_cluster --workers 1 --name quiet
import tensorflow as tf
import os
tf.config.list_physical_devices()  # the native start-up lines (cuInit on a CPU machine, TensorFlow >= 2.18)
# the line TensorFlow 2.21 prints there, written as its C++ logging writes it: TensorFlow 2.16 prints none here
os.write(2, b"E0000 00:00:1732271234.567890    1234 cuda_executor.cc:1228] failed call to cuInit: UNKNOWN ERROR (303)\\n")
print("user line from", ctx.job_name, flush=True)
for step in range(1, 21):
    ctx.report(step=step, total_steps=20, loss=float("nan") if step == 10 else 1.0 / step)
return {"answer": 42, "steps": step}
"""

AFTER_CELL = """import json
from tfos_nb.magics._quiet import quiet_lines
h = quiet.history
print(json.dumps({"value": quiet.value, "result_value": quiet.result["value"], "columns": list(h.columns),
                  "steps": h.step.tolist(), "nan_at_10": bool(h.loss.isna().tolist()[9]),
                  "native_lines": len(quiet.output) - len(quiet_lines(quiet.output))}))
"""


def _run_dropping_widget_messages(kc, code: str, timeout: float) -> tuple[dict, list[dict]]:
    """Execute ``code`` like a front-end without widget support: comm_* and update_display_data are dropped."""
    msg_id = kc.execute(code)
    kept: list[dict] = []
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no idle after {timeout} s: {kept[-5:]}"
        msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind in ("display_data", "execute_result", "stream", "error"):
            kept.append(msg)
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=30)
    return reply, kept


@pytest.mark.slow
def test_frontend_without_widgets_sees_quiet_output_and_the_final_table(kernel_specs):
    import psutil
    from jupyter_client.manager import KernelManager

    from tests.conftest import KERNEL, wait_until

    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    km.start_kernel(cwd=str(DATA.parent.parent))
    kc = km.client()
    kc.start_channels()
    kernel_pid = km.provisioner.pid
    try:
        kc.wait_for_ready(timeout=120)
        reply, _ = _run_dropping_widget_messages(kc, "%load_ext tfos_nb", 120)
        assert reply["content"]["status"] == "ok"
        reply, kept = _run_dropping_widget_messages(kc, QUIET_CELL, 400)
        assert reply["content"]["status"] == "ok", reply["content"]
        displays = [m["content"]["data"] for m in kept if m["msg_type"] == "display_data"]
        streams = "".join(m["content"]["text"] for m in kept if m["msg_type"] == "stream")
        # the live panel's output, as a widget-less front-end renders it: words, not "ClusterPanel(children=…)"
        assert displays[0]["text/plain"].startswith("quiet: running (the live panel needs Jupyter widgets")
        # the final state: a new output at the end of the cell, plain HTML and text
        final = displays[-1]
        assert set(final) == {"text/html", "text/plain"}, final.keys()
        assert "<b>quiet</b>" in final["text/html"] and ">finished</span>" in final["text/html"]
        assert "chief:0" in final["text/html"] and "20/20" in final["text/html"]
        assert final["text/plain"].startswith("quiet: finished")
        assert "chief:0 finished step 20/20 (100%)" in final["text/plain"]
        assert kept[-1]["msg_type"] == "display_data" and kept[-1]["content"]["data"] == final
        # quiet: the user's line, none of TensorFlow's native start-up lines (they stay in the logs)
        assert "[chief:0] user line from chief" in streams
        assert not [line for line in streams.splitlines() if is_native_noise(line)], streams
        assert "cuInit" not in streams and "absl::InitializeLog" not in streams

        out: list[str] = []
        reply = kc.execute_interactive(AFTER_CELL, timeout=60,
                                       output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
        got = json.loads("".join(out))
        assert got["value"] == got["result_value"] == {"answer": 42, "steps": 20}
        assert got["columns"][:6] == ["node", "role", "index", "attempt", "step", "time"] and "loss" in got["columns"]
        assert got["steps"] == list(range(1, 21)) and got["nan_at_10"]  # every report; a NaN loss did no harm
        assert got["native_lines"] > 0  # the filtered lines were there, and the handle kept them

        def node_procs() -> list[psutil.Process]:
            found = []
            for p in psutil.process_iter(["cmdline"]):
                try:
                    if "tfos_nb.runtime" in (p.info.get("cmdline") or []) and \
                            p.environ().get("TFOS_DRIVER_PID") == str(kernel_pid):
                        found.append(p)
                except psutil.Error:
                    continue
            return found

        assert wait_until(lambda: not node_procs(), 20), [p.pid for p in node_procs()]
    finally:
        kc.stop_channels()
        km.shutdown_kernel()  # a shutdown request, as Jupyter sends: its Spark stops with it


def test_a_node_error_shows_its_traceback_without_native_noise():
    from tfos_nb.magics import ClusterFailed

    tail = ["I0000 00:00:1795340575.021916   12546 cudart_stub.cc:31] Could not find cuda drivers on your machine",
            "Traceback (most recent call last):", '  File "<cell>", line 2, in <module>', "ValueError: bad input"]
    exc = ClusterFailed("chief:0 failed on host h (exit code 1): ValueError: bad input\n" + "\n".join(tail))
    shown = exc._render_traceback_()
    assert shown[0].endswith("chief:0 failed on host h (exit code 1): ValueError: bad input")
    assert shown[1:] == tail[1:]
    assert "cudart_stub" in str(exc)  # the exception itself keeps every line


def test_heartbeats_feed_the_history_once_per_report():
    """Through the controller: a cluster node's heartbeat carries every report since the last; a parallel run's
    supervisor sends only its latest report, again with every heartbeat (recorded once)."""
    from tfos_nb.runtime.driver.control.controller import Controller
    from tfos_nb.runtime.protocol import messages

    st = ClusterState("c1", "t", [("chief", 0), ("run", 0)])
    ctl = Controller(st, JobOptions(num_gpus=0, heartbeat_timeout=60), input_mode_spark=False, tensorboard=False, log_dir=None)
    batch = [{"step": s, "time": 100.0 + s / 10, "metrics": {"loss": 1.0 / s}} for s in range(1, 11)]
    assert ctl.handle(messages.Heartbeat(node=0, state="running", report=dict(batch[-1], total_steps=10),
                                  reports=batch[:6])).ok
    assert ctl.handle(messages.Heartbeat(node=0, state="running", report=dict(batch[-1], total_steps=10),
                                  reports=batch[6:], returned={"value": {"acc": 1}})).ok
    for beat in range(1, 8):
        report = {"step": beat * 10, "time": 100.0 + beat, "metrics": {"loss": 1.0 / beat}}
        for _ in range(2):
            assert ctl.handle(messages.Heartbeat(node=1, state="running", report=report)).ok
    chief, run = st.snapshot().nodes
    assert [h[4] for h in st.history() if h[0] == "chief"] == list(range(1, 11))
    assert [h[4] for h in st.history() if h[0] == "run"] == [10, 20, 30, 40, 50, 60, 70]
    assert chief.steps_per_sec == pytest.approx(10.0) and run.steps_per_sec == pytest.approx(10.0)
    assert len(chief.curve) == 10 and len(run.curve) == 7 and chief.total_steps == 10
    assert st.values() == {"chief:0": {"acc": 1}}
