"""TFParallel on a real local Spark Connect server: the runs as a mapInArrow stage, their control on an executor."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import threading
import time

import cloudpickle
import pytest

from tests.conftest import NODE_ENV, connect_fixture, runtime_processes, wait_until
from tfos_nb import TFParallel

pytestmark = pytest.mark.slow
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = connect_fixture(2)


def processes(role):
    return [p for p in runtime_processes() if role in p.cmdline()[3:4]]


def nothing_left():
    return wait_until(lambda: not runtime_processes(), 30) or [" ".join(p.cmdline()) for p in runtime_processes()]


def test_results_in_run_order_with_progress_and_output(spark):
    def fun(args, ctx):
        for step in range(3):
            ctx.report(step=step + 1, loss=args["lr"] * (3 - step))
        print(f"run {ctx.run_index} of {ctx.num_runs} lr={args['lr']}")
        return {"lr": args["lr"], "index": ctx.run_index, "squares": [i * i for i in range(3)]}

    grid = [{"lr": 0.1}, {"lr": 0.2}]
    runs = TFParallel.start(spark, fun, grid, env=NODE_ENV)  # use_barrier=True: one barrier stage on the 2 slots
    results = runs.wait(timeout=300)
    assert runs.barrier is True
    assert [r.index for r in results] == [0, 1] and [r.args for r in results] == grid
    assert [r.value for r in results] == [{"lr": 0.1, "index": 0, "squares": [0, 1, 4]},
                                          {"lr": 0.2, "index": 1, "squares": [0, 1, 4]}]
    assert all(r.host and r.executor_id for r in results)
    view = runs.status()
    assert view.state == "finished" and [n.state for n in view.nodes] == ["finished", "finished"]
    assert [n.step for n in view.nodes] == [3, 3]  # ctx.report progress, mirrored from the coordinator
    assert [n.metrics["lr"] for n in view.nodes] == [0.1, 0.2]  # the returned dict's scalars, as on classic
    assert view.params == tuple(grid)
    assert any("run 1 of 2 lr=0.2" in line for line in runs.logs(1)["run:1"])
    assert nothing_left() is True


def test_waves_return_every_result_in_order(spark):
    def fun(args, ctx):
        return args * 10 + ctx.run_index

    assert TFParallel.run(spark, fun, [1, 2, 3], per_run=True, use_barrier=False, env=NODE_ENV, timeout=300) \
        == [10, 21, 32]  # 3 runs on 2 slots, in waves
    assert nothing_left() is True


def test_failing_run_stops_the_others_and_names_itself(spark):
    def fun(args, ctx):
        import time

        if args["lr"] == 3.0:
            print("about to diverge")
            raise ValueError("diverged at lr=3.0")
        while True:  # stopped by run:1's failure (the coordinator tells it, not the notebook)
            ctx.report(step=1)
            time.sleep(0.1)

    start = time.monotonic()
    with pytest.raises(TFParallel.TFParallelError) as info:
        TFParallel.run(spark, fun, [{"lr": 0.1}, {"lr": 3.0}], env=NODE_ENV, timeout=300)
    took = time.monotonic() - start
    err = info.value
    text = str(err)
    assert err.node == "run:1" and err.run == 1 and err.run_args == {"lr": 3.0}
    assert text.startswith("run:1 (lr=3.0) failed on host "), text
    assert "ValueError: diverged at lr=3.0" in text and "about to diverge" in text
    assert took < 240, took
    assert nothing_left() is True


def test_barrier_with_more_runs_than_slots_fails_at_once(spark):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        TFParallel.run(spark, lambda args, ctx: 1, {}, 3)
    assert str(info.value) == (
        "use_barrier=True runs the 3 runs as one barrier stage, which needs 3 task slots; this Spark application "
        "has 2 on 2 executor(s). Pass use_barrier=False to run them in waves, or give Spark more executors.")
    assert time.monotonic() - start < 10
    assert not runtime_processes()  # refused before the coordinator started


@pytest.mark.parametrize("n", [1, 2])
def test_stop_leaves_nothing_running(spark, n):
    def fun(args, ctx):
        import time

        step = 0
        while True:
            step += 1
            ctx.report(step=step)
            print(f"step {step}")
            time.sleep(0.1)

    runs = TFParallel.start(spark, fun, {}, n, env=NODE_ENV)
    if n == 1:  # a free slot: the mirror follows the run while it runs
        wait_until(lambda: (runs.status().nodes[0].step or 0) >= 3, 120, what="run:0's progress in the mirror")
        assert runs.logs(0)["run:0"]
    else:  # every slot holds a run: the snapshot jobs wait; the processes say the runs run
        wait_until(lambda: len(processes("run")) == 2, 120, what="two run processes")
    threading.Timer(0.5, runs.stop, args=("test",)).start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"were stopped \(test\)"):
        runs.wait(timeout=120)
    assert time.monotonic() - start < 60
    view = runs.status()
    assert view.state == "stopped" and all(node.state == "stopped" for node in view.nodes)
    assert nothing_left() is True
    scratch = os.path.join(tempfile.gettempdir(), f"tfos_nb-{runs.cluster_id}-run*")
    assert wait_until(lambda: not glob.glob(scratch), 30, what="the runs' scratch directories removed")
    assert spark.range(4, numPartitions=2).count() == 4  # no task left holding a slot
