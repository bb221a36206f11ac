"""TFParallel and %%tfos_parallel: independent runs on a real Spark local-cluster with real TensorFlow.

Fast tier: ranking, argument checks, the panel's run rows, the magic's UsageErrors.
Slow tier: a learning-rate grid on digits, ctx and process isolation, a failing run,
KeyboardInterrupt, the magic through a real IPython shell, the notebook in a real kernel.
"""

from __future__ import annotations

import _thread
import math
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import nbformat
import pytest
from IPython.core.error import UsageError

from tests.conftest import NODE_ENV, ipython_with_tfos_nb, run_notebook, runtime_processes, spark_fixture, wait_until
from tfos_nb import TFParallel
from tfos_nb.magics import ParallelFailed, ParallelHandle
from tfos_nb.runtime.driver.control.state import NodeView
from tfos_nb.runtime.driver.parallel.runs import ParallelView, best_index, default_metric, default_mode
from tfos_nb.widgets import panel_html, panel_model, text_line

# Run functions defined here travel by value (executors cannot import this test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "parallel_runs.ipynb"
EXECUTORS = 2
LEARNING_RATES = [0.0003, 0.003, 0.03, 3.0]
NOTEBOOK_LRS = [0.0003, 0.003, 0.03, 0.3]  # the grid of notebooks/parallel_runs.ipynb


spark = spark_fixture(EXECUTORS)



@pytest.fixture(scope="module")
def ip():
    shell = ipython_with_tfos_nb()
    shell.run_cell("numbers = [1, 2, 3]\nK = 3\ngrid3 = [{'x': 0}, {'x': 2}, {'x': 1}]")
    yield shell
    shell.magics_manager.registry["TFOSMagics"].shutdown_all()


# -- fast: ranking, arguments, panel -------------------------------------------------------------


def test_best_index_by_metric_and_mode():
    metrics = [{"accuracy": 0.9, "loss": 0.3}, None, {"accuracy": 0.95, "loss": 0.5}, {"accuracy": float("nan")}]
    assert best_index(metrics, "accuracy") == 2  # max by default for accuracy; None (unfinished) and NaN skipped
    assert best_index(metrics, "loss") == 0  # min by default for a loss
    assert best_index(metrics, "accuracy", "min") == 0
    assert best_index(metrics, "missing") is None and best_index(metrics, None) is None
    assert best_index([{"a": 1}, {"a": 1}], "a") == 0  # ties: the first run
    assert default_metric([{"loss": 1.0, "accuracy": 0.5}]) == "accuracy"
    assert default_metric([{"loss": 1.0}, {"val_accuracy": 0.5}]) == "val_accuracy"
    assert default_metric([{"step_time": 1.0}]) is None
    assert [default_mode(m) for m in ("val_loss", "mae", "accuracy", "auc", None)] == ["min", "min", "max", "max", "max"]
    with pytest.raises(ValueError, match="mode must be 'max' or 'min', got 'up'"):
        best_index(metrics, "accuracy", "up")


class _FakeSc:
    _jsc = object()


@pytest.mark.parametrize(
    ("tf_args", "n", "message"),
    [
        ([{"a": 1}, {"a": 2}], 3,
         "tf_args is a list of 2 dicts (one per run) but num_executors=3: give one dict per run, or num_executors=None"),
        ({"a": 1}, None, "num_executors (the number of runs) is needed unless tf_args is a list of dicts, one per run"),
        ({"a": 1}, 0, "num_executors must be a positive integer (the number of runs), got 0"),
        ({"a": 1}, True, "num_executors must be a positive integer (the number of runs), got True"),
    ],
)
def test_bad_api_arguments_are_value_errors(tf_args, n, message):
    with pytest.raises(ValueError) as info:
        TFParallel.start(_FakeSc(), lambda a, c: None, tf_args, n)
    assert str(info.value) == message


def test_spark_connect_is_refused():
    with pytest.raises(TypeError, match="classic SparkContext"):
        TFParallel.run(object(), lambda a, c: None, {}, 2)


