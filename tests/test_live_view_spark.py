"""The live view on a real cluster: a worker that blocks before its first collective is named by the stall flag
within the configured time, ``%tfos_stack`` shows the frame it blocks in, and once released the nodes go through
their phases in order (real Spark local-cluster, real TensorFlow, MultiWorkerMirroredStrategy, the magics)."""

from __future__ import annotations

import os
import re
import textwrap

import pytest

from tests.conftest import global_shell_with, spark_fixture, wait_until
from tfos_nb.runtime.executor.process import phases

pytestmark = pytest.mark.slow

spark = spark_fixture(2)

STALL_AFTER = 3.0

CELL = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf

    def wait_for_release(path):
        with open(path) as fifo:  # blocks until the test opens the FIFO for writing
            return fifo.read()

    if ctx.job_name == "worker":
        wait_for_release(args.fifo)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # its first collective waits for every worker
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer="sgd", loss="mse")
    x = np.random.rand(64, 4).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1))).batch(8).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    model.fit(ds.with_options(options), epochs=2, steps_per_epoch=10, verbose=0, callbacks=[ctx.progress_callback()])
""")


@pytest.fixture(scope="module")
def ip(spark):
    yield from global_shell_with(spark, "stuck")


def in_order(seen: list[str], expected: list[str]) -> bool:
    rest = iter(seen)
    return all(phase in rest for phase in expected)


def test_a_worker_blocked_before_the_first_collective_is_named_and_its_stack_shows_where(ip, tmp_path, capsys):
    fifo = str(tmp_path / "release")
    os.mkfifo(fifo)
    ip.user_ns["release_path"] = fifo
    ip.run_line_magic("config", f"TFOSMagics.stall_after = {STALL_AFTER}")
    ip.run_line_magic("config", 'TFOSMagics.renderer = "none"')
    ip.run_cell_magic("tfos_cluster", "--workers 2 --background --name stuck --args dict(fifo=release_path)", CELL)
    handle = ip.user_ns["stuck"]
    released = False
    try:
        seen: list[tuple[str | None, str | None, str]] = []

        def chief_phase() -> str | None:
            view = handle.status()
            if view is not None and (not seen or seen[-1][:2] != (view.nodes[0].phase, view.nodes[1].phase)):
                seen.append((view.nodes[0].phase, view.nodes[1].phase, view.state))
            return None if view is None else view.nodes[0].phase

        # the chief building its strategy (the phases both nodes went through, should it not)
        assert wait_until(lambda: chief_phase() == phases.STRATEGY, 240), seen
        # from then on the chief does not move: flagged within the threshold (plus a sample and a heartbeat).
        # The worker, blocked since it entered the node function, may be flagged first (on a slow machine the
        # chief reaches its strategy seconds after the worker blocks): its own line is true too, and comes after.
        expected = ("chief:0: no step for 3 s, building the strategy (its first collective) — "
                    "worker:0 (running the node function) has not reached it")

        def chief_flagged() -> tuple[str, ...] | None:
            lines = handle.status().stalls
            return lines if any(line.startswith("chief:0:") for line in lines) else None

        stalls = wait_until(chief_flagged, STALL_AFTER + 2.5, 0.05)
        assert stalls and stalls[0] == expected, (stalls, handle.status().nodes)
        # the worker's line names the user's call it blocks in once a stack sample showed it (sampled, so it may
        # not have yet): either way the place is the true one
        assert all(re.fullmatch(r"worker:0: no step for \d+ s, in the node function"
                                r"(, in wait_for_release \(<%%tfos_cluster stuck>:\d+\))?", line)
                   for line in stalls[1:]), stalls

        capsys.readouterr()
        ip.run_line_magic("tfos_stack", "stuck --node worker:0")
        out = capsys.readouterr().out
        assert out.startswith("--- worker:0\n"), out
        blocking = [line for line in out.splitlines() if "in wait_for_release" in line]
        assert blocking, out  # the user's call it blocks in, with its line
        chief = handle.stacks("chief:0")["chief:0"]  # the cluster's stacks() through the handle
        assert "collective_all_reduce_strategy.py" in chief and "in __init__" in chief, chief

        with open(fifo, "w") as f:
            f.write("go")
        released = True
        handle.wait(timeout=300)
    finally:
        if not released:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the worker reads EOF and goes on; the cluster stops
            os.close(fd)
            handle.shutdown()
    assert handle.state == "finished", handle.error
    nodes = handle._cstate.nodes  # the phases each node process went through, as its heartbeats said
    chief_log, worker_log = list(nodes[0].phase_log), list(nodes[1].phase_log)
    assert in_order(chief_log, [phases.IMPORTING, phases.STRATEGY, phases.TRAINING, phases.FINISHING]), chief_log
    # the worker's own strategy, built once released, is over within a sample (the chief was waiting for it)
    assert in_order(worker_log, [phases.IMPORTING, phases.RUNNING, phases.TRAINING, phases.FINISHING]), worker_log
    assert handle.status().stalls == ()
