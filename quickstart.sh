#!/usr/bin/env bash
# Set everything up and run the main job: the quickstart notebook, end to end, headless,
# on an embedded local Spark (local-cluster: real master, workers and executors).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup_env.sh
exec .venv/bin/python scripts/run_notebook.py notebooks/quickstart.ipynb