def test_importing_tfparallel_stays_light():
    code = (
        "import sys, tfos_nb\nfrom tfos_nb import TFParallel\nimport tfos_nb.runtime.executor.process.run_task\n"
        "bad = [m for m in ('tensorflow', 'pyspark', 'IPython', 'ipywidgets') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT)


def _run_view(state="running", best=None):
    nodes = (
        NodeView(index=0, job_name="run", task_index=0, state="finished", host="h1", executor_id="0",
                 metrics={"accuracy": 0.91, "loss": 0.3}),
        NodeView(index=1, job_name="run", task_index=1, state="finished", host="h2", executor_id="1",
                 metrics={"accuracy": 0.97, "loss": 0.1}),
        NodeView(index=2, job_name="run", task_index=2, state="failed", host="h1", executor_id="0",
                 error="ValueError: diverged", tail=("Traceback", "ValueError: diverged")),
    )
    return ParallelView(cluster_id="c0ffee00c0ffee00", name="sweep", state=state, started_at=0.0, elapsed=3.0,
                        nodes=nodes, params=({"lr": 0.001}, {"lr": 0.01}, {"lr": 3.0, "batch": 64}), best=best,
                        metric="accuracy", mode="max")


def test_panel_has_a_row_per_run_with_its_parameters_and_the_best_starred():
    model = panel_model(_run_view(best=1))
    assert model["param_keys"] == ["lr", "batch"]
    assert [r["params"] for r in model["rows"]] == [{"lr": "0.001"}, {"lr": "0.01"}, {"lr": "3", "batch": "64"}]
    assert [r["best"] for r in model["rows"]] == [False, True, False]
    assert [r["result"] for r in model["rows"]] == ["0.91", "0.97", ""]
    assert model["best"] == "run:1 accuracy 0.97"
    html = panel_html(model)
    header = re.search(r"<thead><tr>(.*?)</tr></thead>", html).group(1)
    assert re.findall(r">([^<]+)</th>", header)[:5] == ["node", "lr", "batch", "accuracy", "state"]
    best_row = re.search(r'<tr style="background:#e6f4ea;font-weight:bold">(.*?)</tr>', html).group(1)
    assert "&#9733; run:1" in best_row and "0.01" in best_row and "0.97" in best_row
    assert html.count("&#9733;") == 1 and "best: run:1 accuracy 0.97" in html
    assert "ValueError: diverged" in html  # the failed run's error under its row
    line = text_line(model)
    assert "run:0 lr=0.001 finished" in line and "run:2 lr=3 batch=64 failed: ValueError: diverged" in line
    assert line.endswith("best run:1 accuracy 0.97")
    assert panel_model(_run_view(best=None))["best"] is None


# -- fast: the magic's bad input ----------------------------------------------------------------
BAD_INPUT = [
    ("", "pass", "give --runs N, or --grid VAR (a list of dicts, one per run)"),
    ("--runs 0", "pass", "--runs must be at least 1, got 0"),
    ("--runs two", "pass", "argument --runs: invalid int value: 'two'"),
    ("--grid nope", "pass", "--grid nope: no such variable in the notebook"),
    ("--grid K", "pass", "--grid K: expected a list of dicts (one per run), got int"),
    ("--grid numbers", "pass", "--grid numbers: entry 0 is a int, not a dict"),
    ("--grid empty", "pass", "--grid empty: the list is empty"),
    ("--grid adict", "pass",
     "--grid adict: expected a list of dicts (one per run), got a dict; for every combination of a dict of lists: "
     "[dict(zip(d, v)) for v in itertools.product(*d.values())]"),
    ("--grid badkeys", "pass", "--grid badkeys: entry 1: keys must be names usable as attributes (args.NAME), got 'learning rate'"),
    ("--grid grid3 --runs 2", "pass", "--runs 2 but --grid grid3 has 3 entries; give one, or make them agree"),
    ("--grid grid3 --mode best", "pass", "argument --mode: invalid choice: 'best' (choose from 'max', 'min')"),
    ("--runs 2 --args numbers", "pass", "--args must be a dict or a namespace, got list"),
    ("--runs 2 --args nope", "pass", "--args nope: NameError: name 'nope' is not defined"),
    ("--runs 2 --timeout 0", "pass", "--timeout must be more than 0 seconds, got 0"),
    ("--runs 2 --name K", "pass", "--name K: `K` is already defined in the notebook (type int); choose another --name"),
    ("--runs 2 --name 2x", "pass", "--name 2x: not a valid Python variable name"),
    ("--runs 2", "# nothing",
     "the cell is empty: write the node function's body (it sees `args` and `ctx`) below the magic line"),
    ("--runs 2", "x = = 1", "the cell is not valid Python: line 1: invalid syntax"),
]


@pytest.mark.parametrize(("line", "cell", "message"), BAD_INPUT, ids=[c[0] or c[1] for c in BAD_INPUT])
def test_magic_bad_input_is_a_one_line_usage_error(ip, line, cell, message):
    ip.user_ns.update(empty=[], adict={"lr": [1, 2]}, badkeys=[{"lr": 1}, {"learning rate": 2}])
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("tfos_parallel", line, cell)
    assert str(info.value) == message


# -- slow: real Spark, real TensorFlow -------------------------------------------------------------


def train_digits(args, ctx):
    """One run of the sweep: the digits MLP at this run's learning rate."""
    import os

    import numpy as np
    import tensorflow as tf

    from tfos_nb.examples import digits

    xtr, ytr, xte, yte = digits.load_digits_arrays()
    model = digits.build_model(args["learning_rate"])
    model.fit(xtr, ytr, epochs=args["epochs"], batch_size=32, verbose=0, callbacks=[ctx.progress_callback()])
    accuracy = float(np.mean(np.argmax(model.predict(xte, verbose=0), axis=1) == yte))
    return {
        "learning_rate": args["learning_rate"],
        "accuracy": accuracy,
        "run": ctx.worker_num,
        "layer": model.layers[0].name,  # Keras' name counter: "dense" only in a fresh process
        "pid": os.getpid(),
        "threads": os.environ.get("TF_NUM_INTRAOP_THREADS"),
        "tf": tf.__version__,
    }


@pytest.mark.slow
def test_learning_rate_grid_on_digits(sc, no_leaks):
    grid = [{"learning_rate": lr, "epochs": 4} for lr in LEARNING_RATES]
    seen = []
    runs = TFParallel.start(sc, train_digits, grid, use_barrier=False, env=NODE_ENV, name="lr-grid",
                            on_state=lambda st: seen.append(st.snapshot().state))
    results = runs.wait(timeout=300)
    assert not runs.barrier  # 4 runs, 2 task slots: waves, no barrier stage
    assert [r.index for r in results] == [0, 1, 2, 3]
    values = [r.value for r in results]
    assert [v["learning_rate"] for v in values] == LEARNING_RATES  # grid order
    assert [v["run"] for v in values] == [0, 1, 2, 3]
    assert [r.args for r in results] == grid
    for r in results:
        assert r.host and r.executor_id in ("0", "1") and r.elapsed > 0
        assert "loss" in r.metrics and r.metrics["accuracy"] == r.value["accuracy"]  # reported + returned
    accuracy = [v["accuracy"] for v in values]
    assert max(accuracy) > 0.9 and accuracy[3] < 0.5, accuracy  # lr=3 diverges: the sweep tells runs apart
    # each run is a fresh process: TensorFlow state (Keras name counters) never leaks into the next run
    assert [v["layer"] for v in values] == ["dense"] * 4
    assert len({v["pid"] for v in values}) == 4
    assert {v["threads"] for v in values} == {"1"}  # env= reached the runs
    print("run seconds:", [round(r.elapsed, 1) for r in results])
    view = runs.status()
    assert view.state == "finished" and [n.state for n in view.nodes] == ["finished"] * 4
    assert view.metric == "accuracy" and view.best == accuracy.index(max(accuracy))
    assert "running" in seen and runs.done


def ctx_probe(args, ctx):
    import os
    import sys

    fresh = "tensorflow" not in sys.modules and "TFOS_PROBE" not in os.environ
    os.environ["TFOS_PROBE"] = "1"  # would leak into a later run if runs shared a process
    try:
        ctx.get_data_feed()
        feed = "no error"
    except RuntimeError as exc:
        feed = str(exc)
    print(f"probe {ctx.worker_num} of {ctx.num_workers}", flush=True)
    ctx.report(step=3, score=10 + ctx.worker_num)
    if ctx.worker_num == 1:
        return None  # TFParallel.run lists its metrics instead
    return {
        "worker_num": ctx.worker_num, "executor_id": ctx.executor_id, "num_workers": ctx.num_workers,
        "is_chief": ctx.is_chief, "job_name": ctx.job_name, "cluster_spec": ctx.cluster_spec,
        "spark_executor_id": ctx.spark_executor_id, "fresh": fresh, "tf_config": os.environ.get("TF_CONFIG"),
        "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"), "feed": feed, "args": args, "pid": os.getpid(),
    }


