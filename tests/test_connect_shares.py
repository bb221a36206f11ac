"""Spark Connect: an epoch of skewed partitions under ``MultiWorkerMirroredStrategy`` trains every row once.

Nodes given unequal shares of an epoch step together, so each must end its read at its own share's end, not at the
epoch's: on a classic session the driver counts the feeding stage's tasks with Spark's status tracker; a Connect
client has none, and without the count the node whose share ran out waited for more rows while its peer, blocked
in the collective, could not take the rest of its own partition (the epoch's job never ended: a hang).

The program is the recovery audit's (``tests/test_recovery.py``): Keras 3, one weight per row id, so the chief's
weights say how many times each row was trained.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import NODE_ENV, connect_fixture
from tests.test_recovery import BATCH, ROWS, audit_frame, audit_fun, counts
from tfos_nb import TFCluster

pytestmark = [pytest.mark.slow]

# the coordinator takes one task slot; two are left to feed
spark = connect_fixture(3)


def test_a_skewed_epoch_on_spark_connect_trains_every_row_once(spark, tmp_path):
    df = audit_frame(spark, skew=True)  # partitions of 400, 150, 400, 60, 400, 400 rows
    ids = [r.id for r in df.select("id").collect()]
    args = {"dir": str(tmp_path), "rows": ROWS, "batch": BATCH, "epochs": 2, "pause": 0.0}
    # feed_timeout: a feeding task that waits this long for its node to take its rows fails the job (before the
    # fix, the one whose node was blocked in the collective did)
    outcome = TFCluster.run_job(spark, audit_fun, args, 2, master_node="chief", data=df, num_epochs=2,
                                env=NODE_ENV, feed_timeout=90)
    assert outcome.status.state == "finished", outcome
    seen = counts(np.load(tmp_path / "weights.npy"), ids, 2)
    assert sorted(set(seen.values())) == [2], {n: sum(1 for v in seen.values() if v == n) for n in set(seen.values())}
    assert len(ids) == 1810
