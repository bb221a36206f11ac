#!/usr/bin/env bash
# Set everything up, lint, and run the whole test suite (slow tiers included).
# Extra arguments go to pytest, e.g. `bash test.sh -m "not slow"` for the fast tier.
set -euo pipefail
cd "$(dirname "$0")"
TFOS_NB_TEST_DEPS=1 bash scripts/setup_env.sh
.venv/bin/python -m ruff check tfos_nb tests scripts benchmarks
# types (config: [tool.mypy] in pyproject.toml); the layer rules are tests/test_layers.py, in the fast tier
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