@pytest.mark.slow
def test_barrier_runs_get_a_tfparallel_context(sc, no_leaks):
    lines = []
    runs = TFParallel.start(sc, ctx_probe, {"shared": True}, 2, env=NODE_ENV,
                            log_callback=lambda label, new: lines.extend(f"[{label}] {x}" for x in new))
    results = runs.wait(timeout=120)
    assert runs.barrier  # a slot per run: one barrier stage
    first, second = results[0].value, results[1].value
    assert first["worker_num"] == first["executor_id"] == 0 and first["num_workers"] == 2
    assert first["is_chief"] and first["job_name"] == "worker" and first["cluster_spec"] == {}
    assert first["spark_executor_id"] in ("0", "1") and first["args"] == {"shared": True}
    assert first["fresh"] and first["tf_config"] is None and first["legacy_keras"] == "1"
    assert first["feed"].startswith("parallel runs have no data feed")
    assert second is None and results[1].result == {"score": 11}  # returned nothing: its metrics
    assert "[run:0] probe 0 of 2" in lines and "[run:1] probe 1 of 2" in lines
    assert runs.logs(1)["run:1"] == ["probe 1 of 2"] == runs.logs("run:1")["run:1"]
    with pytest.raises(KeyError, match=r"no node 'run:7'; nodes are \['run:0', 'run:1'\]"):
        runs.logs("run:7")  # one logs() contract with TFCluster's (an unknown run was an empty dict)

    # more runs than slots: waves, each run in a new process even where Spark reuses its Python worker
    values = TFParallel.run(sc, ctx_probe, [{"i": i} for i in range(5)], use_barrier=False, env=NODE_ENV)
    assert [v["args"]["i"] if v and "args" in v else None for v in values] == [0, None, 2, 3, 4]
    assert values[1] == {"score": 11}
    assert all(v["fresh"] for v in values if "fresh" in v)


