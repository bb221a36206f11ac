"""Recovery's ledger, fast tier: the row-range arithmetic, the feeder's skipping, and which backup a retry resumes
from — on real files in a real folder, the same ones nodes and the chief write (``tests/test_recovery.py`` runs
the whole of it on a real cluster)."""

from __future__ import annotations

import json
import os
import random
import stat

import pyarrow as pa
import pytest

from tfos_nb.runtime.executor.feeding.batches import without
from tfos_nb.runtime.recovery import files, ledger
from tfos_nb.runtime.recovery.folder import JobBackups


def test_merge_joins_overlapping_and_adjacent_ranges():
    assert ledger.merge([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4)]) == [(0, 3), (5, 9)]


def test_original_offsets_of_rows_fed_without_a_skip_set():
    skip = [(2, 4), (6, 7)]  # rows sent: 0 1 4 5 7 8 9 ...
    assert ledger.original(skip, 0, 2) == [(0, 2)]
    assert ledger.original(skip, 1, 5) == [(1, 2), (4, 6), (7, 8)]
    assert ledger.original([], 3, 9) == [(3, 9)]
    assert ledger.original([(0, 10)], 0, 3) == [(10, 13)]


def test_original_and_kept_slices_agree_on_random_skips():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(1, 60)
        skip = ledger.merge((a, a + rng.randrange(1, 6)) for a in rng.sample(range(n), rng.randrange(0, min(5, n) + 1)))
        sent = [i for i in range(n) if not any(a <= i < b for a, b in skip)]
        start = rng.randrange(0, len(sent) + 1)
        end = rng.randrange(start, len(sent) + 1)
        expect = sent[start:end]
        got = [i for a, b in ledger.original(skip, start, end) for i in range(a, b)]
        assert got == expect, (skip, start, end)
        offset = rng.randrange(0, n)
        width = rng.randrange(0, n - offset + 1)
        kept = [offset + s + j for s, k in ledger.kept_slices(skip, offset, width) for j in range(k)]
        assert kept == [i for i in sent if offset <= i < offset + width]


def test_the_feeder_leaves_out_the_skipped_rows_across_its_batches():
    batches = [pa.RecordBatch.from_pydict({"id": list(range(a, a + 4))}) for a in range(0, 12, 4)]
    out = [v for b in without(batches, [(1, 2), (3, 6), (11, 20)]) for v in b.column(0).to_pylist()]
    assert out == [0, 2, 6, 7, 8, 9, 10]


def _backup(folder, seq, attempt, epoch, steps, epoch_end=False, spe=2):
    ledger.save_weights(folder, seq, lambda f: None)
    ledger.commit(folder, ledger.Backup(seq, attempt, epoch, steps, 10 * seq, epoch_end, spe, 0.01))


def test_a_retry_resumes_from_the_newest_backup_whose_rows_the_ledger_knows(tmp_path):
    folder = str(tmp_path)
    ledger.Start(1, 0, {}).save(folder)
    chief, worker = ledger.ElementLog(folder, 1, "chief:0"), ledger.ElementLog(folder, 1, "worker:0")
    for i in range(3):  # generation 1 (epoch 0): each node's elements, two rows each
        chief.element(1, i, [(0, 2 * i, 2 * i + 2)])
        worker.element(1, i, [(1, 2 * i, 2 * i + 2)])
    chief.end(1, 3)
    worker.end(1, 3)
    chief.element(2, 0, [(1, 0, 2)])  # generation 2: the chief took one element, the worker none yet
    _backup(folder, 1, 1, 0, 4)  # 4 steps, 2 a element: each node's first 2 elements
    plan = ledger.plan(folder)
    assert plan.backup.seq == 1 and plan.epoch == 0
    assert plan.skip == {0: [(0, 4)], 1: [(0, 4)]}
    assert plan.rows_skipped == 8
    _backup(folder, 2, 1, 1, 2)  # inside epoch 1, one element each: the worker's is not in its log
    assert ledger.plan(folder).backup.seq == 1  # so the retry takes the older one
    _backup(folder, 3, 1, 0, 0, epoch_end=True)
    plan = ledger.plan(folder)
    assert (plan.backup.seq, plan.epoch, plan.skip) == (3, 1, {})
    assert plan.epochs_to_feed(3) == 2 and plan.epochs_to_feed(1) == 1


