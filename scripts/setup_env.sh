#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install tfos_nb with
# everything the demo and the tests need. Idempotent: skips the install while the
# requirement files are unchanged. Needs python3 (>= 3.10) and Java 17 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
command -v java >/dev/null || { echo "tfos_nb: Java 17 is needed by Spark and was not found on PATH" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.tfos_nb-stamp
want=$(cat requirements.txt requirements-test.txt setup.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-test.txt
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
