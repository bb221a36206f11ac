#!/usr/bin/env bash
# Refresh the README's screenshots (docs/images/panel.png, docs/images/panel-tensorboard.png): runs the
# real-browser JupyterLab test (tests/test_browser.py: JupyterLab, headless Chromium, a 2-node cluster with
# TensorBoard), which copies the panel's screenshots into docs/images/ when TFOS_NB_DOCS_SCREENSHOTS=1.
# Needs the project's environment (bash scripts/setup_env.sh) and /usr/bin/chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
TFOS_NB_DOCS_SCREENSHOTS=1 PYTHONPATH="$PWD" "$PY" -m pytest -q tests/test_browser.py -k jupyterlab "$@"
ls -l docs/images/panel.png docs/images/panel-tensorboard.png
