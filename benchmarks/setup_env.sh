#!/usr/bin/env bash
# Create/refresh the benchmark virtualenv at <repo>/.venv-bench (idempotent).
# Skips work when the stamp matches the hash of requirements-bench.txt + requirements.txt
# (+ setup.py when it exists).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VENV="$ROOT/.venv-bench"
STAMP="$VENV/.bench-stamp"
PY="${PYTHON:-python3}"

hash_inputs() {
  cat "$HERE/requirements-bench.txt" "$ROOT/requirements.txt" \
      $( [ -f "$ROOT/setup.py" ] && echo "$ROOT/setup.py" ) \
      $( [ -f "$ROOT/pyproject.toml" ] && echo "$ROOT/pyproject.toml" ) 2>/dev/null | sha256sum | cut -d' ' -f1
}
WANT="$(hash_inputs)"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "[setup_env] $VENV up to date" >&2
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_env] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
echo "[setup_env] installing benchmarks/requirements-bench.txt" >&2
(cd "$HERE" && "$VENV/bin/python" -m pip install -q -r requirements-bench.txt) >&2

if [ -f "$ROOT/setup.py" ] || [ -f "$ROOT/pyproject.toml" ]; then
  echo "[setup_env] installing the project (pip install -e .)" >&2
  # keep TFoS's setuptools<81 in the same resolve
  (cd "$ROOT" && "$VENV/bin/python" -m pip install -q -e . "setuptools<81") >&2
else
  echo "[setup_env] no setup.py yet: the harness puts the repo root on PYTHONPATH" >&2
fi
echo "$WANT" > "$STAMP"
echo "[setup_env] done" >&2