def fail_one(args, ctx):
    import time

    if args["lr"] == 10:
        print("about to diverge", flush=True)
        raise ValueError("loss is NaN at learning rate 10")
    for step in range(1200):  # the other run would go on for two minutes
        ctx.report(step=step, loss=1.0 / (step + 1))
        time.sleep(0.1)
    return {"loss": 0.0}


@pytest.mark.slow
def test_a_failing_run_stops_the_others_with_one_clear_error(sc, no_leaks):
    t0 = time.monotonic()
    with pytest.raises(TFParallel.TFParallelError) as info:
        TFParallel.run(sc, fail_one, [{"lr": 0.1}, {"lr": 10}], env=NODE_ENV)
    elapsed = time.monotonic() - t0
    err = info.value
    text = str(err)
    assert text.startswith("run:1 (lr=10) failed on host "), text
    assert "ValueError: loss is NaN at learning rate 10" in text.splitlines()[0]
    assert "--- last " in text and "about to diverge" in text and "Traceback" in text
    assert err.run == 1 and err.node == "run:1" and err.run_args == {"lr": 10} and err.host
    assert any("about to diverge" in line for line in err.tail)
    assert elapsed < 60, elapsed  # run:0 was stopped, not waited for


def loop_forever(args, ctx):
    import time

    step = 0
    while True:
        step += 1
        ctx.report(step=step)
        time.sleep(0.1)