def test_a_node_past_its_share_counts_its_whole_share_and_an_odd_step_does_not_count(tmp_path):
    folder = str(tmp_path)
    chief, worker = ledger.ElementLog(folder, 1, "chief:0"), ledger.ElementLog(folder, 1, "worker:0")
    for i in range(4):
        chief.element(1, i, [(0, i, i + 1)])
    worker.element(1, 0, [(1, 0, 5)])
    worker.end(1, 1)  # the worker's share was one element: its peers read on, it steps with empty batches
    _backup(folder, 1, 1, 0, 6)  # 3 elements each
    assert ledger.plan(folder).skip == {0: [(0, 3)], 1: [(0, 5)]}
    _backup(folder, 2, 1, 0, 7)  # between two elements of a node: not a point the ledger can name
    assert ledger.plan(folder).backup.seq == 1


def test_a_backup_after_every_nodes_whole_share_resumes_at_the_next_epoch(tmp_path):
    """A node lost between an epoch's last step and its end (the chief backed up after the last step, never at the
    end): every row of that epoch was trained, so the retry starts the next epoch — an epoch fed with no row would
    leave the nodes no data to build their datasets from.  The same backup one element earlier feeds the rest."""
    folder = str(tmp_path)
    ledger.Start(1, 0, {}).save(folder)
    chief, worker = ledger.ElementLog(folder, 1, "chief:0"), ledger.ElementLog(folder, 1, "worker:0")
    for i in range(3):
        chief.element(1, i, [(0, 2 * i, 2 * i + 2)])
    worker.element(1, 0, [(1, 0, 2)])
    worker.end(1, 1)  # the smaller share: empty batches after its one element
    _backup(folder, 1, 1, 0, 4)  # 2 elements each: the chief's third is not trained
    plan = ledger.plan(folder)
    assert (plan.epoch, plan.skip, plan.whole_epoch) == (0, {0: [(0, 4)], 1: [(0, 2)]}, False)
    chief.end(1, 3)  # the chief's generator found its share's end (prefetching): not yet trained
    assert ledger.plan(folder).epoch == 0
    _backup(folder, 2, 1, 0, 6)  # after the epoch's last step: every node's whole share trained
    plan = ledger.plan(folder)
    assert (plan.backup.seq, plan.epoch, plan.skip, plan.rows_skipped, plan.whole_epoch) == (2, 1, {}, 0, True)
    assert plan.epochs_to_feed(2) == 1 and plan.epochs_to_feed(1) == 1
    folder_plan = JobBackups(folder)
    folder_plan.resume = plan
    assert folder_plan.describe() == ("from the backup after the last step of epoch 1 (global step 20): all of that "
                                      "epoch was trained, training resumes at epoch 2")


def test_a_node_the_ledger_cannot_follow_leaves_only_epoch_ends(tmp_path):
    folder = str(tmp_path)
    log = ledger.ElementLog(folder, 1, "chief:0")
    log.element(1, 0, [(0, 0, 4)])
    log.cannot_follow("next_batch")
    log.cannot_follow("again")  # said once
    _backup(folder, 1, 1, 0, 0, epoch_end=True)
    _backup(folder, 2, 1, 1, 2)
    plan = ledger.plan(folder)
    assert (plan.backup.seq, plan.epoch) == (1, 1)
    lines = open(log.path).read().splitlines()
    assert [json.loads(line).get("inexact") for line in lines].count("next_batch") == 1 and len(lines) == 2


