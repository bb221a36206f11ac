#!/usr/bin/env bash
# Set everything up, lint, and run the whole test suite (slow tiers included).
# Extra arguments go to pytest, e.g. `bash test.sh -m "not slow"` for the fast tier.
set -euo pipefail
cd "$(dirname "$0")"
TFOS_NB_TEST_DEPS=1 bash scripts/setup_env.sh
.venv/bin/python -m ruff check tfos_nb tests scripts benchmarks
# types (config: [tool.mypy] in pyproject.toml); the layer rules are tests/test_layers.py, in the fast tier
.venv/bin/python -m mypy
# two worker processes (pytest-xdist): one runs a test module, or the modules sharing a Spark, while the other waits
# on what it asserts (tests/conftest.py::pytest_collection_modifyitems); TFOS_NB_TEST_WORKERS=0 runs them in this one
exec .venv/bin/python -m pytest -n "${TFOS_NB_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder "$@"
