#!/usr/bin/env bash
# Set everything up and run the main job: the quickstart notebook, end to end, headless,
# on an embedded local Spark (local-cluster: real master, workers and executors).
#   bash quickstart.sh            # classic Spark session
#   bash quickstart.sh --connect  # the same notebook on a local Spark Connect server (as on Databricks serverless)
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-}" in
  "") ;;
  --connect) export TFOS_NB_SPARK_CONNECT=1 ;;
  *) echo "usage: bash quickstart.sh [--connect]" >&2; exit 2 ;;
esac
bash scripts/setup_env.sh
exec .venv/bin/python scripts/run_notebook.py notebooks/quickstart.ipynb
