#!/usr/bin/env python
"""Issue 44: the row-id audit of recovery, in randomized trials -- not a timing: duplicates and missing rows.

Each trial is ``tests/test_recovery.py``'s (one definition): a Keras 3 job under ``MultiWorkerMirroredStrategy``
(chief + worker) fed 3 epochs of a DataFrame of row ids (6 partitions, even or skewed), ``run_job(retries=1)``,
no checkpoint code; the executor JVM under the chief or the worker is SIGKILLed inside a randomly drawn epoch,
0-7 steps after a backup landed; the job must resume from the backup and end with every row trained exactly
3 times — counted from the model's own weights (one weight per row id, each training adds the same amount).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/recovery_audit.py --trials 20 --seed 1`` (about 25 minutes on 2
cores); writes ``benchmarks/results/recovery-audit.md`` (and ``.json``, every trial).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.conftest import spark_session
from tests.test_recovery import EPOCHS, run_trial

OUT = Path(__file__).resolve().parent / "results"


def seconds(s: float | None) -> str:
    """Kill to attempt 2's first step; none when it resumed after the last step (nothing left to train)."""
    return "no step left" if s is None else f"{s:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    spark = spark_session(3, conf={"spark.task.maxFailures": "4"})
    trials, failed = [], []
    started = time.monotonic()
    try:
        for i in range(opts.trials):
            seed = opts.seed * 1000 + i
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    t = run_trial(spark, Path(tmp), seed)
                except Exception as exc:  # a trial that did not end as it must: reported, the run goes on
                    failed.append({"seed": seed, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                    print(f"trial {i + 1}: FAILED {failed[-1]['error']}", flush=True)
                    continue
            trials.append(t)
            print(f"trial {i + 1}: epoch {t['epoch']} {t['node']} skew={t['skew']} -> resumed {t['resumed']}; "
                  f"duplicates {t['duplicates']}, missing {t['missing']}, kill->step {seconds(t['kill_to_step_s'])}",
                  flush=True)
    finally:
        spark.stop()
    kill = [t["kill_to_step_s"] for t in trials if t["kill_to_step_s"] is not None]  # None: no step left to take
    lines = [
        f"# Recovery audit: {len(trials)} of {opts.trials} trials ended as they must (seed {opts.seed}, "
        f"{time.monotonic() - started:.0f} s)",
        "",
        f"Command: `PYTHONPATH=. .venv/bin/python benchmarks/recovery_audit.py --trials {opts.trials} --seed {opts.seed}`",
        "",
        f"- rows trained twice: {sum(t['duplicates'] for t in trials)}; rows never trained: "
        f"{sum(t['missing'] for t in trials)} (each of {EPOCHS} epochs, every trial)",
        f"- resumed from a backup, not from the start: {sum(t['resumed'].startswith('from the backup') for t in trials)}"
        f" of {len(trials)}",
        f"- kill to the first step of attempt 2: min {min(kill, default=0):.1f} s, median "
        f"{statistics.median(kill) if kill else 0:.1f} s, max {max(kill, default=0):.1f} s",
        "",
        "| trial seed | killed in epoch | node | skewed | resumed | steps computed again | duplicates | missing "
        "| kill → step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {t['seed']} | {t['epoch']} | {t['node']} | {t['skew']} | {t['resumed']} | {t['steps_repeated']} | "
              f"{t['duplicates']} | {t['missing']} | {seconds(t['kill_to_step_s'])} |" for t in trials]
    lines += [f"| {f['seed']} | failed: {f['error']} | | | | | | | |" for f in failed]
    OUT.mkdir(exist_ok=True)
    (OUT / "recovery-audit.md").write_text("\n".join(lines) + "\n")
    (OUT / "recovery-audit.json").write_text(json.dumps({"trials": trials, "failed": failed}, indent=1, default=str))
    print("\n".join(lines))
    return 0 if not failed and all(t["duplicates"] == t["missing"] == 0 for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
