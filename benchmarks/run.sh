#!/usr/bin/env bash
# One command for the runtime benchmarks (B1 feeding throughput, B4a control plane):
#   bash benchmarks/run.sh [--rows N] [--runs K] [--only tfos,tfos_nb,ceiling] [--bench B1,B4a] ...
# and for B2 (training parity: single process, tfos_nb, TensorFlowOnSpark; benchmarks/bench_training.py):
#   bash benchmarks/run.sh b2 [--rows N] [--epochs E] [--runs K] [--only single,tfos_nb,tfos] ...
# and for B5 (scale and memory: 100k and 1M rows from Parquet, peak RSS per process; benchmarks/bench_scale.py):
#   bash benchmarks/run.sh b5 [--rows 100000,1000000] [--modes spark,numpy,fit] [--runs K] [--cache-dir DIR] ...
# Creates/refreshes <repo>/.venv-bench, runs benchmarks/bench_runtime.py, prints the markdown
# table and writes it to benchmarks/results/latest.md (full default run) or
# benchmarks/results/partial.md (reduced/partial runs), unless --out is given.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
cd "$ROOT"
bash "$HERE/setup_env.sh"
mkdir -p "$HERE/results"
export BENCH_CMD="bash benchmarks/run.sh${*:+ $*}"
# tfos_nb from the source tree when it is not pip-installed (no setup.py yet)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = b2 ]; then
  shift
  exec "$ROOT/.venv-bench/bin/python" "$HERE/bench_training.py" "$@"
fi
if [ "${1:-}" = b5 ]; then
  shift
  exec "$ROOT/.venv-bench/bin/python" "$HERE/bench_scale.py" "$@"
fi
exec "$ROOT/.venv-bench/bin/python" "$HERE/bench_runtime.py" "$@"