@pytest.mark.slow
def test_keyboard_interrupt_cancels_the_job_group_and_stops_the_runs(sc, no_leaks):
    fired = threading.Event()

    def on_state(st):
        view = st.snapshot()
        if not fired.is_set() and all(n.state == "running" and n.step for n in view.nodes):
            fired.set()
            _thread.interrupt_main()  # what a notebook's ■ does: KeyboardInterrupt in the main thread

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        TFParallel.run(sc, loop_forever, [{}, {}], env=NODE_ENV, on_state=on_state, timeout=180)
    assert fired.is_set() and time.monotonic() - t0 < 120
    tracker = sc.statusTracker()
    assert wait_until(lambda: not tracker.getActiveJobsIds(), 15), tracker.getActiveJobsIds()
    assert wait_until(lambda: not runtime_processes(), 15)
    # Spark is usable right away
    assert sc.parallelize(range(4), 2).sum() == 6
    # a timeout stops the runs the same way
    with pytest.raises(TimeoutError, match=r"parallel runs \S+ did not finish within 3 s and were stopped"):
        TFParallel.run(sc, loop_forever, [{}], env=NODE_ENV, timeout=3)
    assert wait_until(lambda: not tracker.getActiveJobsIds(), 15), tracker.getActiveJobsIds()


# -- slow: the magic in a real IPython shell ---------------------------------------------------------
SWEEP_CELL = """
import time
ctx.report(step=1, score=args.x)
print("run", ctx.worker_num, "x", args.x, "base", args.base)
return {"accuracy": 1.0 - abs(args.x - 2) / 10, "x": args.x}
"""


@pytest.mark.slow
def test_magic_sweep_panel_best_and_errors(ip, spark, capsys, no_leaks):
    ip.run_line_magic("config", "TFOSMagics.renderer = 'text'")
    ip.user_ns["spark"] = spark
    ip.run_cell_magic("tfos_parallel", "--grid grid3 --args \"{'base': 7}\" --name sweep", SWEEP_CELL)
    out = capsys.readouterr().out
    h = ip.user_ns["sweep"]
    assert isinstance(h, ParallelHandle) and h.state == "finished"
    assert [r.value["x"] for r in h.results] == [0, 2, 1]  # grid order
    assert h.best.index == 1 and h.best.args.x == 2 and h.best.metrics["accuracy"] == 1.0
    assert h.values[2] == {"accuracy": 0.9, "x": 1}
    table = h.table()
    assert list(table["run"]) == [1, 2, 0] and list(table.columns[:2]) == ["run", "x"]
    assert "[run:0] run 0 x 0 base 7" in out  # output streams into the cell, tagged
    assert "run:1 x=2 finished" in out and "best run:1 accuracy 1" in out  # the text panel
    assert "tfos_nb: best of 3 runs: run:1 (x=2): accuracy 1.0" in out
    ip.run_line_magic("tfos_status", "")
    assert re.search(r"^sweep\s+finished\s+3\s", capsys.readouterr().out, flags=re.M)

    # --metric/--mode pick another best; a failing run ends the cell with its own error
    ip.run_cell_magic("tfos_parallel", "--grid grid3 --args \"{'base': 0}\" --metric x --mode min --name sweep",
                      SWEEP_CELL)
    assert ip.user_ns["sweep"].best.index == 0
    capsys.readouterr()
    t0 = time.monotonic()
    result = ip.run_cell("%%tfos_parallel --grid grid3 --name failing\nif args.x == 2:\n    raise KeyError('no x')\n"
                         "import time\ntime.sleep(600)")
    # run:0 was stopped, run:2 never started: left alone they would sleep 600 s; stopping takes seconds, and 120 s
    # is room for a loaded machine while staying a fifth of that sleep
    assert time.monotonic() - t0 < 120
    assert isinstance(result.error_in_exec, ParallelFailed)
    assert str(result.error_in_exec).startswith("run:1 (x=2) failed on host ")
    assert "KeyError: 'no x'" in str(result.error_in_exec)
    assert ip.user_ns["failing"].state == "failed"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "".join(capsys.readouterr()))
    assert "TFParallelError: run:1 (x=2) failed" in shown
    # the run's traceback starts in the cell: no frames of the magic or the runtime
    assert 'File "<%%tfos_parallel failing>", line 2' in shown
    assert "_magics.py" not in shown and "run_task.py" not in shown and "child_main.py" not in shown \
        and "_cellfn.py" not in shown


