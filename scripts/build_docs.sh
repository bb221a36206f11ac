#!/usr/bin/env bash
# Build the documentation site into build/site (open build/site/index.html), warnings as errors.
# Needs only python3: installs the docs' pinned requirements (requirements-docs.txt, also part of
# requirements-test.txt, so `bash test.sh` has them too) into .venv when mkdocs is not there yet.
# mkdocstrings reads the docstrings statically: nothing here imports TensorFlow or starts Spark.
# Extra arguments go to `mkdocs build`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import mkdocs, mkdocstrings_handlers.python, mkdocs_jupyter" 2>/dev/null; then
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  .venv/bin/python -m pip install -q -r requirements-docs.txt
fi
export NO_MKDOCS_2_WARNING=1  # mkdocs-material's banner about its successor
exec .venv/bin/python -m mkdocs build --strict -d build/site "$@"
