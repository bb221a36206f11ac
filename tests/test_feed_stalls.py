"""Who waits for whom on the data path, on a real cluster (issue 41): a node that stops reading (a callback that
never returns) and a feeding task stalled mid-partition (its upstream iterator blocks) are named by the stall flag,
with the place in the user's code and the Spark partition involved, within 30 s by default.  The flag ends nothing
(a slow callback or a slow upstream computation may be what the user meant): the stalled feed goes on once its
block ends, and a cell's ``--timeout`` ends a stuck job with a message that says where it was stuck.

Real Spark local-cluster (3 executors), real feeding tasks, a real IPython shell for the cell.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import threading
import time

import cloudpickle
import pytest

from tests.conftest import global_shell_with, runtime_processes, spark_fixture, start_cluster, wait_until
from tfos_nb import TFCluster
from tfos_nb.magics import ClusterFailed
from tfos_nb.runtime.driver.control.stalls import DEFAULT_STALL_AFTER

pytestmark = [pytest.mark.slow, pytest.mark.faults]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = spark_fixture(3)

NAMED_WITHIN_S = 30  # issue 41: every fault named within 30 s, by default (no stall_after given)

# a data scientist's cell: worker:0's "callback" never returns after its 5th step, so it stops reading its feed
CELL = textwrap.dedent("""
    import time

    def on_epoch_end():
        with open(args["stamp"], "w") as f:
            f.write(repr(time.time()))
        time.sleep(3600)  # a callback that never returns (a lock, a remote call)

    feed = ctx.get_data_feed()
    step = 0
    while not feed.should_stop():
        if feed.next_batch(100):
            step += 1
            ctx.report(step=step)
            if ctx.job_name == "worker" and step == 5:
                on_epoch_end()
""")
TIMEOUT_S = 45  # the cell's --timeout (after the flag, due 20 s after the last step): the job is torn down then, and its
# message says where it was stuck


@pytest.fixture(scope="module")
def ip(spark):
    yield from global_shell_with(spark, "stuck")


def test_a_node_that_stops_reading_is_named_with_its_callback_and_the_feeding_task_waiting_for_it(ip, spark, tmp_path,
                                                                                                  no_leaks):
    """Flagged within 30 s by default (no stall_after set), with its place in the cell and the Spark partition whose
    feeding task waits for it; the cell's --timeout then ends the job with a message that says the same."""
    stamp = str(tmp_path / "blocked_at")
    ip.user_ns["df"] = spark.range(0, 60_000, numPartitions=6).selectExpr("cast(id as float) as x")
    ip.user_ns["stamp"] = stamp
    ip.run_line_magic("config", 'TFOSMagics.renderer = "none"')
    magics = ip.magics_manager.registry["TFOSMagics"]
    assert magics.stall_after == DEFAULT_STALL_AFTER  # what a user gets: nothing set
    ip.run_cell_magic("tfos_cluster", f"--workers 2 --data df --background --name stuck --timeout {TIMEOUT_S} "
                                      "--args dict(stamp=stamp)", CELL)
    handle = ip.user_ns["stuck"]
    try:
        def flagged() -> str | None:
            view = handle.status()
            return None if view is None else next((s for s in view.stalls if s.startswith("worker:0:")), None)

        line = wait_until(flagged, TIMEOUT_S + 30)
        flagged_at = time.time()
        assert line, f"worker:0 was never flagged: {handle.status()}"
        with open(stamp) as f:
            named = flagged_at - float(f.read())
        assert handle.join(TIMEOUT_S + 60), "the cell's timeout did not end the job"
        with pytest.raises(ClusterFailed) as info:
            handle.wait(0)
    finally:
        handle.shutdown(60)
    assert line.startswith("worker:0: no step for "), line
    assert re.search(r", training, in on_epoch_end \(.+:\d+\) — the feeding tasks? of partition \d \(executor \d, "
                     r"open \d+ s\)(, partition \d \(executor \d, open \d+ s\))* waits? for it to take rows$", line), line
    assert named <= NAMED_WITHIN_S, (named, line)
    text = str(info.value)
    assert f"did not finish within {TIMEOUT_S} s and was torn down; stalled then: " in text, text
    assert re.search(r"worker:0: no step for \d+ s, training, in on_epoch_end \(.+:\d+\) — the feeding tasks? of "
                     r"partition \d \(executor \d, open \d+ s\)(, partition \d \(executor \d, open \d+ s\))* waits? "
                     r"for it to take rows", text), text
    assert wait_until(lambda: not runtime_processes(), 30), runtime_processes()
    print(f"\nnode stops reading: named in {named:.1f} s: {line}\ncell ended: {text}")


def reader(args, ctx):
    """Reads 100 rows a step until the feed ends."""
    feed = ctx.get_data_feed()
    step = 0
    while not feed.should_stop():
        if feed.next_batch(100):
            step += 1
            ctx.report(step=step)


def test_a_feeding_task_stalled_mid_partition_is_named_by_the_node_waiting_for_it(sc, tmp_path, no_leaks):
    """Partition 2's upstream computation blocks after 2,000 of its 3,000 rows: the node its feeding task was given waits for data
    and names that task (partition, executor); released, the feed goes on and every row arrives once."""
    fifo, stamp = str(tmp_path / "release"), str(tmp_path / "blocked_at")
    os.mkfifo(fifo)

    def rows(index, it):  # pickled by pyspark's own cloudpickle: it refers to nothing of this module
        import os as o
        import time as t

        for i, row in enumerate(it):
            if index == 2 and i == 2_000:  # after its first 1,024-row batch went to a node: mid-partition
                with open(stamp + ".tmp", "w") as f:
                    f.write(repr(t.time()))
                o.replace(stamp + ".tmp", stamp)
                with open(fifo) as f:  # blocks until the test opens it for writing
                    f.read()
            yield row

    rdd = sc.parallelize(range(18_000), 6).mapPartitionsWithIndex(rows)
    cluster = start_cluster(sc, reader, {}, 2, master_node="chief", input_mode=TFCluster.InputMode.SPARK)
    seen: list = []
    stalls: list = []

    def waits_for_partition_2() -> str | None:
        stalls[:] = cluster.status().stalls
        return next((s for s in stalls if "it waits for the feeding task of partition 2 (executor " in s), None)

    def watch() -> None:
        seen.append((wait_until(waits_for_partition_2, DEFAULT_STALL_AFTER + 120), time.time()))
        with open(fifo, "w") as f:  # released either way: a missed flag fails the test, not a hang
            f.write("go")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cluster.train(rdd, 1)  # returns once the block ended: the flag ends nothing
    watcher.join(10)
    cluster.shutdown(timeout=120)
    assert seen and seen[0][0], f"no node named the feeding task of partition 2: {stalls}"
    line, flagged_at = seen[0]
    with open(stamp) as f:
        named = flagged_at - float(f.read())
    assert re.match(r"(chief|worker):0: no step for \d+ s, waiting for data, in reader \(test_feed_stalls.py:\d+\) — "
                    r"it waits for the feeding task of partition 2 \(executor \d, open \d+ s\)$", line), line
    assert named <= NAMED_WITHIN_S, (named, line, stalls)
    assert sum(n.rows_fed for n in cluster.nodes) == 18_000
    assert wait_until(lambda: not runtime_processes(), 15), runtime_processes()
    print(f"\nfeeding task stalled mid-partition: named in {named:.1f} s: {stalls}")