@pytest.mark.slow
def test_magic_background_and_interrupt(ip, spark, capsys, no_leaks):
    ip.run_line_magic("config", "TFOSMagics.renderer = 'text'")
    ip.user_ns["spark"] = spark
    ip.run_cell_magic("tfos_parallel", "--runs 2 --args \"{'x': 5}\" --background --name bg",
                      "ctx.report(score=args.x + ctx.worker_num)")
    assert "bg runs in the background (2 runs)" in capsys.readouterr().out
    results = ip.user_ns["bg"].wait(120)
    assert [r.result for r in results] == [{"score": 5}, {"score": 6}]  # no grid: every run got --args

    # ■ during a blocking cell: the runs stop, the Spark job is cancelled, the shell lives on
    def running() -> bool:
        h = ip.user_ns.get("forever")
        return h is not None and bool(h.nodes) and all(n.state == "running" for n in h.nodes)

    def interrupt_when_running():
        wait_until(running, 180, 0.05)
        _thread.interrupt_main()  # also when they never ran: the asserts below fail, the cell does not hang

    threading.Thread(target=interrupt_when_running, name="test-interrupter", daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        ip.run_cell_magic("tfos_parallel", "--runs 2 --name forever", "import time\nwhile True:\n    time.sleep(0.1)")
    h = ip.user_ns["forever"]
    assert h.done and h.state == "stopped" and [n.state for n in h.nodes] == ["stopped", "stopped"]
    tracker = spark.sparkContext.statusTracker()
    assert wait_until(lambda: not tracker.getActiveJobsIds(), 15)
    assert ip.run_cell("6 * 7").result == 42


# -- slow: the notebook in a real kernel ---------------------------------------------------------------


@pytest.mark.slow
def test_parallel_runs_notebook_runs_headless(kernel_specs, tmp_path):

    nb = nbformat.read(NOTEBOOK, as_version=4)
    run_notebook(nb, kernel_specs, NOTEBOOK.parent, tmp_path / NOTEBOOK.name)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    html = "".join(str(o.get("data", {}).get("text/html", "")) for o in outputs if "data" in o)
    # the API sweep: one line per run, in grid order
    rows = re.findall(r"^run (\d) learning_rate (\S+) accuracy", text, flags=re.M)
    assert [(int(i), float(lr)) for i, lr in rows] == list(enumerate(NOTEBOOK_LRS)), text[-3000:]
    best = re.search(r"^accuracy: (\d\.\d+)", text, flags=re.M)
    assert best and float(best.group(1)) >= 0.9, text[-3000:]
    # the magic sweep: a panel row per run with its parameters, the best starred, and the handle's answer
    assert "tfos_nb: best of 4 runs: run:" in text
    assert "&#9733; run:" in html and "learning_rate" in html
    assert not math.isnan(float(re.search(r"best of 4 runs: run:\d \(.*?\): val_accuracy ([\d.]+)", text).group(1)))