def test_a_resumed_attempt_adds_the_rows_it_did_not_feed_to_its_own(tmp_path):
    folder = str(tmp_path)
    ledger.Start(2, 1, {3: [(0, 10)]}, seq=1).save(folder)  # attempt 2 resumed epoch 1 without rows 0-10 of p3
    log = ledger.ElementLog(folder, 2, "chief:0")
    log.element(1, 0, [(3, 10, 14)])  # positions 0-4 of what was sent are rows 10-14
    _backup(folder, 5, 2, 1, 1, spe=1)
    assert ledger.plan(folder).skip == {3: [(0, 14)]}


def test_a_line_cut_by_a_kill_ends_the_log(tmp_path):
    folder = str(tmp_path)
    log = ledger.ElementLog(folder, 1, "chief:0")
    log.element(1, 0, [(0, 0, 4)])
    with open(log.path, "a") as f:
        f.write('{"g":1,"i":1,"s":[[0,4')
    _backup(folder, 1, 1, 0, 1, spe=1)
    _backup(folder, 2, 1, 0, 2, spe=1)
    assert ledger.plan(folder).backup.seq == 1


def test_only_the_newest_backups_are_kept(tmp_path):
    folder = str(tmp_path)
    for seq in range(1, 6):
        _backup(folder, seq, 1, 0, 0, epoch_end=True)
    assert [b.seq for b in ledger.backups(folder)] == [5, 4, 3]
    assert sorted(os.listdir(folder)) == sorted([f"state-{s}.json" for s in (3, 4, 5)]
                                                + [f"weights-{s}.npz" for s in (3, 4, 5)])


def test_the_job_folder_is_private_and_removed_at_the_end(tmp_path):
    backups = JobBackups.open("local-cluster[2,1,1024]", str(tmp_path / "root"))
    assert stat.S_IMODE(os.stat(backups.folder).st_mode) == 0o700
    owner = {files.ENV_OWNER: str(os.geteuid())}
    assert backups.attempt(1) == {ledger.ENV_DIR: backups.folder, **owner}
    assert backups.describe() == "from the first step (no backup yet)"
    _backup(backups.folder, 1, 1, 2, 0, epoch_end=True)
    env = backups.attempt(2)
    assert env == {ledger.ENV_DIR: backups.folder, ledger.ENV_SEQ: "1", **owner}
    assert backups.describe() == "from the backup at the start of epoch 4 (global step 10)"
    backups.close()
    assert not os.path.exists(backups.folder) and os.path.isdir(tmp_path / "root")


def test_no_folder_every_node_reaches_means_no_backups_said_once(caplog):
    assert JobBackups.open("yarn") is None
    assert "no backup folder every node reaches" in caplog.text
    with pytest.raises(ValueError, match="a URI is not supported"):
        JobBackups.open("yarn", "hdfs:///backups")


def test_a_job_of_tensorflowonsparks_default_epochs_feeds_them_all_and_a_resumed_one_the_rest(tmp_path):
    """``num_epochs=0`` is TensorFlowOnSpark's 10 epochs: with retries the first attempt feeds all 10, not 1."""
    from types import SimpleNamespace

    from tfos_nb.runtime.driver.options import RetryPolicy
    from tfos_nb.runtime.recovery.restart import Recovery

    recovery = Recovery(SimpleNamespace(master="local[2]"), RetryPolicy(retries=1, backup_dir=str(tmp_path)))
    try:
        recovery.env(1)
        assert (recovery.epochs(0), recovery.epochs(3), recovery.skip_rows) == (10, 3, {})
        _backup(recovery.backups.folder, 1, 1, 3, 0, epoch_end=True)
        recovery.env(2)
        assert (recovery.epochs(0), recovery.epochs(5)) == (6, 1)
        assert recovery.describe() == "from the backup at the start of epoch 5 (global step 10)"
    finally:
        recovery.close()
    assert os.listdir(tmp_path) == []
